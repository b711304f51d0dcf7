// Shared by the dashboard's pages: the API client (token from sessionStorage), a DOM
// builder that only ever writes text (API data never becomes markup), formatting, the
// notice line, a small SVG chart and a reader of the Prometheus text format.

// The API's base: the page is served at {base}/ui/, the API at {base}/.
export const BASE = location.pathname.replace(/\/ui(\/.*)?$/, '');

const TOKEN_KEY = 'kairos.token';
export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || '',
  set: (t) => sessionStorage.setItem(TOKEN_KEY, t),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

/// A refusal or failure of an API call: the spec's error body, or what went wrong.
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  toString() {
    return `${this.code}: ${this.message}`;
  }
}

let unauthorized = () => {};
/// What to do when the API answers 401 (the app asks for a token).
export function onUnauthorized(f) {
  unauthorized = f;
}

/// One API call. `body`: JSON; `bytes`: a raw body (plugin uploads); `query`: an object,
/// empty values left out. Answers the parsed JSON (or text); throws an ApiError.
export async function api(method, path, { body, bytes, query } = {}) {
  const headers = {};
  const t = token.get();
  if (t) headers.Authorization = `Bearer ${t}`;
  let payload;
  if (bytes !== undefined) {
    payload = bytes;
    headers['Content-Type'] = 'application/wasm';
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers['Content-Type'] = 'application/json';
  }
  let url = BASE + path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
    }
    const s = q.toString();
    if (s) url += (url.includes('?') ? '&' : '?') + s;
  }
  const abort = new AbortController();
  const timeout = setTimeout(() => abort.abort(), 30000);
  let res;
  try {
    res = await fetch(url, { method, headers, body: payload, signal: abort.signal, cache: 'no-store' });
  } catch (e) {
    throw new ApiError(0, 'no_answer', `${method} ${path}: ${e.name === 'AbortError' ? 'no answer within 30 s' : e.message}`);
  } finally {
    clearTimeout(timeout);
  }
  const scope = res.headers.get('x-kairos-scope');
  if (scope) granted = scope;
  const json = (res.headers.get('content-type') || '').startsWith('application/json');
  if (!res.ok) {
    let code = `http_${res.status}`;
    let message = `${method} ${path} answered ${res.status} ${res.statusText}`;
    if (json) {
      try {
        const e = (await res.json()).error || {};
        code = e.code || code;
        message = e.message || message;
      } catch (_) { /* not the error body after all */ }
    }
    const err = new ApiError(res.status, code, message);
    if (res.status === 401) unauthorized(err);
    throw err;
  }
  return json ? res.json() : res.text();
}

/// An element. attrs: `class`, `on<event>` (a listener), `value`, `checked`, `dataset`,
/// others as attributes. Children: nodes, or anything else as text.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value') el.value = v;
    else if (k === 'checked') el.checked = !!v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  add(el, ...children);
  return el;
}

/// Appends children as `h` does.
export function add(el, ...children) {
  for (const c of [children].flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/// Replaces an element's children.
export function fill(el, ...children) {
  el.replaceChildren();
  add(el, ...children);
  applyScope(el);
  return el;
}

// ---- what the token may do ----

/// The scope the server granted the token on its last answer (`X-Kairos-Scope`); null
/// until the first answer.
let granted = null;
const RANK = { read: 0, book: 1, admin: 2 };

/// Disables every control under `root` that needs more than the token's scope
/// (`data-needs="book"|"admin"`), saying why, so that a read token sees what it may not do
/// instead of a 403 after the click.
export function applyScope(root) {
  if (!granted || !(granted in RANK)) return;
  for (const el of root.querySelectorAll('[data-needs]')) {
    const needs = el.dataset.needs;
    if (RANK[granted] >= (RANK[needs] ?? 0)) continue;
    el.disabled = true;
    el.classList.add('no-scope');
    el.title = `This token has the ${granted} scope; this needs ${needs}.`;
  }
}

/// A page's title with its tools (buttons, the refresh toggle) on the right.
export function heading(text, ...extra) {
  return h('div', { class: 'heading' }, h('h1', {}, text), h('div', { class: 'tools' }, extra));
}

/// A page's Refresh button, and a toggle that refreshes it every 5 s while checked (the
/// choice is kept for the tab, across pages; the timer stops with the page).
export function refreshTools(ctx) {
  const auto = h('input', { type: 'checkbox', id: 'auto-refresh' });
  auto.checked = sessionStorage.getItem('kairos.autoRefresh') === '1';
  let timer = null;
  const arm = () => {
    clearInterval(timer);
    timer = auto.checked ? setInterval(() => ctx.rerender(), 5000) : null;
  };
  auto.addEventListener('change', () => {
    sessionStorage.setItem('kairos.autoRefresh', auto.checked ? '1' : '0');
    arm();
  });
  arm();
  ctx.onStop(() => clearInterval(timer));
  return [
    h('button', { type: 'button', class: 'secondary', onclick: () => ctx.rerender() }, 'Refresh'),
    h('label', { class: 'auto-refresh', title: 'Refresh this page every 5 s' }, auto, ' auto-refresh'),
  ];
}

/// A link inside the dashboard: `#/` followed by path segments, each encoded.
export function link(text, ...segments) {
  return h('a', { href: route(...segments) }, text);
}
export function route(...segments) {
  return '#/' + segments.map(encodeURIComponent).join('/');
}

/// The notice line under the header: `error` for refusals (code and message as the API
/// gave them), `ok` for what was done.
let noticeTimer;
let noticeAt = 0;
export function notice(kind, text) {
  noticeAt = Date.now();
  const el = document.getElementById('notice');
  el.className = kind;
  el.dataset.kind = kind;
  fill(el, text);
  el.hidden = false;
  clearTimeout(noticeTimer);
  if (kind === 'ok') noticeTimer = setTimeout(() => { el.hidden = true; }, 8000);
}
/// Hides the notice, unless it was just shown (an act that then moves to another page
/// keeps saying what it did).
export function clearNotice() {
  const el = document.getElementById('notice');
  if (el && Date.now() - noticeAt > 1500) el.hidden = true;
}

/// Runs an action of a button: disables it meanwhile, shows what came back; `done` runs
/// after a success (usually a re-render).
export async function act(button, what, call, done) {
  if (button) button.disabled = true;
  try {
    const answer = await call();
    notice('ok', what);
    if (done) await done(answer);
    return answer;
  } catch (e) {
    notice('error', e instanceof ApiError ? e.toString() : String(e));
    return undefined;
  } finally {
    if (button && button.isConnected && !button.classList.contains('no-scope')) button.disabled = false;
  }
}

/// A button that asks once more before it acts: the first click shows "question Yes No".
export function confirmButton(label, question, action, attrs = {}) {
  const button = h('button', { ...attrs, type: 'button', class: `${attrs.class || ''} danger`.trim() }, label);
  button.addEventListener('click', () => {
    const yes = h('button', { type: 'button', class: 'danger yes', 'data-confirm': 'yes' }, 'Yes');
    const no = h('button', { type: 'button', class: 'no' }, 'No');
    const ask = h('span', { class: 'confirm' }, question, ' ', yes, ' ', no);
    no.addEventListener('click', () => ask.replaceWith(button));
    yes.addEventListener('click', async () => {
      await action(yes);
      if (ask.isConnected) ask.replaceWith(button);
    });
    button.replaceWith(ask);
  });
  return button;
}

// ---- formatting ----

/// "in 3 min", "12 s ago" from epoch ms.
export function rel(ms) {
  if (ms === undefined || ms === null || ms === '') return '';
  const d = Number(ms) - Date.now();
  const a = Math.abs(d);
  const text = a < 1000 ? `${a} ms` : a < 90e3 ? `${Math.round(a / 1e3)} s` : a < 90 * 60e3
    ? `${Math.round(a / 60e3)} min` : a < 48 * 3600e3 ? `${Math.round(a / 3600e3)} h` : `${Math.round(a / 86400e3)} d`;
  return d >= 0 ? `in ${text}` : `${text} ago`;
}

/// An instant as the API gave it (RFC 3339 in the host's zone), with how far it is.
/// Which time zone times are shown in, for every column alike: `host` (as the API gives
/// them, in the host's configured zone), `utc` or `local` (this browser's); kept in the
/// browser across visits.
export const zone = {
  get: () => localStorage.getItem('kairos.zone') || 'host',
  set: (z) => localStorage.setItem('kairos.zone', z),
};

const pad = (n, w = 2) => String(Math.abs(n)).padStart(w, '0');

/// Epoch ms as `YYYY-MM-DD HH:MM:SS` and its zone: `Z` in UTC, `±HH:MM` in local time.
function inZone(ms, which) {
  const d = new Date(Number(ms));
  if (which === 'local') {
    const off = -d.getTimezoneOffset();
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
      + `${off < 0 ? '-' : '+'}${pad(Math.trunc(off / 60))}:${pad(off % 60)}`;
  }
  return d.toISOString().replace('T', ' ').replace(/\.\d+Z/, 'Z');
}

/// A time as text in the chosen zone (`text` is the API's, in the host's zone).
/// Whether `ms` is a time in epoch ms (not absent, not an unreadable text's NaN).
const isMs = (ms) => ms !== undefined && ms !== null && ms !== '' && Number.isFinite(Number(ms));

function timeText(text, ms) {
  const which = zone.get();
  if (isMs(ms) && (which !== 'host' || !text)) return inZone(ms, which === 'host' ? 'utc' : which);
  return String(text ?? '').replace('T', ' ').replace(/\.\d+/, '');
}

export function when(text, ms) {
  if (!text && !isMs(ms)) return h('span', { class: 'muted' }, '—');
  const known = isMs(ms);
  // The tooltip: the API's own text (the host's zone), whatever the zone shown.
  const title = text || inZone(ms, 'utc');
  return h('span', { title, class: 'time' }, timeText(text, ms),
    known ? h('small', { class: 'muted' }, ` (${rel(ms)})`) : null);
}

export function epochText(ms) {
  return isMs(ms) ? timeText(null, ms) : '';
}

/// The header's choice of time zone; choosing renders the page again.
export function zoneToggle(rerender) {
  const select = h('select', { id: 'zone-toggle', title: 'Show times in' },
    h('option', { value: 'host' }, "times: host's zone"), h('option', { value: 'utc' }, 'times: UTC'),
    h('option', { value: 'local' }, 'times: local'));
  select.value = zone.get();
  select.addEventListener('change', () => { zone.set(select.value); rerender(); });
  return select;
}

export function duration(ms) {
  if (ms === undefined || ms === null) return '';
  return ms < 1000 ? `${ms} ms` : ms < 60e3 ? `${(ms / 1e3).toFixed(1)} s` : `${(ms / 60e3).toFixed(1)} min`;
}

/// The words a person reads for the states of Lives and Plans, with what each means (the
/// badge's tooltip); the seed's name is shown beside them.
const READABLE = {
  Inexistent: ['Pending', 'booked; its birth is to come'],
  Dead: ['Finished', 'its actions ran; kept as history'],
  Stillbirth: ['Cancelled or birth failed', 'cancelled before its birth, or its birth failed for good'],
  Invalidated: ['Missed', 'its time passed while no host could run it in time'],
  Standby: ['Waiting', 'in Redis until its time'],
  Preset: ['Claimed', 'a host holds it, to start it at its time'],
};

/// A state as a coloured badge (`data-state` holds the API's word). `of` names what the
/// state is of where its colours differ (a queue that is `running` is well, a Plan that
/// is `Running` is under way); states of Lives and Plans read as a person says them.
export function badge(state, of) {
  const s = String(state ?? '');
  const name = s.toLowerCase().replace(/[^a-z_]/g, '');
  const [words, meaning] = (!of && READABLE[s]) || [s, null];
  const el = h('span', { class: `badge ${of ? `${of}-${name}` : name}`, title: meaning, dataset: { state: s } }, words || '—');
  return words === s ? el : [el, ' ', h('small', { class: 'seed muted' }, s)];
}

/// What a finished Life came to (its `outcome`), in the words a person reads, with what
/// each means: one state can mean two things (a Stillbirth cancelled or whose birth failed).
const OUTCOMES = {
  succeeded: ['Finished', 'its actions ran; kept as history'],
  cancelled: ['Cancelled', 'cancelled before its birth'],
  birth_failed: ['Birth failed', 'its birth failed for good'],
  death_failed: ['Death failed', 'its death failed for good'],
  invalidated: ['Missed', 'its time passed while no host could run it in time'],
};

/// A Life's state as a badge, in the words of its outcome once it has one (why in the
/// tooltip), the seed's state beside.
export function lifeBadge(life) {
  const known = OUTCOMES[life.outcome];
  if (!known) return badge(life.state);
  const s = String(life.state ?? '');
  const title = life.outcome_reason ? `${known[1]}: ${life.outcome_reason}` : known[1];
  const el = h('span', { class: `badge ${s.toLowerCase()} outcome-${life.outcome}`, title, dataset: { state: s, outcome: life.outcome } }, known[0]);
  return [el, ' ', h('small', { class: 'seed muted' }, s)];
}

/// A time the operator typed: `+90s`, `+10m`, `+2h`, `+1d` from now (sent as RFC 3339),
/// or as typed (the API reads `YYYY-MM-DD HH:MM:SS` in the host's zone, or RFC 3339).
export function typedTime(text) {
  const t = String(text || '').trim();
  const m = /^\+(\d+)\s*(s|m|h|d)$/.exec(t);
  if (!m) return t;
  const unit = { s: 1e3, m: 60e3, h: 3600e3, d: 86400e3 }[m[2]];
  return new Date(Date.now() + Number(m[1]) * unit).toISOString();
}

/// JSON typed in a textarea; a readable error when it is not JSON.
export function parseJson(label, text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ApiError(0, 'invalid_json', `${label} is not JSON: ${e.message}`);
  }
}

/// A table: column headings and rows of cells; `empty` when there are no rows.
export function table(headings, rows, empty = 'Nothing here.') {
  if (!rows.length) return h('p', { class: 'muted empty' }, empty);
  return h('table', {},
    h('thead', {}, h('tr', {}, headings.map((c) => h('th', {}, c)))),
    h('tbody', {}, rows));
}

/// A definition list of [term, value] pairs (values: nodes or text).
export function facts(pairs) {
  return h('dl', { class: 'facts' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v ?? '—')]));
}

/// JSON shown folded, as text.
export function jsonBlock(value, summary = 'JSON') {
  return h('details', {}, h('summary', {}, summary), h('pre', {}, JSON.stringify(value, null, 2)));
}

// ---- the Prometheus text format ----

/// Samples of `/metrics`: [{name, labels: {…}, value}].
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[l[1]] = l[2].replace(/\\n/g, '\n').replace(/\\"/g, '"').replace(/\\\\/g, '\\');
    }
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

/// The sum of a metric's samples whose labels match `where`.
export function metric(samples, name, where = {}) {
  return samples
    .filter((s) => s.name === name && Object.entries(where).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

// ---- a chart ----

const SVG = 'http://www.w3.org/2000/svg';
function svg(tag, attrs) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

/// A line chart of `points` ([t ms, value]), with its title and the last value.
export function lineChart(title, points, unit, digits = 1) {
  const width = 360;
  const height = 110;
  // Room for the value axis on the left and the time axis below.
  const left = 40;
  const right = 6;
  const top = 8;
  const bottom = 18;
  const box = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart', role: 'img', 'aria-label': title });
  const last = points.length ? points[points.length - 1][1] : null;
  const label = (x, y, anchor, text, cls = 'axis') => {
    const t = svg('text', { x, y, 'text-anchor': anchor, class: cls });
    t.textContent = text;
    box.append(t);
  };
  if (points.length >= 2) {
    const t0 = points[0][0];
    const t1 = points[points.length - 1][0];
    // All zero: a scale of 0 to 1, not of 0 to nothing.
    const max = Math.max(...points.map((p) => p[1]), 0) || 1;
    const x = (t) => left + ((t - t0) / Math.max(t1 - t0, 1)) * (width - left - right);
    const y = (v) => height - bottom - (v / max) * (height - top - bottom);
    // Value axis: gridlines at 0, half and the most, labelled with the unit.
    for (const v of [0, max / 2, max]) {
      box.append(svg('line', { x1: left, x2: width - right, y1: y(v).toFixed(1), y2: y(v).toFixed(1), class: 'grid' }));
      label(left - 4, y(v) + 3, 'end', `${v.toFixed(digits)}${unit === '/s' ? '' : ' '}${unit}`);
    }
    // Time axis: when the first sample was taken, and the last.
    const clock = (t) => new Date(t).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
    label(left, height - 4, 'start', clock(t0));
    label(width - right, height - 4, 'end', clock(t1));
    const coords = points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    box.append(svg('polygon', { points: `${left},${y(0)} ${coords} ${x(t1).toFixed(1)},${y(0)}`, class: 'area' }));
    box.append(svg('polyline', { points: coords, class: 'line' }));
  } else {
    label(width / 2, height / 2, 'middle', 'sampling…');
  }
  return h('figure', { class: 'card chart-card' },
    h('figcaption', {}, title, ' ', h('b', {}, last === null ? '—' : `${last.toFixed(digits)} ${unit}`)),
    box);
}
