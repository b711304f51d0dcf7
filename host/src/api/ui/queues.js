// The Queues pages (#/queues): the list, one queue (its failed list newest first, a page
// at a time, with re-run and delete of one task or all of them; its waiting tasks), and
// one task with its attempts.

import {
  act, api, badge, confirmButton, duration, facts, fill, h, heading, jsonBlock, link, refreshTools, route, table, when,
} from './lib.js';

function queueButtons(qv, done) {
  const path = `/queues/${encodeURIComponent(qv.name)}`;
  return qv.state === 'paused'
    ? h('button', { type: 'button', dataset: { action: 'resume', queue: qv.name, needs: 'admin' },
      onclick: (e) => act(e.target, `Queue ${qv.name} resumed`, () => api('POST', `${path}/resume`), done) }, 'Resume')
    : h('button', { type: 'button', class: 'secondary', dataset: { action: 'pause', queue: qv.name, needs: 'admin' },
      onclick: (e) => act(e.target, `Queue ${qv.name} paused`, () => api('POST', `${path}/pause`), done) }, 'Pause');
}

function bucket(qv) {
  if (qv.mode === 'pull') return 'pull: leased by workers';
  const parts = [`${qv.rate}/s`, `bucket ${qv.bucket_size}`];
  if (qv.bucket && qv.bucket.tokens !== undefined) parts.push(`${Number(qv.bucket.tokens).toFixed(1)} tokens now`);
  return parts.join(', ');
}

/// Most tasks one bulk action takes on (pages of 100 of the failed list).
const BULK_MAX = 5000;

/// "Re-run all failed" and "Delete all failed" of a push queue: every failed task, a page
/// of the failed list at a time, until it is empty or BULK_MAX tasks were taken.
function bulkButtons(path, name, reload) {
  const each = (verb, call) => async () => {
    let done = 0;
    const seen = new Set();
    while (done < BULK_MAX) {
      const page = await api('GET', `${path}/failed`, { query: { limit: 100 } });
      const fresh = page.items.filter((t) => !seen.has(t.name));
      if (!fresh.length) break;
      for (const t of fresh) {
        seen.add(t.name);
        await call(`${path}/tasks/${encodeURIComponent(t.name)}`);
        done += 1;
      }
    }
    return { done, verb };
  };
  const run = each('re-run', (p) => api('POST', `${p}/run`));
  const del = each('deleted', (p) => api('DELETE', p));
  return [
    confirmButton('Re-run all failed', `Run every failed task of ${name} again now?`,
      (b) => act(b, `Failed tasks of ${name} re-run`, run, reload), { id: 'rerun-all-failed', dataset: { needs: 'book' } }),
    ' ',
    confirmButton('Delete all failed', `Delete every failed task of ${name}?`,
      (b) => act(b, `Failed tasks of ${name} deleted`, del, reload), { id: 'delete-all-failed', class: 'secondary', dataset: { needs: 'book' } }),
  ];
}

export async function queues(view, ctx) {
  if (ctx.args.length >= 3 && ctx.args[1] === 'tasks') return task(view, ctx, ctx.args[0], ctx.args[2]);
  if (ctx.args.length) return queue(view, ctx, ctx.args[0]);
  const list = await api('GET', '/queues');
  const rows = list.items.map((qv) => h('tr', { dataset: { queue: qv.name } },
    h('td', {}, link(qv.name, 'queues', qv.name)), h('td', {}, qv.mode), h('td', {}, badge(qv.state, 'queue')),
    h('td', {}, String(qv.tasks.pending ?? 0)), h('td', {}, String(qv.tasks.running ?? qv.tasks.leased ?? 0)),
    h('td', {}, String(qv.tasks.failed ?? 0)), h('td', {}, bucket(qv)),
    h('td', {}, qv.max_concurrent ? String(qv.max_concurrent) : qv.mode === 'pull' ? '' : 'no limit'),
    h('td', { class: 'actions' }, queueButtons(qv, () => ctx.rerender()))));
  fill(view,
    heading('Queues', refreshTools(ctx)),
    table(['Name', 'Mode', 'State', 'Depth', 'Running', 'Failed', 'Rate and bucket', 'Max concurrent', ''], rows, 'No queue yet.'));
}

async function queue(view, ctx, name) {
  const path = `/queues/${encodeURIComponent(name)}`;
  // The failed list newest first, 50 a page (`failed_cursor` in the hash pages on).
  const failedCursor = ctx.query.get('failed_cursor');
  const [qv, pending, failed] = await Promise.all([
    api('GET', path),
    api('GET', `${path}/tasks`, { query: { limit: 50 } }),
    api('GET', `${path}/failed`, { query: { limit: 50, order: 'desc', cursor: failedCursor } }),
  ]);
  const reload = () => ctx.rerender();
  const purge = confirmButton('Purge', `Remove every waiting task of ${name}?`,
    (b) => act(b, `Queue ${name} purged`, () => api('POST', `${path}/purge`), reload), { id: 'purge', dataset: { needs: 'admin' } });
  const taskPath = (t) => `${path}/tasks/${encodeURIComponent(t.name)}`;
  const taskRow = (t, again) => h('tr', { dataset: { task: t.name } },
    h('td', { class: 'mono' }, link(t.name, 'queues', name, 'tasks', t.name)), h('td', {}, badge(t.state)),
    h('td', {}, again && t.failed_at ? when(t.failed_at, Date.parse(t.failed_at)) : when(t.eta, t.eta_ms)),
    h('td', {}, t.attempts ?? ''), h('td', {}, t.last_status ?? ''), h('td', { class: 'error-text' }, t.last_error || ''),
    h('td', {}, t.action ? jsonBlock(t.action, t.action.plugin ? `plugin ${t.action.plugin}` : `${t.action.method || ''} ${t.action.path || t.action.url || ''}`) : ''),
    h('td', { class: 'actions' },
      qv.mode === 'pull' ? null : h('button', { type: 'button', dataset: { action: 'run-task', needs: 'book' },
        onclick: (e) => act(e.target, `Task ${t.name} ${again ? 're-run' : 'runs now'}`, () => api('POST', `${taskPath(t)}/run`), reload) }, again ? 'Re-run' : 'Run now'),
      ' ',
      confirmButton('Delete', 'Delete this task?', (b) => act(b, `Task ${t.name} deleted`, () => api('DELETE', taskPath(t)), reload), { class: 'secondary', dataset: { needs: 'book' } })));
  const r = qv.retry || {};
  fill(view,
    heading(`Queue ${name}`, refreshTools(ctx), queueButtons(qv, reload), purge),
    h('p', {}, h('a', { href: '#/queues' }, '← Queues')),
    h('section', { class: 'card' }, facts([
      ['State', h('span', { id: 'queue-state' }, badge(qv.state, 'queue'))],
      ['Mode', qv.mode],
      ['Depth', h('span', { id: 'queue-depth' }, String(qv.tasks.pending ?? 0))],
      ['Running', String(qv.tasks.running ?? qv.tasks.leased ?? 0)],
      ['Failed', String(qv.tasks.failed ?? 0)],
      ['Rate and bucket', h('span', { id: 'queue-bucket' }, bucket(qv))],
      qv.mode === 'pull' ? null : ['Max concurrent', qv.max_concurrent ? String(qv.max_concurrent) : 'no limit'],
      qv.key ? ['Per key', `${qv.key}: ${qv.max_concurrent_per_key ?? '∞'} at once, ${qv.rate_per_key ?? '∞'}/s`] : null,
      ['Retry', `limit ${r.limit ?? '∞'}, backoff ${r.min_backoff}–${r.max_backoff} s, ${r.max_doublings} doublings${r.age_limit ? `, age limit ${r.age_limit} s` : ''}`],
    ])),
    h('section', { class: 'card', id: 'failed' }, h('h2', {}, `Failed (${failed.total ?? qv.tasks.failed ?? 0})`),
      failed.items.length && qv.mode !== 'pull' ? h('p', { class: 'tools' }, bulkButtons(path, name, reload)) : null,
      table(['Task', 'State', 'Failed at', 'Attempts', 'Last status', 'Last error', 'Action', ''],
        failed.items.map((t) => taskRow(t, true)), 'No failed task.'),
      h('p', { class: 'pager' },
        failedCursor ? h('a', { href: route('queues', name), class: 'button secondary', id: 'failed-first' }, '← Latest') : null, ' ',
        failed.next_cursor
          ? h('a', { href: `${route('queues', name)}?${new URLSearchParams({ failed_cursor: failed.next_cursor })}`, class: 'button secondary', id: 'failed-next' }, 'Older →')
          : null,
        h('small', { class: 'muted', id: 'failed-count' },
          ` ${failed.items.length} shown of ${failed.total ?? 0}, latest failure first; the bulk buttons act on every failed task`))),
    h('section', { class: 'card' }, h('h2', {}, 'Waiting and running'),
      table(['Task', 'State', 'ETA', 'Attempts', 'Last status', 'Last error', 'Action', ''], pending.items.map((t) => taskRow(t, false)), 'No task waiting.'),
      pending.items.length >= 50 ? h('p', { class: 'muted' }, 'The first 50 by ETA.') : null));
}

/// One task: what it runs, where it stands, and its attempts, newest first.
async function task(view, ctx, queueName, name) {
  const path = `/queues/${encodeURIComponent(queueName)}/tasks/${encodeURIComponent(name)}`;
  const t = await api('GET', path);
  const reload = () => ctx.rerender();
  const rows = (t.runs || []).map((r) => h('tr', { dataset: { attempt: String(r.attempt ?? '') } },
    h('td', {}, String(r.attempt ?? '')), h('td', {}, when(r.should_run_at, r.should_run_at_ms)),
    h('td', {}, when(r.started_at, r.started_at_ms)), h('td', {}, duration(r.duration_ms)), h('td', {}, r.host || ''),
    h('td', {}, badge(r.outcome)), h('td', {}, r.status ?? ''), h('td', { class: 'error-text' }, r.error || '')));
  // A pull task is run by its workers' leases: only a push task has Run now.
  const buttons = [
    t.action ? h('button', { type: 'button', id: 'run-task', dataset: { needs: 'book' },
      onclick: (e) => act(e.target, `Task ${name} runs now`, () => api('POST', `${path}/run`), reload) }, t.state === 'Failed' ? 'Re-run' : 'Run now') : null,
    ' ',
    confirmButton('Delete', 'Delete this task?', (b) => act(b, `Task ${name} deleted`, () => api('DELETE', path),
      () => { location.hash = route('queues', queueName); }), { class: 'secondary', id: 'delete-task', dataset: { needs: 'book' } }),
  ];
  fill(view,
    heading(`Task ${name}`, refreshTools(ctx), buttons),
    h('p', {}, link(`← Queue ${queueName}`, 'queues', queueName)),
    h('section', { class: 'card' }, facts([
      ['State', h('span', { id: 'task-state' }, badge(t.state))],
      ['ETA', when(t.eta, t.eta_ms)],
      ['Attempts', String(t.attempts ?? 0)],
      t.failed_at ? ['Failed at', when(t.failed_at, Date.parse(t.failed_at))] : null,
      ['Created', t.created_at || ''],
      t.action ? ['Action', jsonBlock(t.action, t.action.plugin ? `plugin ${t.action.plugin}` : `${t.action.method || ''} ${t.action.path || t.action.url || ''}`)] : null,
      t.payload !== undefined && !t.action ? ['Payload', jsonBlock(t.payload, 'payload')] : null,
    ])),
    h('section', { class: 'card', id: 'task-runs' }, h('h2', {}, 'Attempts'),
      table(['Attempt', 'Should run at', 'Started', 'Took', 'Host', 'Outcome', 'Status', 'Error'], rows, 'It has not run yet.'),
      h('p', { class: 'muted' }, 'The last 10, newest first.')));
}

