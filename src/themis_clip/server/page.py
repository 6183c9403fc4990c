"""The search page served at ``GET /``: type a query or drop an image, see thumbnails."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>themis-clip search</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem}
 form{display:flex;gap:.5rem} input[type=text]{flex:1;padding:.5rem;font-size:1rem}
 #drop{border:2px dashed #999;padding:1rem;margin:1rem 0;text-align:center;color:#666}
 #drop.over{background:#eef}
 #results{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:1rem}
 figure{margin:0} figure img{width:150px;height:150px;object-fit:cover;border-radius:4px}
 figcaption{font-size:.8rem;word-break:break-all} #status{color:#666;margin:.5rem 0}
</style></head>
<body>
<h1>themis-clip</h1>
<form id="form"><input type="text" id="q" name="q" placeholder="a red circle" autofocus>
<button type="submit">Search</button></form>
<div id="drop">or drop an image here</div>
<div id="status"></div>
<div id="results"></div>
<script>
const results = document.getElementById('results'), status = document.getElementById('status');
async function search(body) {
  status.textContent = 'searching...';
  results.innerHTML = '';
  const r = await fetch('/search', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                    body: JSON.stringify(Object.assign({k: 12}, body))});
  const data = await r.json();
  if (!r.ok) {
    status.textContent = 'error: ' + (data.error ? data.error.message : r.status);
    return;
  }
  status.textContent = data.results.length + ' results (' + data.model_id + ')';
  for (const hit of data.results) {
    const fig = document.createElement('figure');
    const img = document.createElement('img');
    img.src = hit.thumbnail; img.alt = hit.id; img.className = 'thumb';
    const cap = document.createElement('figcaption');
    cap.textContent = hit.score.toFixed(3) + ' ' + (hit.path || hit.id).split('/').pop();
    fig.append(img, cap); results.append(fig);
  }
}
document.getElementById('form').addEventListener('submit', e => {
  e.preventDefault();
  const q = document.getElementById('q').value.trim();
  if (q) { history.replaceState(null, '', '?q=' + encodeURIComponent(q)); search({text: q}); }
});
const drop = document.getElementById('drop');
drop.addEventListener('dragover', e => { e.preventDefault(); drop.classList.add('over'); });
drop.addEventListener('dragleave', () => drop.classList.remove('over'));
drop.addEventListener('drop', e => {
  e.preventDefault(); drop.classList.remove('over');
  const file = e.dataTransfer.files[0]; if (!file) return;
  const reader = new FileReader();
  reader.onload = () => search({image: reader.result});
  reader.readAsDataURL(file);
});
const initial = new URLSearchParams(location.search).get('q');
if (initial) { document.getElementById('q').value = initial; search({text: initial}); }
</script>
</body></html>
"""
