// Starts the Swagger UI of /docs on this server's schema (no inline script: the page's CSP).
'use strict';

window.addEventListener('DOMContentLoaded', () => {
  window.ui = SwaggerUIBundle({
    url: '/openapi.json',
    dom_id: '#swagger-ui',
    deepLinking: true,
    validatorUrl: null,  // never send the schema anywhere
  });
});
