// The dashboard's entry: the token (asked once, kept in sessionStorage), hash routing
// (#/schedules?state=Alive, #/timers/nightly, ...) and the header.

import { api, ApiError, clearNotice, fill, h, notice, onUnauthorized, token, zoneToggle } from './lib.js';
import { pages } from './pages.js';

const main = document.getElementById('main');
let current = { stop: () => {} };
let asking = false;

/// `#/queues/default?x=1` → {page: 'queues', args: ['default'], query: URLSearchParams}.
function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, q] = raw.split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || 'overview', args: parts.slice(1), query: new URLSearchParams(q || '') };
}

/// Which render is the latest: one still loading when another starts (a refresh that a
/// button's act began, then a click elsewhere) must not mark the page ready when it ends.
let generation = 0;

async function render() {
  if (asking) return;
  const mine = ++generation;
  current.stop();
  current = { stop: () => {} };
  const { page, args, query } = parseHash();
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', a.dataset.page === page);
  }
  const show = pages[page];
  main.dataset.page = page;
  delete main.dataset.ready;
  if (!show) {
    fill(main, h('h1', {}, 'Not found'), h('p', {}, 'No such page. ', h('a', { href: '#/' }, 'Overview')));
    return;
  }
  const view = h('div', { class: 'page' });
  fill(main, view);
  const ctx = {
    args,
    query,
    // A page's timers and samplers stop when another page is shown.
    onStop: (f) => { const before = current.stop; current.stop = () => { before(); f(); }; },
    rerender: render,
  };
  try {
    await show(view, ctx);
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return;
    view.append(h('p', { class: 'error' }, e instanceof ApiError ? e.toString() : String(e)));
  }
  if (mine === generation) main.dataset.ready = page;
}

/// The token form: shown at start when the API wants one, and whenever it refuses it.
function askToken(reason) {
  if (asking) return;
  asking = true;
  current.stop();
  const input = h('input', { id: 'token-input', type: 'password', autocomplete: 'off', placeholder: 'API token', required: true });
  const form = h('form', { id: 'login', class: 'card login' },
    h('h1', {}, 'API token'),
    h('p', {}, 'This kairos host asks for an API token. It is kept in this tab\'s session storage only, and sent as ',
      h('code', {}, 'Authorization: Bearer'), ' with every call.'),
    reason ? h('p', { class: 'error' }, reason) : null,
    input, ' ', h('button', { type: 'submit' }, 'Use token'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    token.set(input.value.trim());
    asking = false;
    clearNotice();
    header();
    render();
  });
  main.dataset.page = 'login';
  main.dataset.ready = 'login';
  fill(main, form);
  input.focus();
}

function header() {
  const el = document.getElementById('session');
  const forget = h('button', { type: 'button', class: 'link', id: 'forget-token' }, 'forget token');
  forget.addEventListener('click', () => {
    token.clear();
    header();
    askToken();
  });
  fill(el, zoneToggle(() => render()), ' ', token.get() ? ['token set · ', forget] : 'no token');
}

onUnauthorized((err) => askToken(err.toString()));
window.addEventListener('hashchange', () => { clearNotice(); render(); });

async function boot() {
  header();
  try {
    // A cheap read: answers 401 when a token is needed (and askToken follows).
    await api('GET', '/clock');
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return;
    notice('error', e instanceof ApiError ? e.toString() : String(e));
  }
  render();
}

boot();
