//! Queues (SPEC section 6): the `/queues` routes, the retry block with Cloud Tasks
//! semantics, and how finished task runs are recorded.
//!
//! A task is a Plan `{queue}/{task}:task` in the same `due` set as every other Plan; it
//! is claimed, leased and fenced the same way. What makes it a queue's task is its
//! admission in `start_run.lua`: the queue must not be paused, fewer than
//! `max_concurrent` of its tasks may be running, and its token bucket (`rate` tokens per
//! second, at most `bucket_size`) must hold a token. Both counters live in Redis, so the
//! limits hold across all hosts together. A task not admitted waits in its host's timer
//! and tries again when the bucket will have a token.
//!
//! Every call carries `X-Kairos-Queue`, `X-Kairos-Task`, `X-Kairos-Retry-Count` and
//! `X-Kairos-Execution-Count`. Any failure is retried under the queue's retry block; a
//! task that exhausts it moves to the queue's failed list (`GET /queues/{q}/failed`),
//! from where `POST /queues/{q}/tasks/{task}/run` runs it again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{body_bytes, App};
use crate::error::ApiError;
use crate::scheduler::Engine;
use crate::store::{self, FinishedRun, NewTask, Owner, RunOutcome};
use crate::timers::check_name;

type Shared = Arc<App>;

/// The queue that always exists.
pub const DEFAULT_QUEUE: &str = "default";
/// How long a finished or deleted task's name stays taken.
pub const TASK_TOMBSTONE_MS: u64 = 3_600_000;
/// Most tasks one `POST /queues/{name}/tasks` adds.
pub const MAX_TASKS_PER_CALL: usize = 100;

/// Whether `path` is a task route (`/queues/{q}/tasks...`), which needs the `book` scope.
pub fn is_task_path(path: &str) -> bool {
    let mut parts = path.trim_start_matches('/').split('/');
    parts.next() == Some("queues") && parts.next().is_some() && parts.next() == Some("tasks")
}

/// The `/queues` routes.
pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/queues", get(list_queues))
        .route(
            "/queues/{name}",
            get(show_queue).put(put_queue).delete(delete_queue),
        )
        .route("/queues/{name}/pause", post(pause_queue))
        .route("/queues/{name}/resume", post(resume_queue))
        .route("/queues/{name}/purge", post(purge_queue))
        .route("/queues/{name}/tasks", get(list_tasks).post(add_tasks))
        .route("/queues/{name}/failed", get(list_failed))
        .route(
            "/queues/{name}/tasks/{task}",
            get(show_task).delete(delete_task),
        )
        .route("/queues/{name}/tasks/{task}/run", post(run_task))
}

/// A queue's retry block (Cloud Tasks' RetryConfig). A failed attempt is retried after
/// `min_backoff`, doubling `max_doublings` times, then growing linearly by the last
/// doubled interval, never above `max_backoff`. The task fails for good when its retries
/// reached `limit` (-1: no limit) and, if `age_limit` is set, its first attempt is at
/// least that old: with both set, both must be reached.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub limit: i64,
    pub age_limit_ms: u64,
    pub min_backoff_ms: u64,
    pub max_backoff_ms: u64,
    pub max_doublings: u32,
}

impl Default for RetryPolicy {
    /// Cloud Tasks' defaults: 100 attempts, no age limit, 0.1 s to 1 h, 16 doublings.
    fn default() -> Self {
        RetryPolicy {
            limit: 100,
            age_limit_ms: 0,
            min_backoff_ms: 100,
            max_backoff_ms: 3_600_000,
            max_doublings: 16,
        }
    }
}

impl RetryPolicy {
    /// The pause before retry number `retry` (1 for the first retry).
    pub fn backoff_ms(&self, retry: u32) -> u64 {
        let n = retry.max(1) - 1;
        let min = self.min_backoff_ms as f64;
        let interval = if n <= self.max_doublings {
            min * 2f64.powi(n as i32)
        } else {
            let doubled = min * 2f64.powi(self.max_doublings as i32);
            doubled * (1 + n - self.max_doublings) as f64
        };
        (interval.min(self.max_backoff_ms as f64)) as u64
    }

    /// Whether a task whose attempt number `attempts` just failed, first attempted
    /// `age_ms` ago, is given up.
    pub fn gives_up(&self, attempts: u32, age_ms: i64) -> bool {
        let count_reached = self.limit >= 0 && i64::from(attempts) > self.limit;
        let age_reached = self.age_limit_ms > 0 && age_ms >= self.age_limit_ms as i64;
        match (self.limit >= 0, self.age_limit_ms > 0) {
            (true, true) => count_reached && age_reached,
            (true, false) => count_reached,
            (false, true) => age_reached,
            (false, false) => false,
        }
    }

    fn from_hash(h: &HashMap<String, String>) -> RetryPolicy {
        let d = RetryPolicy::default();
        let get = |k: &str| h.get(k).and_then(|v| v.parse::<f64>().ok());
        RetryPolicy {
            limit: get("retry_limit").map(|v| v as i64).unwrap_or(d.limit),
            age_limit_ms: get("retry_age_limit_ms")
                .map(|v| v as u64)
                .unwrap_or(d.age_limit_ms),
            min_backoff_ms: get("retry_min_backoff_ms")
                .map(|v| v as u64)
                .unwrap_or(d.min_backoff_ms),
            max_backoff_ms: get("retry_max_backoff_ms")
                .map(|v| v as u64)
                .unwrap_or(d.max_backoff_ms),
            max_doublings: get("retry_max_doublings")
                .map(|v| v as u32)
                .unwrap_or(d.max_doublings),
        }
    }
}

/// A queue's definition.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueDef {
    /// Tasks per second; 0 = no limit.
    pub rate: f64,
    pub bucket_size: u32,
    /// 0 = no limit.
    pub max_concurrent: u32,
    pub retry: RetryPolicy,
}

impl Default for QueueDef {
    fn default() -> Self {
        QueueDef {
            rate: 500.0,
            bucket_size: 100,
            max_concurrent: 1000,
            retry: RetryPolicy::default(),
        }
    }
}

impl QueueDef {
    fn fields(&self) -> Vec<(String, String)> {
        let r = &self.retry;
        [
            ("rate", self.rate.to_string()),
            ("bucket_size", self.bucket_size.to_string()),
            ("max_concurrent", self.max_concurrent.to_string()),
            ("retry_limit", r.limit.to_string()),
            ("retry_age_limit_ms", r.age_limit_ms.to_string()),
            ("retry_min_backoff_ms", r.min_backoff_ms.to_string()),
            ("retry_max_backoff_ms", r.max_backoff_ms.to_string()),
            ("retry_max_doublings", r.max_doublings.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn from_hash(h: &HashMap<String, String>) -> QueueDef {
        let d = QueueDef::default();
        QueueDef {
            rate: h.get("rate").and_then(|v| v.parse().ok()).unwrap_or(d.rate),
            bucket_size: h
                .get("bucket_size")
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.bucket_size),
            max_concurrent: h
                .get("max_concurrent")
                .and_then(|v| v.parse().ok())
                .unwrap_or(d.max_concurrent),
            retry: RetryPolicy::from_hash(h),
        }
    }

    /// The default queue's fields as a JSON object, for `task_add.lua`.
    fn defaults_json() -> String {
        let map: serde_json::Map<String, Value> = QueueDef::default()
            .fields()
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        Value::Object(map).to_string()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueBody {
    rate: Option<f64>,
    bucket_size: Option<u32>,
    max_concurrent: Option<u32>,
    retry: Option<RetryBody>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    limit: Option<i64>,
    age_limit: Option<Value>,
    min_backoff: Option<Value>,
    max_backoff: Option<Value>,
    max_doublings: Option<u32>,
}

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(code, message)
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| bad("invalid_json", format!("the body is not valid JSON: {e}")))?;
    serde_json::from_value(value)
        .map_err(|e| bad("invalid_body", format!("the body does not fit: {e}")))
}

/// Seconds (a number) or a string such as `500ms`, in ms.
fn duration_ms(field: &str, value: &Value) -> Result<u64, ApiError> {
    crate::booking::parse_duration_value(field, value).map(|d| d.as_millis() as u64)
}

impl QueueBody {
    fn into_def(self) -> Result<QueueDef, ApiError> {
        let mut def = QueueDef::default();
        if let Some(rate) = self.rate {
            if !rate.is_finite() || rate < 0.0 {
                return Err(bad(
                    "invalid_queue",
                    "rate must be tasks per second, 0 for no limit",
                ));
            }
            def.rate = rate;
            def.bucket_size = (rate.ceil() as u32).max(1);
        }
        if let Some(b) = self.bucket_size {
            if b == 0 {
                return Err(bad("invalid_queue", "bucket_size must be at least 1"));
            }
            def.bucket_size = b;
        }
        if let Some(m) = self.max_concurrent {
            def.max_concurrent = m;
        }
        if let Some(r) = self.retry {
            let p = &mut def.retry;
            if let Some(l) = r.limit {
                if l < -1 {
                    return Err(bad(
                        "invalid_queue",
                        "retry.limit must be -1 (no limit) or more",
                    ));
                }
                p.limit = l;
            }
            if let Some(v) = &r.age_limit {
                p.age_limit_ms = duration_ms("retry.age_limit", v)?;
            }
            if let Some(v) = &r.min_backoff {
                p.min_backoff_ms = duration_ms("retry.min_backoff", v)?;
            }
            if let Some(v) = &r.max_backoff {
                p.max_backoff_ms = duration_ms("retry.max_backoff", v)?;
            }
            if let Some(d) = r.max_doublings {
                if d > 30 {
                    return Err(bad(
                        "invalid_queue",
                        "retry.max_doublings must be at most 30",
                    ));
                }
                p.max_doublings = d;
            }
            if p.min_backoff_ms > p.max_backoff_ms {
                return Err(bad(
                    "invalid_queue",
                    "retry.min_backoff must not exceed retry.max_backoff",
                ));
            }
        }
        Ok(def)
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("no queue `{name}`"))
}

/// Loads a queue; the default queue is created on first sight.
async fn load_queue(app: &App, name: &str) -> Result<HashMap<String, String>, ApiError> {
    check_name("queue name", name, 100)?;
    if let Some(q) = app.store.queue_load(name).await? {
        return Ok(q);
    }
    if name == DEFAULT_QUEUE {
        app.store
            .queue_put(name, &QueueDef::default().fields(), app.clock.now_ms())
            .await?;
        if let Some(q) = app.store.queue_load(name).await? {
            return Ok(q);
        }
    }
    Err(not_found(name))
}

async fn queue_json(app: &App, name: &str, q: &HashMap<String, String>) -> Result<Value, ApiError> {
    let def = QueueDef::from_hash(q);
    let counts = app.store.queue_counts(name).await?;
    let secs = |ms: u64| ms as f64 / 1000.0;
    Ok(json!({
        "name": name,
        "state": q.get("state").cloned().unwrap_or_else(|| "running".into()),
        "rate": def.rate,
        "bucket_size": def.bucket_size,
        "max_concurrent": def.max_concurrent,
        "retry": {
            "limit": def.retry.limit,
            "age_limit": secs(def.retry.age_limit_ms),
            "min_backoff": secs(def.retry.min_backoff_ms),
            "max_backoff": secs(def.retry.max_backoff_ms),
            "max_doublings": def.retry.max_doublings,
        },
        "tasks": {"pending": counts.pending, "running": counts.running, "failed": counts.failed},
        "created_at": q.get("created_at"),
    }))
}

async fn put_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", &name, 100)?;
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let def = parse_json::<QueueBody>(&body)?.into_def()?;
    let created = app
        .store
        .queue_put(&name, &def.fields(), app.clock.now_ms())
        .await?;
    tracing::info!(queue = %name, created, "queue defined");
    let q = load_queue(&app, &name).await?;
    Ok(Json(queue_json(&app, &name, &q).await?))
}

async fn show_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let q = load_queue(&app, &name).await?;
    Ok(Json(queue_json(&app, &name, &q).await?))
}

async fn list_queues(State(app): State<Shared>) -> Result<Json<Value>, ApiError> {
    load_queue(&app, DEFAULT_QUEUE).await?;
    let mut items = Vec::new();
    for name in app.store.queue_names().await? {
        if let Some(q) = app.store.queue_load(&name).await? {
            items.push(queue_json(&app, &name, &q).await?);
        }
    }
    Ok(Json(json!({"items": items})))
}

async fn delete_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", &name, 100)?;
    if name == DEFAULT_QUEUE {
        return Err(ApiError::conflict(
            "default_queue",
            "the default queue always exists; purge it instead",
        ));
    }
    if app.store.queue_load(&name).await?.is_none() {
        return Err(not_found(&name));
    }
    let (removed, left) = app
        .store
        .queue_purge(&name, true, app.clock.now_ms(), TASK_TOMBSTONE_MS)
        .await?;
    if left > 0 {
        return Err(ApiError::conflict(
            "tasks_running",
            format!("{removed} tasks removed; {left} are running now: try again when they return"),
        ));
    }
    Ok(Json(
        json!({"name": name, "deleted": true, "tasks_removed": removed}),
    ))
}

async fn set_state(app: &App, name: &str, state: &str) -> Result<Json<Value>, ApiError> {
    load_queue(app, name).await?;
    let found = if state == "running" {
        let now_ms = app.clock.now_ms();
        app.store
            .queue_resume(name, app.notify_before_ms(now_ms))
            .await?
    } else {
        app.store.queue_set_state(name, state).await?
    };
    if !found {
        return Err(not_found(name));
    }
    tracing::info!(queue = %name, state, "queue state changed");
    let q = load_queue(app, name).await?;
    Ok(Json(queue_json(app, name, &q).await?))
}

async fn pause_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_state(&app, &name, "paused").await
}

async fn resume_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_state(&app, &name, "running").await
}

async fn purge_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    load_queue(&app, &name).await?;
    let (removed, left) = app
        .store
        .queue_purge(&name, false, app.clock.now_ms(), TASK_TOMBSTONE_MS)
        .await?;
    Ok(Json(
        json!({"name": name, "tasks_removed": removed, "tasks_running": left}),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskBody {
    name: Option<String>,
    eta: Option<String>,
    countdown: Option<Value>,
    action: Value,
}

async fn add_tasks(
    State(app): State<Shared>,
    Path(queue): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", &queue, 100)?;
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| bad("invalid_json", format!("the body is not valid JSON: {e}")))?;
    let (list, single) = match value {
        Value::Array(items) => (items, false),
        Value::Object(mut o) if o.contains_key("tasks") => match o.remove("tasks") {
            Some(Value::Array(items)) => (items, false),
            _ => return Err(bad("invalid_body", "tasks must be a list")),
        },
        v @ Value::Object(_) => (vec![v], true),
        _ => {
            return Err(bad(
                "invalid_body",
                "the body must be a task or a list of tasks",
            ))
        }
    };
    if list.is_empty() || list.len() > MAX_TASKS_PER_CALL {
        return Err(bad(
            "invalid_body",
            format!("give 1 to {MAX_TASKS_PER_CALL} tasks"),
        ));
    }
    let now_ms = app.clock.now_ms();
    let mut tasks = Vec::with_capacity(list.len());
    let mut names = BTreeSet::new();
    for item in list {
        let t: TaskBody = serde_json::from_value(item)
            .map_err(|e| bad("invalid_body", format!("a task does not fit: {e}")))?;
        let name = match t.name {
            Some(n) => {
                check_name("task name", &n, 500)?;
                n
            }
            None => crate::booking::new_life_uuid(),
        };
        if !names.insert(name.clone()) {
            return Err(ApiError::conflict(
                "duplicate_task",
                format!("task `{name}` is given twice"),
            ));
        }
        let eta_ms = match (t.eta, t.countdown) {
            (Some(_), Some(_)) => {
                return Err(bad("invalid_body", "give eta or countdown, not both"))
            }
            (Some(eta), None) => crate::booking::parse_time(&eta, app.config.timezone)
                .map_err(|e| bad("invalid_time", format!("eta: {e}")))?
                .timestamp_millis(),
            (None, Some(c)) => now_ms + duration_ms("countdown", &c)? as i64,
            (None, None) => now_ms,
        };
        let action = app.parse_action("action", &t.action, now_ms).await?;
        tasks.push(NewTask {
            name,
            eta_ms,
            action_json: serde_json::to_string(&action).expect("actions serialize"),
        });
    }
    match app
        .store
        .task_add(&queue, &tasks, &QueueDef::defaults_json(), now_ms, app.notify_before_ms(now_ms))
        .await?
    {
        Ok(()) => {}
        Err(Some(name)) => {
            return Err(ApiError::conflict(
                "duplicate_task",
                format!("queue `{queue}` has or recently had a task named `{name}`; names are kept for an hour after a task ends"),
            ))
        }
        Err(None) => return Err(not_found(&queue)),
    }
    let tz = app.config.timezone;
    let views: Vec<Value> = tasks
        .iter()
        .map(|t| {
            json!({
                "queue": queue,
                "name": t.name,
                "eta": store::rfc3339(t.eta_ms, tz),
                "eta_ms": t.eta_ms,
            })
        })
        .collect();
    if single {
        Ok(Json(views.into_iter().next().expect("one task")))
    } else {
        Ok(Json(json!({"tasks": views})))
    }
}

fn task_json(queue: &str, name: &str, t: &HashMap<String, String>) -> Value {
    let text = |k: &str| t.get(k).cloned().map(Value::String).unwrap_or(Value::Null);
    let num = |k: &str| {
        t.get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .map(Value::from)
            .unwrap_or(Value::Null)
    };
    json!({
        "queue": queue,
        "name": name,
        "state": text("state"),
        "eta": text("fire_at"),
        "eta_ms": num("fire_at_ms"),
        "attempts": num("attempts"),
        "action": t.get("action").and_then(|a| serde_json::from_str::<Value>(a).ok()),
        "last_status": num("last_status"),
        "last_error": text("last_error"),
        "last_run": t.get("last_run").and_then(|a| serde_json::from_str::<Value>(a).ok()),
        "failed_at": text("failed_at"),
        "created_at": text("created_at"),
    })
}

async fn list_of(
    app: &App,
    queue: &str,
    failed: bool,
    query: &HashMap<String, String>,
) -> Result<Json<Value>, ApiError> {
    load_queue(app, queue).await?;
    let limit = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(100usize)
        .clamp(1, 1000);
    let items: Vec<Value> = app
        .store
        .task_list(queue, failed, limit)
        .await?
        .into_iter()
        .filter(|(_, t)| !t.is_empty())
        .map(|(name, t)| task_json(queue, &name, &t))
        .collect();
    Ok(Json(json!({"queue": queue, "items": items})))
}

async fn list_tasks(
    State(app): State<Shared>,
    Path(queue): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let failed = query.get("state").map(String::as_str) == Some("failed");
    list_of(&app, &queue, failed, &query).await
}

async fn list_failed(
    State(app): State<Shared>,
    Path(queue): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    list_of(&app, &queue, true, &query).await
}

async fn show_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", &queue, 100)?;
    check_name("task name", &task, 500)?;
    match app.store.task_load(&queue, &task).await? {
        Some(t) => Ok(Json(task_json(&queue, &task, &t))),
        None => Err(ApiError::not_found(format!(
            "no task `{task}` in queue `{queue}`"
        ))),
    }
}

async fn change_task(
    app: &App,
    queue: &str,
    task: &str,
    mode: &str,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", queue, 100)?;
    check_name("task name", task, 500)?;
    let now_ms = app.clock.now_ms();
    match app
        .store
        .task_change(
            queue,
            task,
            mode,
            now_ms,
            app.notify_before_ms(now_ms),
            TASK_TOMBSTONE_MS,
        )
        .await?
        .as_str()
    {
        "ok" if mode == "delete" => {
            Ok(Json(json!({"queue": queue, "name": task, "deleted": true})))
        }
        "ok" => Ok(Json(
            json!({"queue": queue, "name": task, "run_at_ms": now_ms}),
        )),
        "running" => Err(ApiError::conflict(
            "task_running",
            format!("task `{task}` is running now; try again when it returns"),
        )),
        _ => Err(ApiError::not_found(format!(
            "no task `{task}` in queue `{queue}`"
        ))),
    }
}

async fn delete_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    change_task(&app, &queue, &task, "delete").await
}

async fn run_task(
    State(app): State<Shared>,
    Path((queue, task)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    change_task(&app, &queue, &task, "run").await
}

impl Engine {
    /// Applies each queue's retry block to the failed runs of a batch of tasks, then
    /// records the batch (`finish_task.lua`).
    pub(crate) async fn record_tasks(&self, mut runs: Vec<FinishedRun>) {
        let queues: BTreeSet<String> = runs
            .iter()
            .filter_map(|r| match r.plan.owner() {
                Some(Owner::Task { queue, .. }) if r.outcome == RunOutcome::Failed => {
                    Some(queue.to_string())
                }
                _ => None,
            })
            .collect();
        if !queues.is_empty() {
            let failed: Vec<usize> = (0..runs.len())
                .filter(|i| runs[*i].outcome == RunOutcome::Failed)
                .collect();
            let policies = self
                .retry_store("tasks", || {
                    let queues: Vec<String> = queues.iter().cloned().collect();
                    let plans: Vec<String> = failed
                        .iter()
                        .map(|i| runs[*i].plan.plan_id.clone())
                        .collect();
                    let store = self.store.clone();
                    async move { store.task_retry_inputs(&queues, &plans).await }
                })
                .await;
            let now_ms = self.clock.now_ms();
            let (hashes, firsts) = policies.unwrap_or_default();
            let policy_of: HashMap<&str, RetryPolicy> = queues
                .iter()
                .zip(hashes.iter())
                .map(|(q, h)| (q.as_str(), RetryPolicy::from_hash(h)))
                .collect();
            for (i, first) in failed
                .iter()
                .zip(firsts.into_iter().chain(std::iter::repeat(None)))
            {
                let run = &mut runs[*i];
                let Some(Owner::Task { queue, task }) = run.plan.owner() else {
                    continue;
                };
                let policy = policy_of.get(queue).cloned().unwrap_or_default();
                let attempts = run.record.attempt;
                let age_ms = now_ms - first.unwrap_or(run.record.started_at_ms);
                if policy.gives_up(attempts, age_ms) {
                    tracing::info!(
                        queue,
                        task,
                        attempts,
                        "task failed for good; kept in the queue's failed list"
                    );
                } else {
                    let next_ms = now_ms + policy.backoff_ms(attempts) as i64;
                    run.outcome = RunOutcome::Retry { next_ms };
                    run.record.outcome = "retry";
                }
            }
        }
        for run in &runs {
            self.metrics.record_task_run(run.record.outcome);
        }
        let notify_before = self.notify_before_ms();
        let held = self
            .retry_store("tasks", || {
                self.store.finish_tasks(
                    &self.host_id,
                    &runs,
                    self.clock.now_ms(),
                    notify_before,
                    TASK_TOMBSTONE_MS,
                )
            })
            .await;
        if let Some(held) = held {
            for (run, held) in runs.iter().zip(held) {
                if !held {
                    tracing::warn!(plan = %run.plan.plan_id, "the task was taken over or removed while it ran; its run is recorded");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_grows_linearly_then_caps() {
        // The example of Cloud Tasks' RetryConfig documentation.
        let p = RetryPolicy {
            limit: 100,
            age_limit_ms: 0,
            min_backoff_ms: 10_000,
            max_backoff_ms: 300_000,
            max_doublings: 3,
        };
        let got: Vec<u64> = (1..=8).map(|n| p.backoff_ms(n) / 1000).collect();
        assert_eq!(got, [10, 20, 40, 80, 160, 240, 300, 300]);
        let none = RetryPolicy {
            max_doublings: 0,
            ..p.clone()
        };
        let got: Vec<u64> = (1..=4).map(|n| none.backoff_ms(n) / 1000).collect();
        assert_eq!(got, [10, 20, 30, 40]);
    }

    #[test]
    fn limits_give_up_when_both_are_reached() {
        let count = RetryPolicy {
            limit: 2,
            ..RetryPolicy::default()
        };
        assert!(!count.gives_up(2, 0), "attempt 2 failed: one retry left");
        assert!(count.gives_up(3, 0), "two retries done");
        let both = RetryPolicy {
            limit: 2,
            age_limit_ms: 10_000,
            ..RetryPolicy::default()
        };
        assert!(!both.gives_up(5, 9_999));
        assert!(both.gives_up(5, 10_000));
        let age = RetryPolicy {
            limit: -1,
            age_limit_ms: 10_000,
            ..RetryPolicy::default()
        };
        assert!(!age.gives_up(1000, 9_999));
        assert!(age.gives_up(1, 10_000));
        let never = RetryPolicy {
            limit: -1,
            ..RetryPolicy::default()
        };
        assert!(!never.gives_up(u32::MAX, i64::MAX));
        let zero = RetryPolicy {
            limit: 0,
            ..RetryPolicy::default()
        };
        assert!(zero.gives_up(1, 0), "limit 0: no retry at all");
    }

    #[test]
    fn task_paths_need_the_book_scope() {
        assert!(is_task_path("/queues/q/tasks"));
        assert!(is_task_path("/queues/q/tasks/t/run"));
        assert!(!is_task_path("/queues/q"));
        assert!(!is_task_path("/queues/q/purge"));
    }
}
