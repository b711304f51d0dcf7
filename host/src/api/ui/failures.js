// The Failures page (#/failures), where the overview's "Failed (1 h)" leads: what failed
// for good, most recent first, with its error. Queue tasks (every queue's failed list,
// re-run or delete from here), timers whose last run failed (with that run's error), and
// the Lives that failed (GET /failures), each with why. Bounded reads: 50 failed tasks a
// queue, 200 timers, 100 Lives.

import {
  act, api, confirmButton, epochText, fill, h, heading, lifeBadge, link, refreshTools, table, when,
} from './lib.js';

async function failedTasks() {
  const queues = await api('GET', '/queues');
  const failing = queues.items.filter((q) => (q.tasks.failed ?? 0) > 0);
  const lists = await Promise.all(failing.map((q) =>
    api('GET', `/queues/${encodeURIComponent(q.name)}/failed`, { query: { limit: 50 } })));
  return lists.flatMap((l) => l.items).sort((a, b) => (b.failed_at || '').localeCompare(a.failed_at || ''));
}

async function failedTimers() {
  const timers = await api('GET', '/timers', { query: { limit: 200 } });
  const failing = timers.items.filter((t) => t.last_outcome === 'failed');
  const runs = await Promise.all(failing.map((t) =>
    api('GET', `/timers/${encodeURIComponent(t.name)}/runs`, { query: { limit: 1 } })));
  return failing.map((t, i) => ({ timer: t, run: runs[i].items[0] || {} }))
    .sort((a, b) => (b.timer.last_run_at_ms || 0) - (a.timer.last_run_at_ms || 0));
}


/// The latest 100 Lives that failed (GET /failures), most recently finished first.
async function failedLives() {
  return api('GET', '/failures', { query: { limit: 100 } });
}

export async function failures(view, ctx) {
  const [tasks, timers, lives] = await Promise.all([failedTasks(), failedTimers(), failedLives()]);
  const reload = () => ctx.rerender();
  const taskPath = (t) => `/queues/${encodeURIComponent(t.queue)}/tasks/${encodeURIComponent(t.name)}`;
  const taskRows = tasks.map((t) => h('tr', { dataset: { queue: t.queue, task: t.name } },
    h('td', {}, when(t.failed_at, Date.parse(t.failed_at))), h('td', {}, link(t.queue, 'queues', t.queue)),
    h('td', { class: 'mono' }, t.name), h('td', {}, String(t.attempts ?? '')), h('td', {}, String(t.last_status ?? '')),
    h('td', { class: 'error-text' }, t.last_error || ''),
    h('td', { class: 'actions' },
      h('button', { type: 'button', dataset: { action: 'run-task', needs: 'book' },
        onclick: (e) => act(e.target, `Task ${t.name} re-run`, () => api('POST', `${taskPath(t)}/run`), reload) }, 'Re-run'),
      ' ',
      confirmButton('Delete', 'Delete this task?', (b) => act(b, `Task ${t.name} deleted`, () => api('DELETE', taskPath(t)), reload), { class: 'secondary', dataset: { needs: 'book' } }))));
  const timerRows = timers.map(({ timer, run }) => h('tr', { dataset: { timer: timer.name } },
    h('td', {}, when(epochText(timer.last_run_at_ms), timer.last_run_at_ms)), h('td', {}, link(timer.name, 'timers', timer.name)),
    h('td', {}, String(run.attempt ?? '')), h('td', {}, String(run.status ?? '')), h('td', { class: 'error-text' }, run.error || ''),
    h('td', {}, timer.next_run ? when(timer.next_run, timer.next_run_ms) : 'inactive')));
  const lifeRows = lives.items.map((life) => h('tr', { dataset: { life: life.life_uuid } },
    h('td', {}, when(life.finished_at, life.finished_at_ms)), h('td', {}, link(life.life_uuid, 'schedules', life.life_uuid)),
    h('td', {}, lifeBadge(life)), h('td', { class: 'mono' }, life.outcome || ''),
    h('td', { class: 'error-text' }, life.outcome_reason || '')));
  fill(view,
    heading('Failures', refreshTools(ctx)),
    h('p', { class: 'muted' }, 'What failed for good (no retry left, or not retryable), most recent first.'),
    h('section', { class: 'card', id: 'failed-tasks' }, h('h2', {}, `Queue tasks (${tasks.length})`),
      table(['Failed at', 'Queue', 'Task', 'Attempts', 'Last status', 'Last error', ''], taskRows, 'No failed task.'),
      h('p', { class: 'muted' }, 'The latest 50 of each queue; a queue\'s page shows its own.')),
    h('section', { class: 'card', id: 'failed-timers' }, h('h2', {}, `Timers whose last run failed (${timers.length})`),
      table(['Last run', 'Timer', 'Attempt', 'Status', 'Error', 'Next run'], timerRows, 'No timer failed its last run.')),
    h('section', { class: 'card', id: 'failed-lives' }, h('h2', {}, `Lives (${lives.total ?? lives.items.length})`),
      table(['Finished at', 'Life', 'State', 'Outcome', 'Why'], lifeRows, 'No Life failed.'),
      h('p', { class: 'muted' }, 'The latest 100 Lives whose birth or death failed for good, or whose birth was missed; kept as long as finished Lives are.')));
}
