//! The shapes of the JSON answers that the store and the domain build as JSON values
//! (a Life with its Plans and history, a timer, a queue, a task), for `GET /openapi.json`.
//!
//! These types are never built: each describes the value a view function makes (named on
//! it), with the fields every answer has as required ones and the rest as optional.
//! `tests/tests/openapi.rs` and the API fuzzer (`scripts/api_fuzz.py`) check real answers
//! against them, so a view that drifts from its description fails the tests.
#![allow(dead_code)]

use serde_json::Value;
use utoipa::ToSchema;

/// A booking's answer (`store::booked_view`).
#[derive(serde::Serialize, ToSchema)]
#[schema(example = json!({"life_uuid": "6f69aeb63e9b11eb93a8acde48001122", "schedule_type": "term", "state": "Inexistent", "resource_id": "conn-42", "birth_time": "2026-12-15T15:05:00Z", "birth_time_ms": 1797347100000_i64, "death_time": "2026-12-15T15:08:00Z", "death_time_ms": 1797347280000_i64}))]
pub(crate) struct Booked {
    life_uuid: String,
    /// `point` or `term`.
    schedule_type: String,
    /// `Inexistent`: booked, birth not yet done.
    state: String,
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

/// `POST /defer/...`'s answer.
#[derive(serde::Serialize, ToSchema)]
#[schema(example = json!({"life_uuid": "0b4c8c8f0e1d4f8a9f4f0a6f1e2d3c4b", "birth_time": "2030-12-15T15:05:00Z", "birth_time_ms": 1923577500000_i64}))]
pub(crate) struct Deferred {
    life_uuid: String,
    birth_time: String,
    birth_time_ms: i64,
}

/// A Life as listed (`store::life_summary`).
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct LifeSummary {
    life_uuid: String,
    schedule_type: Option<String>,
    /// `Inexistent`, `Alive`, `Dead`, `Stillbirth` or `Invalidated`.
    state: Option<String>,
    resource_id: Option<String>,
    birth_time: Option<String>,
    birth_time_ms: Option<i64>,
    death_time: Option<String>,
    death_time_ms: Option<i64>,
    created_at: Option<String>,
    updated_at_ms: Option<i64>,
    finished_at_ms: Option<i64>,
    cancel_requested: Option<bool>,
    /// The Plan whose outcome this callback Life reports.
    callback_of: Option<String>,
    #[schema(value_type = Option<Object>)]
    debounce: Option<Value>,
}

/// One Plan of a Life (`Store::plan_view`).
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct PlanView {
    /// `birth` or `death`.
    kind: String,
    /// `Standby`, `Preset`, `Running`, `Done`, `Failed`, `Invalidated` or `Cancelled`.
    state: Option<String>,
    fire_at: Option<String>,
    fire_at_ms: Option<i64>,
    attempts: Option<i64>,
    last_status: Option<i64>,
    last_error: Option<String>,
    next_attempt_at: Option<String>,
    next_attempt_at_ms: Option<i64>,
    /// The host running or holding it.
    held_by: Option<String>,
    #[schema(value_type = Option<Object>)]
    action: Option<Value>,
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
    outcome: Option<String>,
    status: Option<i64>,
    error: Option<String>,
}

/// `GET /schedules/{life_uuid}`: the Life, its Plans and its recent history
/// (`Store::life_view`).
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
}

/// `DELETE /schedules/{life_uuid}`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct Cancelled {
    life_uuid: String,
    /// The Life's state after the cancel.
    state: String,
}

/// A timer (`api::timers::timer_json`).
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TimerView {
    name: String,
    schedule: Option<String>,
    timezone: Option<String>,
    #[schema(value_type = Option<Object>)]
    action: Option<Value>,
    priority: Option<i64>,
    timeout_ms: Option<i64>,
    retries: Option<i64>,
    active: bool,
    /// The state of its one Plan (`Inactive` when it has none).
    state: String,
    next_run: Option<String>,
    next_run_ms: Option<i64>,
    last_run_at_ms: Option<i64>,
    last_outcome: Option<String>,
    created_at: Option<String>,
    version: Option<i64>,
    /// The schedule in plain English.
    description: Option<String>,
    /// `wall_clock` or `elapsed`.
    dst_rule: Option<String>,
    /// With `?preview=N`: the next N runs.
    preview: Option<Vec<String>>,
    preview_ms: Option<Vec<i64>>,
}

/// `GET /timers`.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TimerList {
    items: Vec<TimerView>,
    /// The `cursor` of the next page; null on the last.
    next_cursor: Option<String>,
}

/// One run of a timer: its times in epoch ms, and as RFC 3339 (`..._time`).
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TimerRunRecord {
    plan: Option<String>,
    attempt: Option<i64>,
    should_run_at: Option<i64>,
    should_run_at_time: Option<String>,
    started_at: Option<i64>,
    started_at_time: Option<String>,
    duration_ms: Option<i64>,
    host: Option<String>,
    /// `done`, `retry`, `failed`, `skipped`, ...
    outcome: Option<String>,
    status: Option<i64>,
    error: Option<String>,
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
    description: Option<String>,
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

/// A queue (`api::queues::queue_json`); a pull queue has no rate, bucket_size or
/// max_concurrent.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct QueueView {
    name: String,
    /// `push` or `pull`.
    mode: String,
    /// `running` or `paused`.
    state: String,
    rate: Option<f64>,
    bucket_size: Option<i64>,
    max_concurrent: Option<i64>,
    /// The rate limit's token bucket now: `tokens` (refilled to now) of `size`; null
    /// when the queue has no rate limit.
    #[schema(value_type = Option<Object>)]
    bucket: Option<Value>,
    #[schema(value_type = Object)]
    retry: Value,
    /// Task counts by state.
    #[schema(value_type = Object)]
    tasks: Value,
    created_at: Option<String>,
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

/// A task (`api::queues::task_json`); a pull task has `payload`, `tag` and its lease.
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TaskView {
    queue: String,
    name: String,
    state: Option<String>,
    eta: Option<String>,
    eta_ms: Option<i64>,
    expires_at: Option<String>,
    attempts: Option<i64>,
    #[schema(value_type = Option<Object>)]
    action: Option<Value>,
    last_status: Option<i64>,
    last_error: Option<String>,
    #[schema(value_type = Option<Object>)]
    last_run: Option<Value>,
    failed_at: Option<String>,
    created_at: Option<String>,
    #[schema(value_type = Option<Object>)]
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

/// `POST /queues/{name}/tasks`: one task added (the body was one task) or several
/// (`{"tasks": [...]}`, the body was a list).
#[derive(serde::Serialize, ToSchema)]
pub(crate) struct TasksAdded {
    queue: Option<String>,
    name: Option<String>,
    eta: Option<String>,
    eta_ms: Option<i64>,
    expires_at: Option<String>,
    tasks: Option<Vec<TaskAdded>>,
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
    #[schema(value_type = Object)]
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
