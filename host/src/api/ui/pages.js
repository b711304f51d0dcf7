// The dashboard's pages. Each is `async (view, ctx)`: it fills `view` from the API and
// wires its buttons; `ctx.args` are the path segments after the page's name, `ctx.query`
// the hash's query. Every list is one API page at a time: nothing loads everything.

import {
  act, add, api, badge, confirmButton, duration, epochText, facts, fill, h, heading, jsonBlock, lineChart, link,
  lifeBadge, metric, notice, parseJson, parseMetrics, refreshTools, rel, route, table, typedTime, when,
} from './lib.js';
import { failures } from './failures.js';
import { queues } from './queues.js';

const STATES = ['Inexistent', 'Alive', 'Dead', 'Stillbirth', 'Invalidated'];
const OUTCOMES = ['succeeded', 'cancelled', 'birth_failed', 'death_failed', 'invalidated'];

function field(label, input, hint) {
  return h('label', { class: 'field' }, h('span', {}, label), input, hint ? h('small', { class: 'muted' }, hint) : null);
}

/// A form whose submit runs `call` (throwing ApiError shows it) and then `done`.
function actionForm(attrs, children, what, call, done) {
  const form = h('form', { class: 'card form', ...attrs }, children);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    await act(form.querySelector('button[type=submit]'), what, call, done);
  });
  return form;
}

// ---------------------------------------------------------------------------------------
// Overview
// ---------------------------------------------------------------------------------------

/// Samples of /metrics taken by this page: fires/s and mean lateness between two samples.
const samples = [];

async function overview(view, ctx) {
  fill(view, heading('Overview', refreshTools(ctx)));
  const cards = h('div', { class: 'cards', id: 'counts' });
  const charts = h('div', { class: 'cards charts' });
  const lower = h('div', { class: 'columns' });
  add(view, cards, charts, lower);

  const sample = async () => {
    const text = await api('GET', '/metrics');
    const m = parseMetrics(text);
    samples.push({
      t: Date.now(),
      runs: metric(m, 'kairos_runs_total'),
      lateSum: metric(m, 'kairos_fire_lateness_seconds_sum'),
      lateCount: metric(m, 'kairos_fire_lateness_seconds_count'),
    });
    while (samples.length > 90) samples.shift();
    drawCounts(cards, m);
    const fires = [];
    const late = [];
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1];
      const b = samples[i];
      const dt = (b.t - a.t) / 1000;
      // A counter that went back is another host process (or a restart): skip the step.
      if (dt <= 0 || b.runs < a.runs) continue;
      fires.push([b.t, (b.runs - a.runs) / dt]);
      const n = b.lateCount - a.lateCount;
      late.push([b.t, n > 0 ? ((b.lateSum - a.lateSum) / n) * 1000 : 0]);
    }
    fill(charts,
      lineChart('Fires/s (this host)', fires, '/s', 1),
      lineChart('Mean lateness (this host)', late, 'ms', 1));
  };
  await sample();
  const every = setInterval(() => sample().catch((e) => notice('error', e.toString())), 2000);
  ctx.onStop(() => clearInterval(every));

  // Due soon: births in the next hour, and timers by next run.
  const now = Date.now();
  const [soon, timers] = await Promise.all([
    api('GET', '/schedules', { query: { state: 'Inexistent', from: now, to: now + 3600e3, limit: 10 } }),
    // The first 200 timers by name: an overview reads a bounded page, never them all.
    api('GET', '/timers', { query: { limit: 200 } }),
  ]);
  const nextTimers = timers.items.filter((t) => t.active && t.next_run_ms)
    .sort((a, b) => a.next_run_ms - b.next_run_ms).slice(0, 5);
  const hourAgo = now - 3600e3;
  const failedTimers = timers.items.filter((t) => t.last_outcome === 'failed' && t.last_run_at_ms >= hourAgo);
  const m = parseMetrics(await api('GET', '/metrics'));
  const failedQueues = m.filter((s) => s.name === 'kairos_queue_tasks' && s.labels.state === 'failed' && s.value > 0);
  add(lower,
    h('section', { class: 'card' }, h('h2', {}, 'Due soon'),
      h('h3', {}, 'Births in the next hour'),
      table(['Life', 'Type', 'Resource', 'Birth'], soon.items.map((l) => h('tr', {},
        h('td', {}, link(l.life_uuid, 'schedules', l.life_uuid)), h('td', {}, l.schedule_type),
        h('td', {}, l.resource_id || ''), h('td', {}, when(l.birth_time, l.birth_time_ms)))), 'No birth in the next hour.'),
      soon.next_cursor ? h('p', {}, h('a', { href: `#/schedules?state=Inexistent&from=${now}&to=${now + 3600e3}` }, 'More…')) : null,
      h('h3', {}, 'Timers by next run'),
      table(['Timer', 'Schedule', 'Next run'], nextTimers.map((t) => h('tr', {},
        h('td', {}, link(t.name, 'timers', t.name)), h('td', {}, t.description || t.schedule),
        h('td', {}, when(t.next_run, t.next_run_ms)))), 'No active timer.')),
    h('section', { class: 'card' }, h('h2', {}, 'Failures'),
      h('p', {}, 'Runs failed for good in the last hour, all hosts: ',
        h('b', { id: 'failed-runs' }, String(metric(m, 'kairos_failed_runs_last_hour')))),
      h('h3', {}, 'Timers whose last run, within the hour, failed'),
      table(['Timer', 'Last run'], failedTimers.map((t) => h('tr', {},
        h('td', {}, link(t.name, 'timers', t.name)), h('td', {}, when(epochText(t.last_run_at_ms), t.last_run_at_ms)))), 'None.'),
      h('h3', {}, 'Queues with failed tasks'),
      table(['Queue', 'Failed'], failedQueues.map((s) => h('tr', {},
        h('td', {}, link(s.labels.queue, 'queues', s.labels.queue)), h('td', {}, String(s.value)))), 'None.')));
}

function drawCounts(cards, m) {
  const card = (label, value, hint, href) => h('div', { class: 'card count', dataset: { metric: label } },
    h('div', { class: 'value' }, href ? h('a', { href, id: `count-${label.split(' ')[0].toLowerCase()}` }, String(value)) : String(value)),
    h('div', { class: 'label' }, label), hint ? h('small', { class: 'muted' }, hint) : null);
  const oldest = metric(m, 'kairos_oldest_overdue_plan_age_seconds');
  const lives = (state) => metric(m, 'kairos_lives', { state });
  fill(cards,
    card('Hosts alive', metric(m, 'kairos_hosts_alive')),
    card('Inexistent', lives('Inexistent'), 'Lives booked, birth to come'),
    card('Alive', lives('Alive'), 'terms born, death to come'),
    card('Dead', lives('Dead'), 'finished, kept as history'),
    card('Stillbirth', lives('Stillbirth'), 'cancelled before birth, or birth failed'),
    card('Invalidated', lives('Invalidated'), 'birth missed while hosts were down'),
    card('Failed (1 h)', metric(m, 'kairos_failed_runs_last_hour'), 'runs failed for good, all hosts: see Failures', '#/failures'),
    card('Waiting (Standby)', metric(m, 'kairos_due_plans'), 'Plans and tasks in Redis, all hosts'),
    card('Overdue', metric(m, 'kairos_overdue_plans') + metric(m, 'kairos_overdue_tasks'),
      oldest > 0 ? `oldest waited ${oldest.toFixed(1)} s` : 'none waiting past its time'),
    card('Claimed (Preset)', metric(m, 'kairos_claimed_plans'), 'held by this host'),
    card('Running', metric(m, 'kairos_running_plans'), 'on this host'),
    card('Queue tasks', metric(m, 'kairos_queue_tasks', { state: 'pending' }),
      `${metric(m, 'kairos_queue_tasks', { state: 'running' })} running, ${metric(m, 'kairos_queue_tasks', { state: 'failed' })} failed`));
}

// ---------------------------------------------------------------------------------------
// Schedules
// ---------------------------------------------------------------------------------------

async function schedules(view, ctx) {
  if (ctx.args.length) return life(view, ctx, ctx.args[0]);
  const q = ctx.query;
  const query = {
    state: q.get('state'), outcome: q.get('outcome'), resource_id: q.get('resource_id'),
    from: q.get('from'), to: q.get('to'), order: q.get('order'),
    limit: q.get('limit') || 50, cursor: q.get('cursor'),
  };
  // `total`: how many match in all, where the server knows it without reading them; the
  // first page's is carried along the next pages' links.
  const page = await api('GET', '/schedules', { query });
  const total = page.total ?? (q.get('total') ? Number(q.get('total')) : null);

  const select = (name, id, any, values) => {
    const el = h('select', { name, id }, h('option', { value: '' }, any), values.map((v) => h('option', { value: v }, v)));
    el.value = query[name] || '';
    return el;
  };
  const state = select('state', 'filter-state', 'any state', STATES);
  const outcome = select('outcome', 'filter-outcome', 'any outcome', OUTCOMES);
  const order = h('select', { name: 'order', id: 'filter-order' },
    h('option', { value: '' }, 'oldest birth first'), h('option', { value: 'desc' }, 'newest birth first'));
  order.value = query.order || '';
  const resource = h('input', { name: 'resource_id', id: 'filter-resource', value: query.resource_id || '', placeholder: 'resource id' });
  const from = h('input', { name: 'from', value: query.from || '', placeholder: 'from (time or epoch ms)' });
  const to = h('input', { name: 'to', value: query.to || '', placeholder: 'to' });
  const filters = h('form', { class: 'filters', id: 'filters' }, state, outcome, resource, from, to, order,
    h('button', { type: 'submit' }, 'Filter'), h('a', { href: '#/schedules', class: 'button secondary' }, 'Clear'));
  filters.addEventListener('submit', (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    for (const [k, v] of [['state', state.value], ['outcome', outcome.value], ['resource_id', resource.value.trim()],
      ['from', typedTime(from.value)], ['to', typedTime(to.value)], ['order', order.value]]) if (v) p.set(k, v);
    location.hash = `#/schedules?${p}`;
  });

  const wanted = h('input', { id: 'find-life', placeholder: 'a Life id', required: true });
  const find = h('form', { class: 'filters', id: 'find' }, wanted, h('button', { type: 'submit', class: 'secondary' }, 'Go to Life'));
  find.addEventListener('submit', (e) => {
    e.preventDefault();
    location.hash = route('schedules', wanted.value.trim());
  });

  const rows = page.items.map((l) => h('tr', { dataset: { life: l.life_uuid } },
    h('td', { class: 'mono' }, link(l.life_uuid, 'schedules', l.life_uuid)),
    h('td', {}, l.schedule_type), h('td', {}, lifeBadge(l)),
    h('td', { title: l.outcome_reason || '' }, l.outcome || ''), h('td', {}, l.resource_id || ''),
    h('td', {}, when(l.birth_time, l.birth_time_ms)), h('td', {}, l.death_time ? when(l.death_time, l.death_time_ms) : '')));
  const next = new URLSearchParams(q);
  if (page.next_cursor) next.set('cursor', page.next_cursor);
  if (total !== null) next.set('total', String(total));
  const first = new URLSearchParams(q);
  first.delete('cursor');
  first.delete('total');
  fill(view,
    heading('Schedules', refreshTools(ctx)),
    filters,
    find,
    table(['Life', 'Type', 'State', 'Outcome', 'Resource', 'Birth', 'Death'], rows, 'No Life matches.'),
    h('p', { class: 'pager' },
      q.get('cursor') ? h('a', { href: `#/schedules?${first}`, class: 'button secondary' }, '← First page') : null, ' ',
      page.next_cursor ? h('a', { href: `#/schedules?${next}`, class: 'button secondary', id: 'next-page' }, 'Next page →') : null,
      h('small', { class: 'muted', id: 'list-count' },
        ` ${page.items.length} shown${total !== null ? ` of ${total.toLocaleString('en')}` : ''}, by birth time${query.order === 'desc' ? ', newest first' : ''}`)),
    bookForm());
}

function bookForm() {
  const type = h('select', { name: 'schedule_type', id: 'book-type' }, h('option', { value: 'point' }, 'point'), h('option', { value: 'term' }, 'term'));
  const id = h('input', { id: 'book-id', placeholder: 'generated when empty' });
  const resource = h('input', { id: 'book-resource', placeholder: 'optional' });
  const birth = h('input', { id: 'book-birth', value: '+10m', required: true });
  const death = h('input', { id: 'book-death', value: '+20m' });
  const birthAction = h('textarea', { id: 'book-birth-action', rows: 3 }, '{"path": "/hook", "method": "POST", "body": {"from": "dashboard"}}');
  const deathAction = h('textarea', { id: 'book-death-action', rows: 3 }, '{"path": "/hook", "method": "POST", "body": {"from": "dashboard", "end": true}}');
  return actionForm({ id: 'book' }, [
    h('h2', {}, 'Book a Life'),
    h('div', { class: 'grid' },
      field('Type', type), field('Life id', id), field('Resource', resource),
      field('Birth time', birth, '+10m, 2030-12-15 15:05:00 (host zone) or RFC 3339'),
      field('Death time (term)', death)),
    h('div', { class: 'grid' }, field('Birth action (JSON)', birthAction), field('Death action (JSON, term)', deathAction)),
    h('button', { type: 'submit', dataset: { needs: 'book' } }, 'Book'),
  ], 'Booked', async () => {
    const body = { schedule_type: type.value, birth_time: typedTime(birth.value), birth: parseJson('the birth action', birthAction.value) };
    if (id.value.trim()) body.life_uuid = id.value.trim();
    if (resource.value.trim()) body.resource_id = resource.value.trim();
    if (type.value === 'term') {
      body.death_time = typedTime(death.value);
      body.death = parseJson('the death action', deathAction.value);
    }
    return api('POST', '/schedules', { body });
  }, (booked) => { location.hash = route('schedules', booked.life_uuid); });
}

async function life(view, ctx, id) {
  const l = await api('GET', `/schedules/${encodeURIComponent(id)}`);
  const finished = ['Dead', 'Stillbirth', 'Invalidated'].includes(l.state);
  const reload = () => ctx.rerender();
  const cancel = confirmButton('Cancel', l.state === 'Alive' ? 'Run its death now and end it?' : 'Cancel it (nothing runs)?',
    (b) => act(b, 'Cancelled', () => api('DELETE', `/schedules/${encodeURIComponent(id)}`), reload), { id: 'cancel', dataset: { needs: 'book' } });
  const force = confirmButton('Force cancel', 'End it without running anything more?',
    (b) => act(b, 'Force-cancelled', () => api('DELETE', `/schedules/${encodeURIComponent(id)}`, { query: { force: 'true' } }), reload),
    { id: 'force-cancel', class: 'secondary', dataset: { needs: 'book' } });

  const birth = h('input', { id: 'patch-birth', placeholder: l.birth_time || '' });
  const death = h('input', { id: 'patch-death', placeholder: l.death_time || '' });
  const reschedule = actionForm({ id: 'reschedule' }, [
    h('h2', {}, 'Reschedule'),
    h('p', { class: 'muted' }, 'Moves Plans still Standby; validated as a booking. Leave a field empty to keep it.'),
    h('div', { class: 'grid' }, field('Birth time', birth), l.schedule_type === 'term' ? field('Death time', death) : null),
    h('button', { type: 'submit', dataset: { needs: 'book' } }, 'Save'),
  ], 'Rescheduled', () => {
    const body = {};
    if (birth.value.trim()) body.birth_time = typedTime(birth.value);
    if (death.value.trim()) body.death_time = typedTime(death.value);
    return api('PATCH', `/schedules/${encodeURIComponent(id)}`, { body });
  }, reload);

  const plans = (l.plans || []).map((p) => h('tr', { dataset: { plan: p.kind } },
    h('td', {}, p.kind), h('td', {}, badge(p.state)), h('td', {}, when(p.fire_at, p.fire_at_ms)),
    h('td', {}, p.attempts ?? ''), h('td', {}, p.last_status ?? ''), h('td', { class: 'error-text' }, p.last_error || ''),
    h('td', {}, p.next_attempt_at ? when(p.next_attempt_at, p.next_attempt_at_ms) : ''), h('td', {}, p.held_by || ''),
    h('td', {}, p.action ? jsonBlock(p.action, p.action.plugin ? `plugin ${p.action.plugin}` : `${p.action.method || ''} ${p.action.path || p.action.url || ''}`) : '')));
  const runs = (l.history || []).map((r) => h('tr', {},
    h('td', {}, r.plan || ''), h('td', {}, r.attempt ?? ''), h('td', {}, when(r.should_run_at, r.should_run_at_ms)),
    h('td', {}, when(r.started_at, r.started_at_ms)), h('td', {}, duration(r.duration_ms)), h('td', {}, r.host || ''),
    h('td', {}, badge(r.outcome)), h('td', {}, r.status ?? ''), h('td', { class: 'error-text' }, r.error || ''),
    h('td', {}, extras(r))));
  fill(view,
    heading(`Life ${l.life_uuid}`, refreshTools(ctx), finished ? null : cancel, finished ? null : force),
    h('p', {}, h('a', { href: '#/schedules' }, '← Schedules')),
    h('section', { class: 'card' }, facts([
      ['State', h('span', { id: 'life-state' }, lifeBadge(l))],
      ['Type', l.schedule_type],
      ['Resource', l.resource_id || '—'],
      ['Birth', when(l.birth_time, l.birth_time_ms)],
      l.death_time ? ['Death', when(l.death_time, l.death_time_ms)] : null,
      ['Created', l.created_at || '—'],
      l.callback_of ? ['Callback of', l.callback_of] : null,
      l.cancel_requested ? ['Cancel requested', 'yes'] : null,
    ])),
    h('section', { class: 'card' }, h('h2', {}, 'Plans'),
      table(['Plan', 'State', 'Fires', 'Attempts', 'Last status', 'Last error', 'Next attempt', 'Held by', 'Action'], plans)),
    h('section', { class: 'card' }, h('h2', {}, 'Run history'),
      table(['Plan', 'Attempt', 'Should run', 'Started', 'Duration', 'Host', 'Outcome', 'Status', 'Error', 'Output, logs'], runs, 'No run yet.')),
    finished ? null : reschedule);
}

/// What a run record has beyond the common columns (a plugin's output and logs,
/// retry_after_ms, ...), folded.
function extras(record) {
  const common = ['plan', 'attempt', 'should_run_at', 'should_run_at_ms', 'started_at', 'started_at_ms', 'duration_ms',
    'host', 'outcome', 'status', 'error'];
  const rest = Object.fromEntries(Object.entries(record).filter(([k]) => !common.includes(k)));
  if (!Object.keys(rest).length) return '';
  return jsonBlock(rest, Object.keys(rest).join(', '));
}

// ---------------------------------------------------------------------------------------
// Timers
// ---------------------------------------------------------------------------------------

function timerButtons(t, done) {
  const path = `/timers/${encodeURIComponent(t.name)}`;
  return [
    h('button', { type: 'button', dataset: { action: 'run', timer: t.name, needs: 'admin' },
      onclick: (e) => act(e.target, `Timer ${t.name} runs now`, () => api('POST', `${path}/run`), done) }, 'Run now'),
    t.active
      ? h('button', { type: 'button', class: 'secondary', dataset: { action: 'deactivate', timer: t.name, needs: 'admin' },
        onclick: (e) => act(e.target, `Timer ${t.name} deactivated`, () => api('POST', `${path}/deactivate`), done) }, 'Deactivate')
      : h('button', { type: 'button', class: 'secondary', dataset: { action: 'activate', timer: t.name, needs: 'admin' },
        onclick: (e) => act(e.target, `Timer ${t.name} activated`, () => api('POST', `${path}/activate`), done) }, 'Activate'),
  ];
}

async function timers(view, ctx) {
  if (ctx.args.length) return timer(view, ctx, ctx.args[0]);
  // A page of timers by name: server-side, however many there are.
  const list = await api('GET', '/timers', { query: { limit: ctx.query.get('limit') || 50, cursor: ctx.query.get('cursor') } });
  const next = new URLSearchParams({ cursor: list.next_cursor || '' });
  const rows = list.items.map((t) => h('tr', { dataset: { timer: t.name } },
    h('td', {}, link(t.name, 'timers', t.name)), h('td', { class: 'mono' }, t.schedule || ''), h('td', {}, t.description || ''),
    h('td', {}, badge(t.active ? t.state : 'Inactive')), h('td', {}, t.active ? when(t.next_run, t.next_run_ms) : ''),
    h('td', {}, t.last_outcome ? badge(t.last_outcome) : ''), h('td', {}, t.last_run_at_ms ? rel(t.last_run_at_ms) : ''),
    h('td', { class: 'actions' }, timerButtons(t, () => ctx.rerender()))));
  const name = h('input', { id: 'timer-name', required: true, placeholder: 'nightly-report' });
  const schedule = h('input', { id: 'timer-schedule', required: true, placeholder: '*/5 * * * *  or  02:00 14:00' });
  const zone = h('input', { id: 'timer-zone', placeholder: 'host zone when empty' });
  const action = h('textarea', { id: 'timer-action', rows: 3 }, '{"path": "/hook", "method": "POST"}');
  fill(view,
    heading('Timers', refreshTools(ctx)),
    table(['Name', 'Schedule', 'Meaning', 'State', 'Next run', 'Last outcome', 'Last run', ''], rows, 'No timer yet.'),
    list.next_cursor ? h('p', {}, h('a', { href: `#/timers?${next}`, class: 'button secondary', id: 'next-timers' }, 'Next page →')) : null,
    actionForm({ id: 'create-timer' }, [
      h('h2', {}, 'New timer'),
      h('div', { class: 'grid' }, field('Name', name), field('Schedule', schedule), field('Time zone', zone)),
      field('Action (JSON)', action),
      h('button', { type: 'submit', dataset: { needs: 'admin' } }, 'Create'),
    ], 'Timer created', () => {
      const body = { name: name.value.trim(), schedule: schedule.value.trim(), action: parseJson('the action', action.value) };
      if (zone.value.trim()) body.timezone = zone.value.trim();
      return api('POST', '/timers', { body });
    }, (t) => { location.hash = route('timers', t.name); }));
}

async function timer(view, ctx, name) {
  const path = `/timers/${encodeURIComponent(name)}`;
  const [t, runs] = await Promise.all([
    api('GET', path, { query: { preview: 5 } }),
    api('GET', `${path}/runs`, { query: { limit: 20 } }),
  ]);
  const reload = () => ctx.rerender();
  const schedule = h('input', { id: 'edit-schedule', value: t.schedule || '' });
  const zone = h('input', { id: 'edit-zone', value: t.timezone || '' });
  const priority = h('input', { id: 'edit-priority', type: 'number', min: 1, max: 4, value: t.priority ?? '' });
  const retries = h('input', { id: 'edit-retries', type: 'number', min: 0, value: t.retries ?? '' });
  const nextRun = h('input', { id: 'edit-next-run', placeholder: 'keep' });
  const action = h('textarea', { id: 'edit-action', rows: 4 }, JSON.stringify(t.action ?? {}, null, 2));
  const edit = actionForm({ id: 'edit-timer' }, [
    h('h2', {}, 'Edit'),
    h('div', { class: 'grid' }, field('Schedule', schedule), field('Time zone', zone), field('Priority (1 high – 4 low)', priority),
      field('Retries', retries), field('Next run', nextRun, 'moves the next run only')),
    field('Action (JSON)', action),
    h('button', { type: 'submit', dataset: { needs: 'admin' } }, 'Save'),
  ], `Timer ${name} saved`, () => {
    const body = {};
    if (schedule.value.trim() !== (t.schedule || '')) body.schedule = schedule.value.trim();
    if (zone.value.trim() && zone.value.trim() !== t.timezone) body.timezone = zone.value.trim();
    if (priority.value !== '' && Number(priority.value) !== t.priority) body.priority = Number(priority.value);
    if (retries.value !== '' && Number(retries.value) !== t.retries) body.retries = Number(retries.value);
    if (nextRun.value.trim()) body.next_run = typedTime(nextRun.value);
    const a = parseJson('the action', action.value);
    if (JSON.stringify(a) !== JSON.stringify(t.action ?? {})) body.action = a;
    return api('PATCH', path, { body });
  }, reload);
  const del = confirmButton('Delete', `Delete timer ${name}?`,
    (b) => act(b, `Timer ${name} deleted`, () => api('DELETE', path), () => { location.hash = '#/timers'; }), { id: 'delete-timer', dataset: { needs: 'admin' } });
  const runRows = runs.items.map((r) => h('tr', {},
    h('td', {}, when(r.should_run_at, r.should_run_at_ms)), h('td', {}, when(r.started_at, r.started_at_ms)),
    h('td', {}, duration(r.duration_ms)), h('td', {}, r.host || ''), h('td', {}, badge(r.outcome)),
    h('td', {}, r.status ?? ''), h('td', { class: 'error-text' }, r.error || ''), h('td', {}, extras(r))));
  fill(view,
    heading(`Timer ${t.name}`, refreshTools(ctx), timerButtons(t, reload), del),
    h('p', {}, h('a', { href: '#/timers' }, '← Timers')),
    h('div', { class: 'columns' },
      h('section', { class: 'card' }, facts([
        ['State', h('span', { id: 'timer-state' }, badge(t.active ? t.state : 'Inactive'))],
        ['Schedule', h('code', {}, t.schedule || '')],
        ['Meaning', t.description || ''],
        ['Zone', t.timezone || ''],
        ['Priority', t.priority ?? ''],
        ['Retries', t.retries ?? ''],
        ['Next run', t.active ? when(t.next_run, t.next_run_ms) : 'inactive'],
        ['Last outcome', t.last_outcome ? badge(t.last_outcome) : '—'],
        ['Action', t.action ? jsonBlock(t.action, t.action.plugin ? `plugin ${t.action.plugin}` : `${t.action.method || ''} ${t.action.path || t.action.url || ''}`) : '—'],
      ])),
      h('section', { class: 'card' }, h('h2', {}, 'Next fire times'),
        h('ol', { id: 'preview' }, (t.preview || []).map((p, i) => h('li', {}, when(p, (t.preview_ms || [])[i])))))),
    h('section', { class: 'card', id: 'runs' }, h('h2', {}, 'Last runs'),
      table(['Should run', 'Started', 'Duration', 'Host', 'Outcome', 'Status', 'Error', 'Output, logs'], runRows, 'No run yet.')),
    edit);
}

// ---------------------------------------------------------------------------------------
// Plugins
// ---------------------------------------------------------------------------------------

async function plugins(view, ctx) {
  if (ctx.args.length) return plugin(view, ctx, ctx.args[0]);
  const list = await api('GET', '/plugins');
  const rows = list.plugins.map((p) => h('tr', { dataset: { plugin: p.name } },
    h('td', {}, link(p.name, 'plugins', p.name)), h('td', {}, `v${p.version}`),
    h('td', { class: 'mono', title: p.digest }, p.digest.slice(0, 12)), h('td', {}, `${(p.size / 1024).toFixed(0)} KiB`),
    h('td', {}, (p.allowed_hosts || []).join(', ') || 'none'), h('td', {}, p.uploaded_at),
    h('td', { class: 'lives-using' }, String(p.unfinished_lives ?? '')),
    h('td', {}, (p.timers || []).map((t) => [link(t, 'timers', t), ' ']))));
  fill(view,
    heading('Plugins', refreshTools(ctx)),
    table(['Name', 'Version', 'Digest', 'Size', 'May call', 'Uploaded', 'Unfinished Lives using it', 'Timers using it'], rows, 'No plugin uploaded.'),
    uploadForm());
}

function uploadForm(fixedName) {
  const name = h('input', { id: 'upload-name', required: true, value: fixedName || '', readonly: fixedName ? true : null });
  const file = h('input', { id: 'upload-file', type: 'file', accept: '.wasm,application/wasm', required: true });
  const hosts = h('input', { id: 'upload-hosts', placeholder: 'api.example.com:443 (kept from the last version when empty)' });
  const memory = h('input', { id: 'upload-memory', type: 'number', min: 1, max: 1024, placeholder: 'default' });
  const timeout = h('input', { id: 'upload-timeout', placeholder: 'e.g. 10s' });
  return actionForm({ id: 'upload' }, [
    h('h2', {}, fixedName ? 'Upload a new version' : 'Upload a plugin'),
    h('div', { class: 'grid' }, field('Name', name), field('Component (.wasm)', file), field('Allowed hosts', hosts),
      field('Memory (MiB)', memory), field('Timeout', timeout)),
    h('button', { type: 'submit', dataset: { needs: 'admin' } }, 'Upload'),
  ], 'Uploaded', async () => {
    const bytes = await file.files[0].arrayBuffer();
    const query = { allowed_hosts: hosts.value.trim() || undefined, memory_mb: memory.value || undefined, timeout: timeout.value.trim() || undefined };
    return api('PUT', `/plugins/${encodeURIComponent(name.value.trim())}`, { bytes, query });
  }, (p) => { location.hash = route('plugins', p.name); });
}

async function plugin(view, ctx, name) {
  const path = `/plugins/${encodeURIComponent(name)}`;
  const p = await api('GET', path);
  const using = p.timers || [];
  const del = (force) => (b) => act(b, `Plugin ${name} deleted`,
    () => api('DELETE', path, { query: force ? { force: 'true' } : undefined }), () => { location.hash = '#/plugins'; });
  fill(view,
    heading(`Plugin ${p.name}`, refreshTools(ctx),
      confirmButton('Delete', `Delete every version of ${name}?`, del(false), { id: 'delete-plugin', dataset: { needs: 'admin' } }),
      confirmButton('Force delete', 'Delete it even though Lives or timers use it?', del(true), { class: 'secondary', dataset: { needs: 'admin' } })),
    h('p', {}, h('a', { href: '#/plugins' }, '← Plugins')),
    h('section', { class: 'card' }, facts([
      ['Latest', `v${p.version}`],
      ['Digest', h('code', {}, p.digest)],
      ['May call', (p.allowed_hosts || []).join(', ') || 'none'],
      ['Limits', `${p.memory_mb} MiB, ${duration(p.timeout_ms)}`],
      ['Input schema', h('span', { id: 'plugin-schema' }, p.input_schema
        ? jsonBlock(p.input_schema, 'JSON Schema: a booking whose input does not fit is refused')
        : 'none: any input is booked')],
      ['Unfinished Lives using it', h('span', { id: 'plugin-lives' }, String(p.unfinished_lives ?? 0))],
      ['Timers using it', h('span', { id: 'plugin-timers' }, using.length ? using.map((t) => [link(t, 'timers', t), ' ']) : 'none')],
    ])),
    h('section', { class: 'card' }, h('h2', {}, 'Versions'),
      table(['Version', 'Digest', 'Size', 'May call', 'Memory', 'Timeout', 'Uploaded'], [...p.versions].reverse().map((v) => h('tr', {},
        h('td', {}, `v${v.version}`), h('td', { class: 'mono' }, v.digest), h('td', {}, `${(v.size / 1024).toFixed(0)} KiB`),
        h('td', {}, (v.allowed_hosts || []).join(', ') || 'none'), h('td', {}, `${v.memory_mb} MiB`),
        h('td', {}, duration(v.timeout_ms)), h('td', {}, v.uploaded_at))))),
    uploadForm(name));
}

export const pages = { overview, schedules, timers, queues, plugins, failures };
