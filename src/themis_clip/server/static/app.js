// The search page of themis-clip: plain JavaScript, no build step, no third-party code.
// Everything the server returns (file names, paths, metadata) is untrusted: it is only ever
// put into the page as text (textContent) or as attribute values, never as HTML.
'use strict';

const PAGE = 24;
const $ = (id) => document.getElementById(id);
const state = {
  query: null,        // {text} | {image} | {item} | {query: [...]} | {mode: 'browse'}: what
                      // /search receives besides k, filters and cursor
  label: '',          // how the query is described to the user
  hits: [],
  next: null,         // the cursor of the next page (null: no more)
  seq: 0,             // the latest search; answers to older ones are dropped
  filters: {},
  current: -1,        // index of the hit shown in the viewer
  imageUrl: null,     // object URL of the query image preview
  classify: false,    // whether the server offers zero-shot classification
  weaker: false,      // show the hits below where relevance ends (cut: none)
  hybrid: false,      // the shown results fuse two rankings (their scores are ranks' worth)
};

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

// --- API keys (serve --keys): asked for on a 401, kept for this tab only --------------------
// The key lives in sessionStorage (gone when the tab closes), is sent as a bearer header on
// every call, and never goes into a URL or a cookie; thumbnails and previews are fetched with
// it and shown from blob: URLs (an <img src> cannot carry a header).
const KEY_SLOT = 'themis-clip-key';
let keyPrompt = null;  // the pending prompt, shared by calls that got 401 at the same time

function storedKey() {
  try { return sessionStorage.getItem(KEY_SLOT) || ''; } catch (e) { return ''; }
}

function askForKey(refused) {
  if (keyPrompt) return keyPrompt;
  keyPrompt = new Promise((resolve) => {
    const dialog = document.createElement('dialog');
    dialog.id = 'key-dialog';
    dialog.setAttribute('aria-labelledby', 'key-title');
    const form = document.createElement('form');
    form.method = 'dialog';
    const title = document.createElement('h2');
    title.id = 'key-title';
    title.textContent = 'This server needs an API key';
    const note = document.createElement('p');
    note.id = 'key-note';
    note.textContent = refused ? 'That key was refused (unknown or revoked). Try another.' :
      'Ask whoever runs it for a key with the "search" scope (themis-clip keys create). ' +
      'It is kept for this tab only.';
    const label = document.createElement('label');
    label.htmlFor = 'key-input';
    label.textContent = 'API key';
    const input = document.createElement('input');
    input.type = 'password';
    input.id = 'key-input';
    input.autocomplete = 'off';
    input.required = true;
    const button = document.createElement('button');
    button.type = 'submit';
    button.id = 'key-submit';
    button.textContent = 'Use this key';
    form.append(title, note, label, input, button);
    dialog.append(form);
    document.body.append(dialog);
    dialog.addEventListener('close', () => {
      const key = input.value.trim();
      dialog.remove();
      keyPrompt = null;
      if (key) {
        try { sessionStorage.setItem(KEY_SLOT, key); } catch (e) { /* private mode: per call */ }
      }
      resolve(key);
    });
    dialog.showModal();
    input.focus();
  });
  return keyPrompt;
}

// fetch() with the tab's key; on 401 asks for one (again, if it was refused) and retries.
async function keyedFetch(path, options) {
  let key = storedKey();
  for (let attempt = 0; attempt < 4; attempt++) {
    const headers = new Headers((options && options.headers) || {});
    if (key) headers.set('Authorization', 'Bearer ' + key);
    const response = await fetch(path, Object.assign({}, options, {headers: headers}));
    if (response.status !== 401) return response;
    if (key) {
      try { sessionStorage.removeItem(KEY_SLOT); } catch (e) { /* nothing stored */ }
    }
    key = await askForKey(Boolean(key));
    if (!key) return response;
  }
  return fetch(path, options);
}

// Thumbnails and previews: straight from the server when no key is in use (the open demo),
// else fetched with the key, when the image comes into view, and shown from a blob: URL.
const lazyImages = typeof IntersectionObserver === 'function' ? new IntersectionObserver((entries) => {
  for (const entry of entries) {
    if (!entry.isIntersecting) continue;
    lazyImages.unobserve(entry.target);
    fillImage(entry.target, entry.target.dataset.src);
  }
}, {rootMargin: '200px'}) : null;

async function fillImage(img, url) {
  try {
    const response = await keyedFetch(url);
    if (!response.ok) throw new Error('HTTP ' + response.status);
    const blob = URL.createObjectURL(await response.blob());
    if (img.dataset.src === url && img.isConnected) img.src = blob;
    else URL.revokeObjectURL(blob);
  } catch (e) {
    img.alt = img.alt + ' (image unavailable)';
  }
}

function dropBlob(img) {
  if (img.src && img.src.startsWith('blob:')) URL.revokeObjectURL(img.src);
}

function setImage(img, url, lazy) {
  dropBlob(img);
  img.dataset.src = url;
  if (!storedKey()) { img.src = url; return; }
  img.removeAttribute('src');
  if (lazy && lazyImages) lazyImages.observe(img);
  else fillImage(img, url);
}

function forgetImages(list) {
  if (lazyImages) lazyImages.disconnect();
  for (const img of list.querySelectorAll('img')) dropBlob(img);
}
// --- end of API keys ------------------------------------------------------------------------

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify(body),
  };
  let response;
  try {
    response = await keyedFetch(path, options);
  } catch (e) {
    throw new ApiError(0, 'NetworkError', 'The server cannot be reached. Is themis-clip serve still running?');
  }
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const error = data && data.error ? data.error : {type: 'HTTPError', message: 'HTTP ' + response.status};
    throw new ApiError(response.status, error.type, error.message);
  }
  return data;
}

// What happened, and what to do about it.
function explain(error) {
  switch (error.status) {
    case 401:
    case 403:
      return error.message + '. Ask whoever runs the server for a key with the "search" scope.';
    case 409:  // the server's message names the fix (re-index, or serve the old model): once
      return error.message;
    case 404:
      if (error.type === 'NoIndex') {
        return 'This server has no index. Build one with "themis-clip index DIR --index PATH" ' +
          'and start the server with --index PATH.';
      }
      return error.message;
    case 413:
      return error.message + ' Try a smaller image.';
    case 415:
    case 422:
      return error.message;
    case 429:
    case 503:
      return 'The server is busy (' + error.message + '). Try again in a moment.';
    case 0:
      return error.message;
    default:
      return 'Something went wrong (' + error.message + ').';
  }
}

function setStatus(text, kind) {
  const status = $('status');
  status.textContent = text;
  status.className = 'status' + (kind ? ' ' + kind : '');
}

function nameOf(hit) {
  const name = String(hit.path || hit.id).split('/').pop();
  return name || String(hit.id);
}

let indexSize = null;  // items in the index, as loadInfo last read it (null: unknown)

async function loadInfo() {
  const parts = [];
  const [models, index] = await Promise.allSettled([api('/v1/models'), api('/index/info')]);
  if (models.status === 'fulfilled' && models.value.data.length) {
    const model = models.value.data[0];
    parts.push('model ' + model.id);
    state.classify = (model.modalities || []).includes('text');  // labels need the text tower
  }
  if (index.status === 'fulfilled') {
    const info = index.value;
    indexSize = info.items;
    parts.push(info.items + (info.items === 1 ? ' item' : ' items'));
    parts.push(info.mode === 'exact' ? 'exact search' : 'graph search (HNSW)');
    if (!info.comparable) {
      setStatus('This index was built with ' + info.model_id + ', but the server runs ' +
        info.server_model_id + ': their vectors are not comparable. Re-index with the ' +
        'current model (themis-clip index DIR --index NEW_PATH), or serve the old model.', 'error');
    } else if (info.items === 0) {
      setStatus('The index is empty. Add pictures with "themis-clip index DIR --index PATH" ' +
        'or POST /index/items, then search here.', 'empty');
    } else if (!state.query) {
      browse();  // no query yet: the library, newest first (as photo apps open on the timeline)
    }
  } else {
    parts.push('no index');
    setStatus(explain(index.reason), 'error');
  }
  $('info').textContent = parts.join(' · ');
}

// A migration of the index to another model (POST /admin/migrate) runs while the page serves:
// its progress from /stats, read often while it moves and now and then otherwise; when it ends
// the header's model and item count are read again.
const MOVING = ['running', 'pausing', 'paused', 'ready', 'cutting-over', 'blocked'];
let migrating = false;

function migrationText(m) {
  const to = 'Moving the index to ' + m.model_id + ': ';
  const count = (m.done || 0).toLocaleString() + ' of ' + (m.total || 0).toLocaleString();
  switch (m.state) {
    case 'running': {
      const pct = m.total ? ' (' + Math.floor(100 * m.done / m.total) + '%)' : '';
      const eta = m.eta_s != null ? ', about ' + Math.ceil(m.eta_s) + ' s left' : '';
      return to + count + pct + eta + '. Searches use the current model meanwhile.';
    }
    case 'pausing': case 'paused': return to + 'paused at ' + count + '.';
    case 'ready': return to + 'ready; it switches when an admin cuts over.';
    case 'cutting-over': return to + 'switching now.';
    case 'blocked': return to + m.missing + ' item(s) cannot be re-embedded; waiting for an admin.';
    default: return '';
  }
}

async function watchMigration() {
  let moving = false;
  try {
    const m = (await api('/stats')).migration || {state: 'idle'};
    moving = MOVING.includes(m.state);
    $('migration').textContent = moving ? migrationText(m) : '';
    $('migration').hidden = !moving;
    if (migrating && !moving) loadInfo();  // it ended: a new model and index, or the old ones
  } catch (error) {
    moving = migrating;  // a failed read changes nothing shown
  }
  migrating = moving;
  setTimeout(watchMigration, moving ? 2000 : 15000);
}

// Keys no one picks from a list: facts of one file (its name, size, times, pixel size, its
// RAW), and the date and camera, which have pickers of their own.
const FILE_FACTS = new Set(['name', 'size', 'mtime', 'width', 'height', 'taken', 'camera', 'gps',
  'raw', 'raws', 'live_video']);
const FACET_LABELS = {folder: 'Folder'};

// The metadata pickers: the folder, and keys of an index's own whose values repeat (an album,
// a source); a key with a value per item would be a list of file names.
async function loadFilters() {
  let data;
  try { data = await api('/index/filters'); } catch (e) { return; }
  const box = $('filters');
  box.replaceChildren();
  for (const facet of data.keys) {
    const folder = facet.key === 'folder';
    const values = facet.values.filter((v) => typeof v.value !== 'object');
    if (FILE_FACTS.has(facet.key) || values.length < (folder ? 1 : 2)) continue;
    if (!folder && (facet.more_values || values.every((v) => v.count === 1))) continue;
    const label = document.createElement('label');
    const caption = document.createElement('span');
    caption.textContent = FACET_LABELS[facet.key] || facet.key;
    const select = document.createElement('select');
    const any = document.createElement('option');
    any.value = '';
    any.textContent = folder ? 'all folders' : 'any';
    select.append(any);
    for (const v of values) {
      const option = document.createElement('option');
      option.value = JSON.stringify(v.value);
      const shown = folder && (v.value === '' || v.value === '.') ? '(the top folder)' : String(v.value);
      option.textContent = shown + ' (' + v.count + ')';
      select.append(option);
    }
    select.addEventListener('change', () => {
      if (select.value === '') delete state.filters[facet.key];
      else state.filters[facet.key] = JSON.parse(select.value);
      photoFilterChanged();
    });
    label.append(caption, select);
    box.append(label);
    if (box.children.length === 6) break;
  }
  $('filters-box').hidden = box.children.length === 0 && $('photo-filters').hidden;
}

// Browse: no query, the library newest first (by when taken, else file time, else added).
function browse() {
  state.query = {mode: 'browse'};
  state.label = 'the library';
  run(true);
}

// One page of the current query: reset starts over, else the cursor continues it ("Load more").
async function run(reset) {
  if (!state.query) return;
  const seq = ++state.seq;
  const body = Object.assign({k: PAGE}, state.query);
  if (!reset && state.next) body.cursor = state.next;
  if ($('hybrid').checked && state.query.text !== undefined) body.mode = 'hybrid';
  state.hybrid = body.mode === 'hybrid';
  if (state.weaker) body.cut = 'none';
  if ($('sort').value !== 'score' && state.query.mode !== 'browse') body.sort = $('sort').value;
  if (Object.keys(state.filters).length) body.filters = state.filters;
  const where = photoWhere();
  if (where) body.where = where;
  setStatus((state.query.mode === 'browse' ? 'Opening ' : 'Searching ') + state.label + '…', 'busy');
  $('results').setAttribute('aria-busy', 'true');
  try {
    const data = await api('/search', body);
    if (seq !== state.seq) return;  // a newer search has started since
    const from = reset ? 0 : state.hits.length;
    state.hits = reset ? data.results : state.hits.concat(data.results);
    state.next = data.next;
    render(data, from);
  } catch (error) {
    if (seq !== state.seq) return;
    state.hits = [];
    state.next = null;
    $('results').replaceChildren();
    $('more').hidden = true;
    $('weaker').hidden = true;
    setStatus(explain(error), 'error');
  } finally {
    if (seq === state.seq) $('results').removeAttribute('aria-busy');
  }
}

// A divider above the first hit that scores below what random text reaches on this index
// (the server measures the line per model: weak_below, weak_basis).
function weakDivider(data) {
  const divider = document.createElement('li');
  divider.className = 'weak-divider';
  divider.textContent = 'Weak matches below: scores under ' + data.weak_below.toFixed(3) +
    ' are what random text reaches on this index (' + data.weak_basis + ').';
  return divider;
}

function render(data, from) {
  const list = $('results');
  const browsing = state.query.mode === 'browse';
  if (from === 0) {
    forgetImages(list);
    list.replaceChildren();
  }
  // Over every page shown so far, so that "Load more" keeps the divider where it belongs.
  const weakAt = typeof data.weak_below === 'number' ?
    state.hits.findIndex((hit) => hit.score < data.weak_below) : -1;
  state.hits.slice(from).forEach((hit, j) => {
    const i = from + j;
    const item = document.createElement('li');
    const figure = document.createElement('figure');
    const card = document.createElement('button');
    card.type = 'button';
    card.className = 'card';
    const img = document.createElement('img');
    img.className = 'thumb';
    setImage(img, hit.thumbnail, true);
    img.alt = nameOf(hit);
    img.loading = 'lazy';
    img.decoding = 'async';
    img.width = 192;
    img.height = 192;
    card.append(img);
    card.addEventListener('click', () => openViewer(i));
    const caption = document.createElement('figcaption');
    const score = document.createElement('span');
    score.className = 'score';
    // a hybrid score is a fusion of two rankings (about 0.016 for a first place): its rank
    // says what it means, its number does not
    score.textContent = browsing ? '' : state.hybrid ? '#' + (i + 1) : hit.score.toFixed(3);
    const name = document.createElement('span');
    name.className = 'name';
    name.textContent = nameOf(hit);
    name.title = nameOf(hit);  // cut with an ellipsis in the card; the whole name on hover
    caption.append(score, ' ', name);
    figure.append(card, caption);
    item.append(figure);
    if (weakAt === i) list.append(weakDivider(data));
    list.append(item);
  });
  const n = state.hits.length;
  const weak = weakAt < 0 ? 0 : n - weakAt;
  const left = data.cut && data.cut.weaker > 0 && !state.weaker ? data.cut.weaker : 0;
  $('weaker').hidden = !left;
  $('weaker').textContent = 'Show weaker matches';
  if (n === 0 && indexSize === 0) {
    setStatus('The index is empty: there is nothing to search yet. Add pictures with ' +
      '"themis-clip index DIR --index PATH" or POST /index/items.', 'empty');
  } else if (browsing) {
    setStatus(n ? 'The library, newest first (' + n + (data.next ? ' shown' : ' pictures') + '). ' +
      'Type what you are looking for, or search with a picture.' :
      'Type what you are looking for, or search with a picture.', '');
  } else if (n === 0 && left) {
    setStatus('No photo matches ' + state.label + ': nothing scores above where unrelated ' +
      'words do on this index. "Show weaker matches" lists the closest anyway.', 'empty');
  } else if (n === 0) {
    setStatus('No results for ' + state.label + '. ' + (Object.keys(state.filters).length ?
      'Try removing a filter.' : 'Try other words or another picture.'), 'empty');
  } else if (left) {
    setStatus(n + (n === 1 ? ' match' : ' matches') + ' for ' + state.label +
      ' · the rest scored like unrelated words (' + data.cut.reason + ')', '');
  } else if (state.hybrid) {
    setStatus(n + (n === 1 ? ' result' : ' results') + ' for ' + state.label + ', best first · ' +
      'ranked by what the pictures show and by the words in file names, captions and the ' +
      'text in the photos together ' +
      '(the numbers are ranks: #1 matched best, whatever its score)', '');
  } else {
    setStatus(n + (n === 1 ? ' result' : ' results') + ' for ' + state.label + ' · ' +
      (data.mode === 'exact' ? 'exact' : 'graph') + ' search · ' + data.model_id +
      (weak === n ? ' · no good match: every result is weak' : weak ? ' · ' + weak + ' weak' : ''),
      '');
  }
  $('more').hidden = !data.next;
}

function searchText(text, weaker) {
  clearImage();
  state.weaker = Boolean(weaker);
  state.query = {text: text};
  state.label = '“' + text + '”';
  history.replaceState(null, '', '?q=' + encodeURIComponent(text) + (state.weaker ? '&cut=none' : ''));
  run(true);
}

function searchFile(file) {
  if (!file) return;
  if (!file.type.startsWith('image/')) {
    setStatus('“' + file.name + '” is not an image (' + (file.type || 'unknown type') + ').', 'error');
    return;
  }
  const reader = new FileReader();
  reader.onerror = () => setStatus('Cannot read “' + file.name + '”.', 'error');
  reader.onload = () => {
    showQueryImage(URL.createObjectURL(file), file.name || 'pasted image');
    $('q').value = '';  // the box shows the query: now a picture, not the old text
    state.query = {image: reader.result};
    state.weaker = false;
    state.label = 'the picture ' + (file.name ? '“' + file.name + '”' : '');
    run(true);
  };
  reader.readAsDataURL(file);
}

function showQueryImage(url, label) {
  if (state.imageUrl && state.imageUrl.startsWith('blob:')) URL.revokeObjectURL(state.imageUrl);
  state.imageUrl = url;
  if (url.startsWith('blob:') || url.startsWith('data:')) $('query-img').src = url;
  else setImage($('query-img'), url, false);
  $('query-label').textContent = 'Searching with ' + label;
  $('query-preview').hidden = false;
}

function clearImage() {
  if (state.imageUrl && state.imageUrl.startsWith('blob:')) URL.revokeObjectURL(state.imageUrl);
  state.imageUrl = null;
  $('query-preview').hidden = true;
  $('query-img').removeAttribute('src');
}

function moreLikeThis(hit, but) {
  $('viewer').close();
  const twist = but ? ', but “' + but + '”' : '';
  showQueryImage(hit.thumbnail, '“' + nameOf(hit) + '” (more like this' + twist + ')');
  $('q').value = '';  // the box shows the query: now a picture, not the old text
  // "More like this, but...": the item's stored vector plus the text (query arithmetic).
  state.query = but ? {query: [{item: hit.id}, {text: but}]} : {item: hit.id};
  state.label = 'pictures like “' + nameOf(hit) + '”' + twist;
  run(true);
}

function metadataRows(metadata) {
  const body = $('v-meta').tBodies[0];
  body.replaceChildren();
  const entries = metadata ? Object.entries(metadata) : [];
  if (!entries.length) {
    const row = body.insertRow();
    const cell = row.insertCell();
    cell.colSpan = 2;
    cell.textContent = 'no metadata';
    return;
  }
  for (const [key, value] of entries) {
    const row = body.insertRow();
    const th = document.createElement('th');
    th.scope = 'row';
    th.textContent = key;
    const td = row.insertCell();
    td.textContent = typeof value === 'string' ? value : JSON.stringify(value);
    row.prepend(th);
  }
}

// The lines of text the query matched (OCR), outlined on the picture: their boxes are in the
// picture's own pixels (frame), so the overlay's viewBox is that frame, stretched over the image.
function drawMarks(hit) {
  const marks = $('v-marks');
  marks.replaceChildren();
  const matches = (hit.text_matches || []).filter((m) => m.frame && m.frame[0] > 0 && m.frame[1] > 0);
  marks.hidden = !matches.length;
  if (!matches.length) return;
  const svg = 'http://www.w3.org/2000/svg';
  marks.setAttribute('viewBox', '0 0 ' + matches[0].frame[0] + ' ' + matches[0].frame[1]);
  marks.setAttribute('preserveAspectRatio', 'none');
  for (const m of matches) {
    const shape = document.createElementNS(svg, 'polygon');
    shape.setAttribute('points', m.box.map((p) => p[0] + ',' + p[1]).join(' '));
    shape.setAttribute('vector-effect', 'non-scaling-stroke');
    const title = document.createElementNS(svg, 'title');
    title.textContent = m.text;
    shape.append(title);
    marks.append(shape);
  }
}

function openViewer(i) {
  if (i < 0 || i >= state.hits.length) return;
  state.current = i;
  const hit = state.hits[i];
  const img = $('v-img');
  setImage(img, hit.preview, false);
  img.alt = nameOf(hit);
  $('v-title').textContent = nameOf(hit);
  $('v-score').textContent = (state.hybrid ?
    'rank ' + (i + 1) + ' by pictures and words together (fused score ' + hit.score.toFixed(4) + ')' :
    'score ' + hit.score.toFixed(4)) + ' · ' + (i + 1) + ' of ' + state.hits.length;
  $('v-path').textContent = String(hit.path || hit.id);
  drawMarks(hit);
  metadataRows(hit.metadata);
  $('v-probs').replaceChildren();
  $('v-probs-note').hidden = true;
  $('v-prev').disabled = i === 0;
  $('v-next').disabled = i === state.hits.length - 1;
  $('v-labels-form').hidden = !state.classify;
  const viewer = $('viewer');
  if (!viewer.open) viewer.showModal();
}

async function classify(event) {
  event.preventDefault();
  const hit = state.hits[state.current];
  const labels = $('v-labels').value.split(',').map((s) => s.trim()).filter(Boolean);
  const list = $('v-probs');
  list.replaceChildren();
  $('v-probs-note').hidden = true;
  if (!hit || !labels.length) return;
  try {
    const data = await api('/v1/classify', {item: hit.id, labels: labels});
    for (const row of data.labels) {
      const item = document.createElement('li');
      const text = document.createElement('span');
      // The probability is relative to these labels only (it always sums to 100 %); the
      // cosine is the raw match, low for every label when none fits.
      text.textContent = row.label + ': ' + (100 * row.probability).toFixed(1) + '%';
      const cosine = document.createElement('small');
      cosine.className = 'cosine';
      cosine.textContent = 'cosine ' + row.cosine.toFixed(3);
      const bar = document.createElement('progress');
      bar.max = 1;
      bar.value = row.probability;
      bar.setAttribute('aria-label', row.label);
      item.append(text, bar, cosine);
      list.append(item);
    }
    const note = $('v-probs-note');
    note.hidden = false;
    note.textContent = (data.scoring === 'softmax' ? 'Probabilities are shared out among ' +
      'these labels only, so one always looks likely;' : 'Each label is scored on its own;') +
      ' a low cosine for every label means none fits.';
  } catch (error) {
    const item = document.createElement('li');
    item.textContent = explain(error);
    list.append(item);
  }
}

function setUp() {
  $('form').addEventListener('submit', (event) => {
    event.preventDefault();
    const text = $('q').value.trim();
    if (text) searchText(text);
  });
  $('pick').addEventListener('click', () => $('file').click());
  $('file').addEventListener('change', () => {
    searchFile($('file').files[0]);
    $('file').value = '';
  });
  $('clear-image').addEventListener('click', () => {
    clearImage();
    browse();
  });
  const drop = $('drop');
  drop.addEventListener('dragover', (event) => { event.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (event) => {
    event.preventDefault();
    drop.classList.remove('over');
    searchFile(event.dataTransfer.files[0]);
  });
  document.addEventListener('paste', (event) => {
    const files = event.clipboardData ? [...event.clipboardData.files] : [];
    const image = files.find((f) => f.type.startsWith('image/'));
    if (image) {
      event.preventDefault();
      searchFile(image);
    }
  });
  $('more').addEventListener('click', () => run(false));
  $('weaker').addEventListener('click', () => {
    state.weaker = true;
    if (state.query && state.query.text !== undefined) {
      history.replaceState(null, '', '?q=' + encodeURIComponent(state.query.text) + '&cut=none');
    }
    run(true);
  });
  $('sort').addEventListener('change', () => run(true));
  $('hybrid').addEventListener('change', () => { if (state.query && state.query.text !== undefined) run(true); });
  $('v-close').addEventListener('click', () => $('viewer').close());
  $('v-prev').addEventListener('click', () => openViewer(state.current - 1));
  $('v-next').addEventListener('click', () => openViewer(state.current + 1));
  $('v-like').addEventListener('click', () => moreLikeThis(state.hits[state.current]));
  $('v-but-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const but = $('v-but').value.trim();
    if (but) moreLikeThis(state.hits[state.current], but);
  });
  $('v-labels-form').addEventListener('submit', classify);
  $('viewer').addEventListener('keydown', (event) => {
    if (event.target instanceof HTMLInputElement) return;
    if (event.key === 'ArrowLeft') { event.preventDefault(); openViewer(state.current - 1); }
    if (event.key === 'ArrowRight') { event.preventDefault(); openViewer(state.current + 1); }
  });
  document.addEventListener('keydown', (event) => {
    const typing = event.target instanceof HTMLInputElement || event.target instanceof HTMLSelectElement;
    if (event.key === '/' && !typing && !$('viewer').open) {
      event.preventDefault();
      $('q').focus();
    }
  });
  loadInfo();
  loadFilters();
  setUpPhotos();
  watchMigration();
  const params = new URLSearchParams(location.search);
  const initial = params.get('q');
  if (initial) {
    $('q').value = initial;
    searchText(initial, params.get('cut') === 'none');  // a link to the whole ranking
  }
}

// -- photos: date-range and camera filters (the where language), the duplicates view -------

// The where filter the date and camera pickers make (null: none chosen).
function photoWhere() {
  const terms = [];
  const from = $('taken-from').value;
  const to = $('taken-to').value;
  if (from) terms.push({taken: {$gte: from}});
  if (to) {  // the whole last day: before the next day's start
    const next = new Date(to + 'T00:00:00Z');
    next.setUTCDate(next.getUTCDate() + 1);
    terms.push({taken: {$lt: next.toISOString().slice(0, 10)}});
  }
  const camera = $('camera').value;
  if (camera) terms.push({'camera.make': camera});
  if (!terms.length) return null;
  return terms.length === 1 ? terms[0] : {$and: terms};
}

async function loadPhotoFacets() {
  let data;
  try { data = await api('/index/photo-facets'); } catch (e) { return; }
  if (data.taken) {
    for (const id of ['taken-from', 'taken-to']) {
      $(id).min = String(data.taken.first).slice(0, 10);
      $(id).max = String(data.taken.last).slice(0, 10);
    }
  }
  const select = $('camera');
  for (const m of data.makes) {
    const option = document.createElement('option');
    option.value = m.make;
    option.textContent = m.make + ' (' + m.count + ')';
    select.append(option);
  }
  const any = Boolean(data.taken) || data.makes.length > 0;
  $('photo-filters').hidden = !any;
  if (any) $('filters-box').hidden = false;
}

function photoFilterChanged() {
  const n = Object.keys(state.filters).length + (photoWhere() ? 1 : 0);
  $('filter-count').textContent = n ? '(' + n + ' active)' : '';
  if (state.query) run(true);
}

const TIERS = {
  'identical': 'Identical files',
  'same-pixels': 'Same pixels',
  'resized': 'Resized or re-encoded',
  'similar': 'Similar shots (a burst)',
};

async function showDuplicates() {
  const section = $('dups');
  section.hidden = false;
  section.scrollIntoView({block: 'start'});  // below the results: bring it into view
  $('dups-groups').replaceChildren();
  $('dups-status').textContent = 'Looking for near-duplicates…';
  let data;
  try {
    data = await api('/duplicates');
  } catch (error) {
    $('dups-status').textContent = explain(error);
    return;
  }
  const list = $('dups-groups');
  for (const group of data.groups) {
    const item = document.createElement('li');
    item.className = 'dup-group';
    const score = document.createElement('span');
    score.className = 'dup-score';
    score.textContent = (TIERS[group.tier] || group.tier) + ' · ' + group.items.length +
      ' copies · similarity ≥ ' + group.score.toFixed(4) +
      (group.keeper ? ' · keep the marked one: ' + group.keeper.reason : '');
    item.append(score);
    for (const member of group.items) {
      const figure = document.createElement('figure');
      if (group.keeper && group.keeper.key === member.key) figure.className = 'keeper';
      const img = document.createElement('img');
      img.src = member.thumbnail;
      img.alt = nameOf({path: member.path, id: member.key});
      img.loading = 'lazy';
      const caption = document.createElement('figcaption');
      caption.textContent = String(member.path || member.key);
      figure.append(img, caption);
      item.append(figure);
    }
    list.append(item);
  }
  const n = data.groups.length;
  $('dups-status').textContent = n ? n + (n === 1 ? ' group' : ' groups') + ' of near-duplicates' :
    'No near-duplicates in this index.';
  section.scrollIntoView({block: 'start'});  // again: results may have grown above meanwhile
}

function setUpPhotos() {
  for (const id of ['taken-from', 'taken-to', 'camera']) {
    $(id).addEventListener('change', photoFilterChanged);
  }
  $('dups-open').addEventListener('click', showDuplicates);
  $('dups-close').addEventListener('click', () => { $('dups').hidden = true; });
  loadPhotoFacets();
}

document.addEventListener('DOMContentLoaded', setUp);
