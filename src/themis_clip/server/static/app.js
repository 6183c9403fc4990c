// The search page of themis-clip: plain JavaScript, no build step, no third-party code.
// Everything the server returns (file names, paths, metadata) is untrusted: it is only ever
// put into the page as text (textContent) or as attribute values, never as HTML.
'use strict';

const PAGE = 24;
const MAX_K = 1000;
const $ = (id) => document.getElementById(id);
const state = {
  query: null,        // {text} | {image} | {item}: what /search receives besides k and filters
  label: '',          // how the query is described to the user
  k: PAGE,
  hits: [],
  filters: {},
  current: -1,        // index of the hit shown in the viewer
  imageUrl: null,     // object URL of the query image preview
  classify: false,    // whether the server offers zero-shot classification
};

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify(body),
  };
  let response;
  try {
    response = await fetch(path, options);
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
    case 409:
      return error.message + ' The index was built with another model: re-index with the ' +
        'model this server runs (themis-clip index DIR --index NEW_PATH), or serve the old model.';
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
      setStatus('Type what you are looking for, or search with a picture.', '');
    }
  } else {
    parts.push('no index');
    setStatus(explain(index.reason), 'error');
  }
  $('info').textContent = parts.join(' · ');
}

async function loadFilters() {
  let data;
  try { data = await api('/index/filters'); } catch (e) { return; }
  const box = $('filters');
  box.replaceChildren();
  for (const facet of data.keys.slice(0, 12)) {
    if (!facet.values.length) continue;
    const label = document.createElement('label');
    const caption = document.createElement('span');
    caption.textContent = facet.key + ' (' + facet.count + ')';
    const select = document.createElement('select');
    const any = document.createElement('option');
    any.value = '';
    any.textContent = 'any';
    select.append(any);
    for (const v of facet.values) {
      const option = document.createElement('option');
      option.value = JSON.stringify(v.value);
      option.textContent = String(v.value) + ' (' + v.count + ')';
      select.append(option);
    }
    select.addEventListener('change', () => {
      if (select.value === '') delete state.filters[facet.key];
      else state.filters[facet.key] = JSON.parse(select.value);
      const n = Object.keys(state.filters).length;
      $('filter-count').textContent = n ? '(' + n + ' active)' : '';
      if (state.query) run(true);
    });
    label.append(caption, select);
    box.append(label);
  }
  $('filters-box').hidden = box.children.length === 0 && $('photo-filters').hidden;
}

async function run(reset) {
  if (!state.query) return;
  if (reset) state.k = PAGE;
  const body = Object.assign({k: state.k}, state.query);
  if (Object.keys(state.filters).length) body.filters = state.filters;
  const where = photoWhere();
  if (where) body.where = where;
  setStatus('Searching ' + state.label + '…', 'busy');
  $('results').setAttribute('aria-busy', 'true');
  try {
    const data = await api('/search', body);
    state.hits = data.results;
    render(data);
  } catch (error) {
    state.hits = [];
    $('results').replaceChildren();
    $('more').hidden = true;
    setStatus(explain(error), 'error');
  } finally {
    $('results').removeAttribute('aria-busy');
  }
}

function render(data) {
  const list = $('results');
  list.replaceChildren();
  data.results.forEach((hit, i) => {
    const item = document.createElement('li');
    const figure = document.createElement('figure');
    const card = document.createElement('button');
    card.type = 'button';
    card.className = 'card';
    const img = document.createElement('img');
    img.className = 'thumb';
    img.src = hit.thumbnail;
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
    score.textContent = hit.score.toFixed(3);
    const name = document.createElement('span');
    name.className = 'name';
    name.textContent = nameOf(hit);
    caption.append(score, ' ', name);
    figure.append(card, caption);
    item.append(figure);
    list.append(item);
  });
  const n = data.results.length;
  if (n === 0) {
    setStatus('No results for ' + state.label + '. ' + (Object.keys(state.filters).length ?
      'Try removing a filter.' : 'Try other words or another picture.'), 'empty');
  } else {
    setStatus(n + (n === 1 ? ' result' : ' results') + ' for ' + state.label + ' · ' +
      (data.mode === 'exact' ? 'exact' : 'graph') + ' search · ' + data.model_id, '');
  }
  $('more').hidden = !(n >= state.k && state.k < MAX_K);
}

function searchText(text) {
  clearImage();
  state.query = {text: text};
  state.label = '“' + text + '”';
  history.replaceState(null, '', '?q=' + encodeURIComponent(text));
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
    state.query = {image: reader.result};
    state.label = 'the picture ' + (file.name ? '“' + file.name + '”' : '');
    run(true);
  };
  reader.readAsDataURL(file);
}

function showQueryImage(url, label) {
  if (state.imageUrl && state.imageUrl.startsWith('blob:')) URL.revokeObjectURL(state.imageUrl);
  state.imageUrl = url;
  $('query-img').src = url;
  $('query-label').textContent = 'Searching with ' + label;
  $('query-preview').hidden = false;
}

function clearImage() {
  if (state.imageUrl && state.imageUrl.startsWith('blob:')) URL.revokeObjectURL(state.imageUrl);
  state.imageUrl = null;
  $('query-preview').hidden = true;
  $('query-img').removeAttribute('src');
}

function moreLikeThis(hit) {
  $('viewer').close();
  showQueryImage(hit.thumbnail, '“' + nameOf(hit) + '” (more like this)');
  state.query = {item: hit.id};
  state.label = 'pictures like “' + nameOf(hit) + '”';
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

function openViewer(i) {
  if (i < 0 || i >= state.hits.length) return;
  state.current = i;
  const hit = state.hits[i];
  const img = $('v-img');
  img.src = hit.preview;
  img.alt = nameOf(hit);
  $('v-title').textContent = nameOf(hit);
  $('v-score').textContent = 'score ' + hit.score.toFixed(4) + ' · ' + (i + 1) + ' of ' + state.hits.length;
  $('v-path').textContent = String(hit.path || hit.id);
  metadataRows(hit.metadata);
  $('v-probs').replaceChildren();
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
  if (!hit || !labels.length) return;
  try {
    const data = await api('/v1/classify', {item: hit.id, labels: labels});
    for (const row of data.labels) {
      const item = document.createElement('li');
      const text = document.createElement('span');
      text.textContent = row.label + ': ' + (100 * row.probability).toFixed(1) + '%';
      const bar = document.createElement('progress');
      bar.max = 1;
      bar.value = row.probability;
      bar.setAttribute('aria-label', row.label);
      item.append(text, bar);
      list.append(item);
    }
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
    state.query = null;
    $('results').replaceChildren();
    $('more').hidden = true;
    setStatus('', '');
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
  $('more').addEventListener('click', () => {
    state.k = Math.min(MAX_K, state.k + PAGE);
    run(false);
  });
  $('v-close').addEventListener('click', () => $('viewer').close());
  $('v-prev').addEventListener('click', () => openViewer(state.current - 1));
  $('v-next').addEventListener('click', () => openViewer(state.current + 1));
  $('v-like').addEventListener('click', () => moreLikeThis(state.hits[state.current]));
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
  const initial = new URLSearchParams(location.search).get('q');
  if (initial) {
    $('q').value = initial;
    searchText(initial);
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

async function showDuplicates() {
  const section = $('dups');
  section.hidden = false;
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
    score.textContent = group.items.length + ' copies · similarity ≥ ' + group.score.toFixed(4);
    item.append(score);
    for (const member of group.items) {
      const figure = document.createElement('figure');
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
