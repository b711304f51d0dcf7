//! The shapes of the JSON answers that the store and the domain build as JSON values
//! (a Life with its Plans and history, a timer, a queue, a task), for `GET /openapi.json`.
//!
//! These types are never built: each describes the value a view function makes (named in
//! a comment above it), with the fields every answer has as required ones and the rest
//! as optional. Their doc comments are the document's descriptions, so they speak of the
//! API only. `tests/tests/openapi.rs` checks every route's real answers against them
//! with no field left undocumented (`additionalProperties: false`), and the API fuzzer
//! (`scripts/api_fuzz.py`) checks them too, so a view that drifts fails the tests.
#![allow(dead_code, clippy::upper_case_acronyms)]

use serde_json::Value;
use utoipa::ToSchema;

use crate::bookings::request::{AnyJson, HttpMethod, ScheduleTypeName as ScheduleType};
use crate::queues::QueueModeName as QueueMode;
use crate::timers::{
    DstGapName as DstGap, DstRepeatedName as DstRepeated, MisfireName as Misfire,
    OverlapName as Overlap,
};

/// A Life's state: `Inexistent` (booked, birth not yet done), `Alive` (a term whose birth
/// is done), `Dead` (its last action done), `Stillbirth` (cancelled before birth, or its
/// birth failed for good), `Invalidated` (its birth was missed by more than
/// birth_delay_limit_time).
#[derive(serde::Serialize, ToSchema)]
pub(crate) enum LifeState {
    Inexistent,
    Alive,
    Dead,
    Stillbirth,
    Invalidated,
}

/// What a finished Life came to, telling apart what one state can mean: `succeeded`
/// (Dead, its last action done), `cancelled` (Stillbirth: cancelled before its birth),
/// `birth_failed` (Stillbirth: its birth failed for good), `death_failed` (Dead: its
/// death failed for good), `invalidated` (Invalidated: its birth was missed by more than
/// birth_delay_limit_time).
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LifeOutcome {
    Succeeded,
    Cancelled,
    BirthFailed,
    DeathFailed,
    Invalidated,
}

/// A Plan's state: `Standby` (waiting), `Preset` (claimed by a host, due soon),
/// `Running`, then `Done`, `Failed`, `Invalidated` or `Cancelled`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) enum PlanState {
    Standby,
    Preset,
    Running,
    Done,
    Failed,
    Invalidated,
    Cancelled,
}

/// A timer's state: its one Plan's, or `Inactive` when it has none.
#[derive(serde::Serialize, ToSchema)]
pub(crate) enum TimerState {
    Standby,
    Preset,
    Running,
    Done,
    Failed,
    Invalidated,
    Cancelled,
    Inactive,
}

/// Which action of a Life a Plan runs.
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum PlanKind {
    Birth,
    Death,
}

/// How one run ended: `success`; `retry` (failed, tried again later); `failed` (for good);
/// `skipped` (a timer's slot not run); `interrupted` (its host stopped during it);
/// `cancelled` (a timer's run cut off by its next slot); `expired` (a task not started
/// in time); `invalidated` (a birth missed by too long).
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RunOutcome {
    Success,
    Retry,
    Failed,
    Skipped,
    Interrupted,
    Cancelled,
    Expired,
    Invalidated,
}

/// A queue's state.
#[derive(serde::Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum QueueState {
    Running,
    Paused,
}

/// An action as stored and shown: a webhook (`path` or `url`, `method`, ...) or a plugin
/// (`plugin`, `input`, ...); times in milliseconds.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct ActionView {
    /// Webhook: a path under the host's gateway URL.
    path: Option<String>,
    /// Webhook: an absolute URL.
    url: Option<String>,
    method: Option<HttpMethod>,
    headers: Option<std::collections::BTreeMap<String, String>>,
    /// Webhook: the body, any JSON value (a string is sent as it is).
    #[schema(value_type = AnyJson, required = false)]
    body: Option<Value>,
    connect_timeout_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    /// Plugin: `name` or `name@version`.
    plugin: Option<String>,
    /// Plugin: its input, any JSON value.
    #[schema(value_type = AnyJson, required = false)]
    input: Option<Value>,
    timeout_ms: Option<u64>,
    retry_count: Option<u32>,
    retry_interval_ms: Option<u64>,
    /// Run once with the outcome after a success.
    #[schema(no_recursion)]
    on_success: Option<Box<ActionView>>,
    /// Run once with the outcome after the last retry failed.
    #[schema(no_recursion)]
    on_failure: Option<Box<ActionView>>,
}

/// A debounced Life's window: its key, and how many bookings it took.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct DebounceView {
    key: String,
    bookings: i64,
}

// store::booked_view
/// A booked Life.
#[derive(serde::Serialize, ToSchema)]
#[schema(example = json!({"life_uuid": "6f69aeb63e9b11eb93a8acde48001122", "schedule_type": "term", "state": "Inexistent", "resource_id": "conn-42", "birth_time": "2026-12-15T15:05:00Z", "birth_time_ms": 1797347100000_i64, "death_time": "2026-12-15T15:08:00Z", "death_time_ms": 1797347280000_i64}))]
pub(crate) struct Booked {
    life_uuid: String,
    schedule_type: ScheduleType,
    /// `Inexistent`: booked, birth not yet done.
    state: LifeState,
    resource_id: Option<String>,
    /// RFC 3339 in the host's timezone.
    birth_time: String,
    birth_time_ms: i64,
    death_time: Option<String>,
    death_time_ms: Option<i64>,
    /// Present when a debounced booking merged into a Life of its key.
    debounced: Option<bool>,
}

/// The body of `POST /schedules/batch` (a bare list of bookings is read too).
#[derive(ToSchema)]
#[schema(example = json!({"bookings": [
    {"birth_time": "2026-12-15 15:05:00", "birth": {"path": "/tasks", "method": "POST", "body": {"id": "a0"}}},
    {"birth_time": "2026-12-15 15:06:00", "birth": {"path": "/tasks", "method": "POST", "body": {"id": "a1"}}}
]}))]
pub(crate) struct BatchRequest {
    /// 1 to 1,000 bookings, each the body of a `POST /schedules`.
    #[schema(min_items = 1, max_items = 1000)]
    bookings: Vec<crate::bookings::request::BookingRequest>,
}

/// The answer to one booking of a batch.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct BatchItem {
    /// 200 when booked; else the status `POST /schedules` would have answered.
    status: u16,
    /// The booking, when booked.
    booking: Option<Booked>,
    /// Why it was refused, when refused.
    error: Option<crate::error::ErrorDetail>,
}

/// `POST /schedules/batch`'s answer: one result per booking, in order.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct BatchResult {
    items: Vec<BatchItem>,
    /// How many were booked.
    booked: u64,
    /// How many were refused.
    refused: u64,
}

/// A deferred request's answer: the point Life that will send it.
#[derive(serde::Serialize, ToSchema)]
#[schema(example = json!({"life_uuid": "0b4c8c8f0e1d4f8a9f4f0a6f1e2d3c4b", "birth_time": "2030-12-15T15:05:00Z", "birth_time_ms": 1923577500000_i64}))]
pub(crate) struct Deferred {
    life_uuid: String,
    birth_time: String,
    birth_time_ms: i64,
}

// store::life_summary
/// A Life as listed.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct LifeSummary {
    life_uuid: String,
    schedule_type: Option<ScheduleType>,
    state: Option<LifeState>,
    resource_id: Option<String>,
    birth_time: Option<String>,
    birth_time_ms: Option<i64>,
    death_time: Option<String>,
    death_time_ms: Option<i64>,
    created_at: Option<String>,
    updated_at_ms: Option<i64>,
    /// What it came to, once finished; null while it is not.
    outcome: Option<LifeOutcome>,
    /// Why it failed or was invalidated: the failed action's last error.
    outcome_reason: Option<String>,
    finished_at: Option<String>,
    finished_at_ms: Option<i64>,
    cancel_requested: Option<bool>,
    /// The Plan whose outcome this callback Life reports.
    callback_of: Option<String>,
    /// A debounced booking's window.
    debounce: Option<DebounceView>,
}

// Store::plan_view
/// One Plan of a Life: one firing of its birth or death action.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct PlanView {
    kind: PlanKind,
    state: Option<PlanState>,
    fire_at: Option<String>,
    fire_at_ms: Option<i64>,
    attempts: Option<i64>,
    last_status: Option<i64>,
    last_error: Option<String>,
    next_attempt_at: Option<String>,
    next_attempt_at_ms: Option<i64>,
    /// The host running or holding it.
    held_by: Option<String>,
    action: Option<ActionView>,
}

/// One run in a history: should-have-run-at, started-at, duration, host, outcome.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct RunRecord {
    plan: Option<String>,
    attempt: Option<i64>,
    should_run_at: Option<String>,
    should_run_at_ms: Option<i64>,
    started_at: Option<String>,
    started_at_ms: Option<i64>,
    duration_ms: Option<i64>,
    host: Option<String>,
    outcome: Option<RunOutcome>,
    /// The target's HTTP status (599: no answer).
    status: Option<i64>,
    error: Option<String>,
    /// What a plugin returned.
    #[schema(value_type = AnyJson, required = false)]
    output: Option<Value>,
    /// A plugin's log lines.
    logs: Option<Vec<String>>,
    /// The wait the target asked for with `Retry-After`, when it set the next attempt.
    retry_after_ms: Option<i64>,
}

// Store::life_view
/// `GET /schedules/{life_uuid}`: the Life, its Plans and its recent history.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct LifeView {
    #[schema(inline)]
    #[serde(flatten)]
    summary: LifeSummary,
    plans: Vec<PlanView>,
    history: Vec<RunRecord>,
}

/// `GET /schedules`: a page of Lives by birth time.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct LifePage {
    items: Vec<LifeSummary>,
    /// Give it as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
    /// How many Lives the filters match in all, exact, on the first page (no `cursor`);
    /// null on later pages and where that is not known without reading them (a time
    /// range, an outcome, or a state with a resource).
    total: Option<u64>,
}

/// `GET /failures`: a page of the Lives that failed, most recently finished first.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct FailurePage {
    items: Vec<LifeSummary>,
    /// Give it as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
    /// How many failed Lives are kept in all (without an `outcome` filter; else null).
    total: Option<u64>,
}

/// `DELETE /schedules/{life_uuid}`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct Cancelled {
    life_uuid: String,
    /// The Life's state after the cancel.
    state: String,
}

// api::timers::timer_json
/// A timer.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TimerView {
    name: String,
    schedule: Option<String>,
    timezone: Option<String>,
    action: Option<ActionView>,
    priority: Option<i64>,
    timeout_ms: Option<i64>,
    retries: Option<i64>,
    active: bool,
    state: TimerState,
    next_run: Option<String>,
    next_run_ms: Option<i64>,
    last_run_at_ms: Option<i64>,
    last_outcome: Option<String>,
    created_at: Option<String>,
    version: Option<i64>,
    /// The schedule in plain English.
    description: Option<String>,
    /// `wall_clock` (a fixed time of day) or `elapsed` (a wildcard minute or hour).
    dst_rule: Option<String>,
    /// With `?preview=N`: the next N runs.
    preview: Option<Vec<String>>,
    preview_ms: Option<Vec<i64>>,
    misfire: Option<Misfire>,
    /// `fire_all`: the most missed slots run.
    catch_up_limit: Option<i64>,
    /// Seconds: no missed slot older than this runs (null: no window).
    catch_up_window: Option<f64>,
    overlap: Option<Overlap>,
    /// Seconds: a slot not started this late is skipped (null: no deadline).
    starting_deadline: Option<f64>,
    /// Dates (`YYYY-MM-DD`, in its zone) on which it does not run.
    exclude_dates: Option<Vec<String>>,
    dst: Option<DstView>,
}

/// What a fixed time of day does when the clock repeats or skips it.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct DstView {
    repeated: DstRepeated,
    gap: DstGap,
}

/// `GET /timers`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TimerList {
    items: Vec<TimerView>,
    /// The `cursor` of the next page; null on the last.
    next_cursor: Option<String>,
}

/// One run of a timer, or slots it skipped: times as RFC 3339 and as epoch ms
/// (`..._ms`), as in a Life's history.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TimerRunRecord {
    plan: Option<String>,
    attempt: Option<i64>,
    should_run_at: Option<String>,
    should_run_at_ms: Option<i64>,
    started_at: Option<String>,
    started_at_ms: Option<i64>,
    duration_ms: Option<i64>,
    host: Option<String>,
    outcome: Option<RunOutcome>,
    status: Option<i64>,
    error: Option<String>,
    #[schema(value_type = AnyJson, required = false)]
    output: Option<Value>,
    logs: Option<Vec<String>>,
    retry_after_ms: Option<i64>,
    /// Skipped slots: the last of them.
    last_should_run_at: Option<String>,
    last_should_run_at_ms: Option<i64>,
    /// Skipped slots: how many.
    skipped: Option<i64>,
    /// Skipped slots: more were skipped than counted.
    more: Option<bool>,
    /// Skipped slots: why.
    reason: Option<String>,
}

/// `GET /timers/{name}/runs`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TimerRuns {
    name: String,
    items: Vec<TimerRunRecord>,
}

/// `POST /timers/{name}/run`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TimerRunNow {
    name: String,
    run_at: String,
    run_at_ms: i64,
}

/// `POST /timers/validate`: what a timer with this schedule would do.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct ScheduleCheck {
    schedule: String,
    timezone: Option<String>,
    description: Option<String>,
    /// `wall_clock` or `elapsed`.
    dst_rule: Option<String>,
    preview: Option<Vec<String>>,
    preview_ms: Option<Vec<i64>>,
}

/// A deletion's answer (`deleted: true`), with counts where there are some.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct Deleted {
    name: String,
    deleted: bool,
    tasks_removed: Option<i64>,
    unfinished_lives: Option<i64>,
}

// api::queues::queue_json
/// A queue; a pull queue has no rate, bucket, concurrency or per-key limits.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct QueueView {
    name: String,
    mode: QueueMode,
    state: QueueState,
    /// Tasks per second (0: no limit).
    rate: Option<f64>,
    bucket_size: Option<i64>,
    max_concurrent: Option<i64>,
    /// The rate limit's token bucket now; null when the queue has no rate limit.
    bucket: Option<BucketView>,
    /// Per-key limits group tasks by this: a JSON pointer into a task's action body, or
    /// `header:NAME`.
    key: Option<String>,
    max_concurrent_per_key: Option<i64>,
    rate_per_key: Option<f64>,
    retry: RetryView,
    tasks: TaskCounts,
    created_at: Option<String>,
}

/// A rate limit's token bucket.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct BucketView {
    /// Tokens in it now (refilled to now).
    tokens: f64,
    size: i64,
}

/// A queue's retry block; durations in seconds (null: none).
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct RetryView {
    /// Retries of a task; -1: no limit.
    limit: i64,
    age_limit: Option<f64>,
    min_backoff: f64,
    max_backoff: f64,
    max_doublings: i64,
}

/// A queue's tasks by state (`running` for push queues, `leased` for pull queues).
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TaskCounts {
    pending: i64,
    running: Option<i64>,
    leased: Option<i64>,
    failed: i64,
}

/// `GET /queues`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct QueueList {
    items: Vec<QueueView>,
}

/// `POST /queues/{name}/purge`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct Purged {
    name: String,
    tasks_removed: i64,
    /// Tasks running now, left to finish.
    tasks_running: i64,
}

// api::queues::task_json
/// A task; a pull queue's task has `payload`, `tag` and its lease instead of an action.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TaskView {
    queue: String,
    name: String,
    state: Option<String>,
    eta: Option<String>,
    eta_ms: Option<i64>,
    expires_at: Option<String>,
    attempts: Option<i64>,
    action: Option<ActionView>,
    last_status: Option<i64>,
    last_error: Option<String>,
    /// Its last run.
    last_run: Option<TimerRunRecord>,
    /// Its runs, newest first: the last one and up to 9 before it (only on
    /// `GET /queues/{name}/tasks/{task}`).
    runs: Option<Vec<TimerRunRecord>>,
    failed_at: Option<String>,
    created_at: Option<String>,
    /// A pull task's payload, any JSON value.
    #[schema(value_type = AnyJson, required = false)]
    payload: Option<Value>,
    tag: Option<String>,
    lease_expires_at: Option<String>,
    lease_id: Option<String>,
}

/// `GET /queues/{name}/tasks` and `/failed`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TaskList {
    queue: String,
    items: Vec<TaskView>,
    /// Give it as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
    /// How many tasks the list holds.
    total: u64,
}

/// A task as added.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TaskAdded {
    queue: String,
    name: String,
    eta: String,
    eta_ms: i64,
    expires_at: Option<String>,
}

/// Tasks added by a list (or `{"tasks": [...]}`), in its order.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TasksAdded {
    tasks: Vec<TaskAdded>,
}

/// `POST /queues/{name}/tasks`'s answer: the task, when the body was one task; the
/// tasks, when it was a list or `{"tasks": [...]}`.
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum TasksAddedAnswer {
    One(TaskAdded),
    Many(TasksAdded),
}

/// `POST /queues/{name}/tasks`'s body: one task, a list of at most 100, or
/// `{"tasks": [...]}` (a list: all added or none).
#[derive(serde::Deserialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum NewTasks {
    One(crate::queues::TaskBody),
    List(Vec<crate::queues::TaskBody>),
    Wrapped(NewTaskList),
}

/// Tasks to add, all or none.
#[derive(serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewTaskList {
    /// 1 to 100 tasks.
    #[schema(min_items = 1, max_items = 100)]
    tasks: Vec<crate::queues::TaskBody>,
}

/// `DELETE` or `POST .../run` of one task.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TaskChanged {
    queue: String,
    name: String,
    deleted: Option<bool>,
    run_at_ms: Option<i64>,
}

/// A leased pull task.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct LeasedTask {
    queue: String,
    name: String,
    /// Any JSON value.
    #[schema(value_type = AnyJson)]
    payload: Value,
    tag: Option<String>,
    attempts: Option<i64>,
    eta: Option<String>,
    lease_id: String,
    lease_expires_at: String,
    lease_expires_ms: i64,
}

/// `POST /queues/{name}/lease`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct Leased {
    tasks: Vec<LeasedTask>,
}

/// The answer to an ack, extend or nack.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct LeaseChanged {
    queue: String,
    name: String,
    acked: Option<bool>,
    due_at: Option<String>,
    lease_id: Option<String>,
    lease_expires_at: Option<String>,
    lease_expires_ms: Option<i64>,
}

/// `GET /plugins`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct PluginList {
    plugins: Vec<PluginListItem>,
}

/// One plugin of `GET /plugins`: its latest version, and who uses it.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct PluginListItem {
    #[schema(inline)]
    #[serde(flatten)]
    latest: crate::plugins::registry::PluginMeta,
    #[schema(inline)]
    #[serde(flatten)]
    usage: PluginUsage,
}

/// Who uses a plugin (any version), read when asked: what `DELETE /plugins/{name}`
/// counts before it refuses.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct PluginUsage {
    /// Unfinished Lives (Inexistent or Alive) booked with it, in every shard.
    #[schema(example = 2)]
    pub unfinished_lives: u64,
    /// Timers whose action is this plugin (active or not), by name.
    #[schema(example = json!(["nightly"]))]
    pub timers: Vec<String>,
}

/// `GET /plugins/{name}`: its latest version, every version, and who uses it.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct PluginView {
    #[schema(inline)]
    #[serde(flatten)]
    latest: crate::plugins::registry::PluginMeta,
    versions: Vec<crate::plugins::registry::PluginMeta>,
    #[schema(inline)]
    #[serde(flatten)]
    usage: PluginUsage,
}

/// `/healthz` and `/readyz`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok` (healthz) or `ready` (readyz).
    status: String,
    host_id: Option<String>,
}

/// `GET /clock`'s answer.
#[derive(serde::Serialize, ToSchema)]
#[schema(example = json!({"now": "2030-01-01T00:00:00Z", "now_ms": 1893456000000_i64, "mode": "manual"}))]
pub(crate) struct ClockView {
    now: String,
    now_ms: i64,
    /// `system`, or `manual` (`kairos serve --clock manual`).
    mode: String,
}

/// `POST /clock`'s answer.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct ClockMoved {
    now: String,
    now_ms: i64,
    /// Fire times the clock stopped at on the way.
    steps: u64,
    /// Steps whose runs were still unfinished after 10 s; the clock went on.
    stalled: u64,
    /// False when the move was cut short (100,000 steps or 2 minutes).
    complete: bool,
}

// The body of `PATCH /schedules/{life_uuid}`, read as a `BookingRequest`.
/// A change to a Life: the fields given replace those booked, in either spelling, and
/// the result is checked as a booking. Only Plans still Standby (or Preset) can change.
/// An unknown field is refused (400 `unknown_field`).
#[derive(serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"term": {"death_time": "2026-12-15 15:30:00"}}))]
pub(crate) struct BookingChange {
    schedule_type: Option<ScheduleType>,
    /// A resource in the same shard as the Life's.
    resource_id: Option<String>,
    term: Option<crate::bookings::request::TermTimes>,
    /// `YYYY-MM-DD HH:MM:SS` in the host's timezone, or RFC 3339 with an offset.
    birth_time: Option<String>,
    death_time: Option<String>,
    #[schema(value_type = Option<crate::bookings::request::RawAction>)]
    birth: Option<Value>,
    #[schema(value_type = Option<crate::bookings::request::RawAction>)]
    death: Option<Value>,
    #[schema(value_type = Option<crate::bookings::request::RawAction>)]
    birth_action: Option<Value>,
    #[schema(value_type = Option<crate::bookings::request::RawAction>)]
    death_action: Option<Value>,
}

// The body of `PATCH /timers/{name}`, read as a `TimerBody`.
/// A change to a timer: the fields given replace its own. An unknown field is refused
/// (400 `unknown_field`).
#[derive(serde::Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"schedule": "0 3 * * *", "active": true}))]
pub(crate) struct TimerChange {
    schedule: Option<String>,
    /// An IANA zone.
    timezone: Option<String>,
    #[schema(value_type = Option<crate::bookings::request::RawAction>)]
    action: Option<Value>,
    /// 1 (high) to 4 (low).
    #[schema(minimum = 1, maximum = 4)]
    priority: Option<u8>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    timeout: Option<Value>,
    retries: Option<u32>,
    active: Option<bool>,
    /// The next run's time (either time format), instead of the schedule's next slot.
    next_run: Option<String>,
    misfire: Option<Misfire>,
    catch_up_limit: Option<u32>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    catch_up_window: Option<Value>,
    overlap: Option<Overlap>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    starting_deadline: Option<Value>,
    /// Dates (`YYYY-MM-DD`, in the timer's zone) on which it does not run.
    exclude_dates: Option<Vec<String>>,
    dst: Option<crate::timers::DstBody>,
}

/// A file's bytes as a request body: `string` of `format: binary`, which generators
/// send as the raw bytes (openapi-python-client's `File`, a `Blob` for openapi-fetch),
/// never as a JSON array of numbers.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub(crate) struct ComponentBytes(#[allow(dead_code)] Vec<u8>);
