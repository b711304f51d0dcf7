//! Queues (SPEC section 6): a queue's definition, the retry block with Cloud Tasks
//! semantics, and how finished task runs are recorded. The routes are in
//! `api/queues.rs`.
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

use serde::Deserialize;
use serde_json::Value;

use crate::engine::Engine;
use crate::error::ApiError;
use crate::model::check_name;
use crate::store::{FinishedRun, Owner, RunOutcome};

/// The queue that always exists.
pub const DEFAULT_QUEUE: &str = "default";
/// How long a finished or deleted task's name stays taken.
pub const TASK_TOMBSTONE_MS: u64 = 3_600_000;
/// Most tasks one `POST /queues/{name}/tasks` adds.
pub const MAX_TASKS_PER_CALL: usize = 100;

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
    /// `push` (tasks carry actions the hosts run) or `pull` (tasks carry payloads that
    /// outside workers lease); fixed when the queue is created. None: as it is (push
    /// for a new queue).
    pub mode: Option<QueueMode>,
    /// Per-key limits: where a task's key is (a JSON pointer into its action's body or
    /// input, or `header:NAME`), and how many tasks of one key may run at once (0 = no
    /// limit) and start per second (0 = no limit). Applied by `start_run.lua`.
    pub key: Option<String>,
    pub max_concurrent_per_key: u32,
    pub rate_per_key: f64,
}

/// Longest `key` of a queue.
const MAX_KEY_PATH: usize = 200;

/// How a queue's tasks are worked (GAE task queues' push and pull modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueMode {
    Push,
    Pull,
}

impl QueueMode {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueMode::Push => "push",
            QueueMode::Pull => "pull",
        }
    }

    /// A queue hash's mode: push unless it says pull.
    pub fn of(h: &HashMap<String, String>) -> QueueMode {
        match h.get("mode").map(String::as_str) {
            Some("pull") => QueueMode::Pull,
            _ => QueueMode::Push,
        }
    }
}

impl Default for QueueDef {
    fn default() -> Self {
        QueueDef {
            rate: 500.0,
            bucket_size: 100,
            max_concurrent: 1000,
            retry: RetryPolicy::default(),
            mode: None,
            key: None,
            max_concurrent_per_key: 0,
            rate_per_key: 0.0,
        }
    }
}

impl QueueDef {
    /// Tokens in the queue's rate bucket at `now_ms`, from the `tat_ms` field of its hash
    /// as `start_run.lua` keeps it (the time the next token comes once every token given
    /// out is taken: GCRA); 0 while tokens are reserved ahead for tasks that wait for
    /// them, the bucket's size when none was taken lately. None when the queue has no
    /// rate limit.
    pub fn tokens_at(&self, hash: &HashMap<String, String>, now_ms: i64) -> Option<f64> {
        if self.rate <= 0.0 {
            return None;
        }
        let bucket = f64::from(self.bucket_size.max(1));
        let period_ms = 1000.0 / self.rate;
        let owed_ms = hash
            .get("tat_ms")
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |tat| (tat - now_ms as f64).max(0.0));
        Some((bucket - owed_ms / period_ms).clamp(0.0, bucket))
    }

    pub(crate) fn fields(&self) -> Vec<(String, String)> {
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
            ("key", self.key.clone().unwrap_or_default()),
            (
                "max_concurrent_per_key",
                self.max_concurrent_per_key.to_string(),
            ),
            ("rate_per_key", self.rate_per_key.to_string()),
        ]
        .into_iter()
        .chain(self.mode.map(|m| ("mode", m.as_str().to_string())))
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    pub(crate) fn from_hash(h: &HashMap<String, String>) -> QueueDef {
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
            mode: Some(QueueMode::of(h)),
            key: h.get("key").filter(|k| !k.is_empty()).cloned(),
            max_concurrent_per_key: h
                .get("max_concurrent_per_key")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            rate_per_key: h
                .get("rate_per_key")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0),
        }
    }

    /// The default queue's fields as a JSON object, for `task_add.lua`.
    pub fn defaults_json() -> String {
        let map: serde_json::Map<String, Value> = QueueDef::default()
            .fields()
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        Value::Object(map).to_string()
    }
}

/// A queue's mode: `push` (the hosts run its tasks' actions) or `pull` (workers lease
/// its tasks).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = QueueMode)]
#[allow(dead_code)]
#[serde(rename_all = "lowercase")]
pub(crate) enum QueueModeName {
    Push,
    Pull,
}

/// The body of `PUT /queues/{name}`: what it leaves out keeps its default.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"rate": 10, "bucket_size": 20, "max_concurrent": 5, "retry": {"limit": 5, "min_backoff": "1s", "max_backoff": "1m", "max_doublings": 4}}))]
pub struct QueueBody {
    /// Tasks per second across all hosts; 0 for no limit (push queues).
    rate: Option<f64>,
    /// At least 1 (push queues).
    bucket_size: Option<u32>,
    /// Tasks running at once across all hosts; 0 for no limit (push queues).
    max_concurrent: Option<u32>,
    retry: Option<RetryBody>,
    /// Default `push`; fixed when the queue is created.
    #[schema(value_type = Option<QueueModeName>, example = "push")]
    mode: Option<String>,
    /// Per-key limits apply to tasks grouped by this: a JSON pointer into a task's
    /// action body (`/customer/id`) or `header:NAME`.
    key: Option<String>,
    /// Tasks of one key running at once.
    max_concurrent_per_key: Option<u32>,
    /// Tasks of one key per second.
    rate_per_key: Option<f64>,
}

/// A queue's retry block (Cloud Tasks' RetryConfig).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// Retries of a task; -1 for no limit.
    #[schema(minimum = -1)]
    limit: Option<i64>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    age_limit: Option<Value>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    min_backoff: Option<Value>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    max_backoff: Option<Value>,
    #[schema(maximum = 30)]
    max_doublings: Option<u32>,
}

pub(crate) fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(code, message)
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| bad("invalid_json", format!("the body is not valid JSON: {e}")))?;
    serde_json::from_value(value)
        .map_err(|e| crate::bookings::request::body_error("the body", "invalid_body", e))
}

/// Longest backoff and age limit of a retry block (30 days): more is a mistake, and a
/// bound keeps every retry time in range.
const MAX_RETRY_DURATION_MS: u64 = 30 * 86_400_000;
/// Longest countdown of a task (ten years).
const MAX_COUNTDOWN_MS: u64 = 3650 * 86_400_000;

/// Seconds (a number) or a string such as `500ms`, in ms, at most `max_ms`.
fn duration_ms(field: &str, value: &Value, max_ms: u64) -> Result<u64, ApiError> {
    let d = crate::bookings::request::parse_duration_value(field, value)?;
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms > max_ms {
        return Err(bad(
            "invalid_duration",
            format!("{field} must be at most {} s", max_ms / 1000),
        ));
    }
    Ok(ms)
}

impl QueueBody {
    pub(crate) fn into_def(self) -> Result<QueueDef, ApiError> {
        let mode = match self.mode.as_deref() {
            None => None,
            Some("push") => Some(QueueMode::Push),
            Some("pull") => Some(QueueMode::Pull),
            Some(other) => {
                return Err(bad(
                    "invalid_queue",
                    format!("mode `{other}` is not push or pull"),
                ))
            }
        };
        let mut def = QueueDef {
            mode,
            ..QueueDef::default()
        };
        if def.mode == Some(QueueMode::Pull)
            && (self.rate.is_some() || self.bucket_size.is_some() || self.max_concurrent.is_some())
        {
            return Err(bad(
                "invalid_queue",
                "a pull queue has no rate, bucket_size or max_concurrent: its workers lease tasks at their own pace",
            ));
        }
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
        let per_key = self.max_concurrent_per_key.is_some() || self.rate_per_key.is_some();
        if def.mode == Some(QueueMode::Pull) && (per_key || self.key.is_some()) {
            return Err(bad(
                "invalid_queue",
                "a pull queue has no key, max_concurrent_per_key or rate_per_key: its workers lease tasks at their own pace",
            ));
        }
        if let Some(key) = self.key.filter(|k| !k.is_empty()) {
            check_key_path(&key)?;
            def.key = Some(key);
        } else if per_key {
            return Err(bad(
                "invalid_queue",
                "max_concurrent_per_key and rate_per_key need a key: a JSON pointer into the task's body such as \"/customer_id\", or \"header:X-Customer\"",
            ));
        }
        if let Some(m) = self.max_concurrent_per_key {
            def.max_concurrent_per_key = m;
        }
        if let Some(rate) = self.rate_per_key {
            if !rate.is_finite() || rate < 0.0 {
                return Err(bad(
                    "invalid_queue",
                    "rate_per_key must be tasks per second, 0 for no limit",
                ));
            }
            def.rate_per_key = rate;
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
                p.age_limit_ms = duration_ms("retry.age_limit", v, MAX_RETRY_DURATION_MS)?;
            }
            if let Some(v) = &r.min_backoff {
                p.min_backoff_ms = duration_ms("retry.min_backoff", v, MAX_RETRY_DURATION_MS)?;
            }
            if let Some(v) = &r.max_backoff {
                p.max_backoff_ms = duration_ms("retry.max_backoff", v, MAX_RETRY_DURATION_MS)?;
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

/// A queue's `key`: a JSON pointer (RFC 6901, e.g. `/customer/id`) into a task's action
/// body, or `header:NAME` for one of a webhook's headers.
fn check_key_path(key: &str) -> Result<(), ApiError> {
    let fine = key.len() <= MAX_KEY_PATH
        && match key.strip_prefix("header:") {
            Some(name) => is_header_name(name),
            None => key.starts_with('/'),
        };
    if fine {
        Ok(())
    } else {
        Err(bad(
            "invalid_queue",
            format!("key `{key}` is neither a JSON pointer into the task's body (\"/customer_id\") nor \"header:NAME\" (at most {MAX_KEY_PATH} bytes)"),
        ))
    }
}

/// An HTTP header name (RFC 9110 token).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// One task of `POST /queues/{name}/tasks`: an action (push queue) or a payload (pull
/// queue), due at `eta` or after `countdown` (now when neither is given).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "invoice-42", "countdown": 30, "action": {"path": "/invoices/42/send", "method": "POST"}}))]
pub struct TaskBody {
    /// Used once per queue until its tombstone expires (an hour after the task ends).
    name: Option<String>,
    /// Either time format; a past one means now.
    eta: Option<String>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    countdown: Option<Value>,
    /// A first attempt not started this long after the ETA never starts.
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    expire_after: Option<Value>,
    #[schema(value_type = Option<crate::bookings::request::RawAction>)]
    action: Option<Value>,
    /// Pull queues: any JSON value for the worker that leases the task.
    #[schema(value_type = crate::bookings::request::AnyJson, required = false)]
    payload: Option<Value>,
    /// Pull queues: workers may lease only tasks of one tag.
    tag: Option<String>,
}

/// The longest `expire_after` a task takes: a task that may start any time within a
/// month needs no TTL.
const MAX_EXPIRE_AFTER_MS: u64 = 30 * 86_400_000;

/// One task of a `POST /queues/{q}/tasks` call, read but its action not yet checked.
#[derive(Debug)]
pub(crate) struct TaskRequest {
    pub name: String,
    pub eta_ms: i64,
    /// The ETA plus `expire_after`: a first attempt not started by then never starts.
    pub expires_at_ms: Option<i64>,
    pub work: TaskWork,
}

/// What a task carries: an action for a push queue's hosts to run, or a payload (any
/// JSON) and an optional tag for a pull queue's workers to lease.
#[derive(Debug)]
pub(crate) enum TaskWork {
    Action(Value),
    Payload { payload: Value, tag: Option<String> },
}

/// One task of `POST /queues/{q}/tasks`: its name (given or new), its ETA (from `eta` or
/// `countdown`; a past one is now), when it expires (`expire_after` past its ETA, if
/// given) and its action, not yet checked. A task given no name gets
/// `fresh_name` (the one a call with an `Idempotency-Key` derives from the key, so that
/// its repeats name the same task), else a random one.
pub(crate) fn parse_task(
    item: Value,
    now_ms: i64,
    tz: chrono_tz::Tz,
    fresh_name: Option<String>,
) -> Result<TaskRequest, ApiError> {
    let t: TaskBody = serde_json::from_value(item)
        .map_err(|e| crate::bookings::request::body_error("a task", "invalid_body", e))?;
    let name = match t.name {
        Some(n) => {
            check_name("task name", &n, 500)?;
            n
        }
        None => fresh_name.unwrap_or_else(crate::bookings::request::new_life_uuid),
    };
    let eta_ms = match (t.eta, t.countdown) {
        (Some(_), Some(_)) => return Err(bad("invalid_body", "give eta or countdown, not both")),
        // A past ETA means "now", as in Cloud Tasks: the task runs at once and its
        // stored ETA never precedes the request (nor 1970, for `0000-01-01`).
        (Some(eta), None) => crate::bookings::request::parse_time(&eta, tz)
            .map_err(|e| bad("invalid_time", format!("eta: {e}")))?
            .timestamp_millis()
            .max(now_ms),
        (None, Some(c)) => now_ms + duration_ms("countdown", &c, MAX_COUNTDOWN_MS)? as i64,
        (None, None) => now_ms,
    };
    let expires_at_ms = match &t.expire_after {
        None => None,
        Some(v) => match duration_ms("expire_after", v, MAX_EXPIRE_AFTER_MS)? {
            0 => return Err(bad("invalid_duration", "expire_after must be more than 0")),
            ms => Some(eta_ms + ms as i64),
        },
    };
    let work = match (t.action, t.payload) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "invalid_body",
                "a task has an action (push queues) or a payload (pull queues), not both",
            ))
        }
        (None, None) => {
            return Err(bad(
                "missing_field",
                "a task needs an action (push queues) or a payload (pull queues)",
            ))
        }
        (Some(action), None) => {
            if t.tag.is_some() {
                return Err(bad(
                    "invalid_body",
                    "tag is for pull tasks (with a payload), to lease by",
                ));
            }
            TaskWork::Action(action)
        }
        (None, Some(payload)) => {
            if expires_at_ms.is_some() {
                return Err(bad(
                    "invalid_body",
                    "expire_after is for push tasks; a pull task waits for its workers",
                ));
            }
            if let Some(tag) = &t.tag {
                check_name("tag", tag, 500)?;
            }
            TaskWork::Payload {
                payload,
                tag: t.tag,
            }
        }
    };
    Ok(TaskRequest {
        name,
        eta_ms,
        expires_at_ms,
        work,
    })
}

impl Engine {
    /// Applies each queue's retry block to the failed runs of a batch of tasks, then
    /// records the batch (`finish_task.lua`).
    pub(crate) async fn record_tasks(&self, shard: u32, mut runs: Vec<FinishedRun>) {
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
                    async move { store.task_retry_inputs(shard, &queues, &plans).await }
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
                    run.record.retry_after_ms = None;
                    tracing::warn!(
                        queue,
                        task,
                        attempts,
                        status = run.record.status,
                        error = run.record.error.as_deref().unwrap_or(""),
                        "task failed for good; kept in the queue's failed list"
                    );
                    self.count_failure();
                } else {
                    // The target's Retry-After sets the time, within max_backoff.
                    let wait = match run.record.retry_after_ms {
                        Some(ms) => ms.min(policy.max_backoff_ms),
                        None => policy.backoff_ms(attempts),
                    };
                    let next_ms = now_ms.saturating_add(wait.min(i64::MAX as u64) as i64);
                    run.outcome = RunOutcome::Retry { next_ms };
                    run.record.outcome = "retry";
                    self.metrics
                        .record_retry(crate::metrics::retry_reason(run.record.status, false));
                }
            }
        }
        for run in &mut runs {
            if let Some(Owner::Task { queue, .. }) = run.plan.owner() {
                self.metrics.record_task_run(queue, run.record.outcome);
            }
            self.attach_callback(run);
        }
        let notify_before = self.notify_before_ms();
        let held = self
            .retry_store("tasks", || {
                self.store.finish_tasks(
                    shard,
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
    fn the_bucket_refills_at_the_rate_up_to_its_size() {
        let def = QueueDef {
            rate: 2.0,
            bucket_size: 5,
            ..QueueDef::default()
        };
        let hash = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(def.tokens_at(&hash(&[]), 1_000), Some(5.0));
        // Four and a half tokens taken at 1000 ms: the next comes at 1000 + 4.5 * 500 ms
        // once all are taken.
        let drained = hash(&[("tat_ms", "3250.000")]);
        assert_eq!(def.tokens_at(&drained, 1_000), Some(0.5));
        assert_eq!(def.tokens_at(&drained, 2_000), Some(2.5));
        assert_eq!(def.tokens_at(&drained, 60_000), Some(5.0));
        // Tokens reserved ahead for waiting tasks: none now.
        let reserved = hash(&[("tat_ms", "9000.000")]);
        assert_eq!(def.tokens_at(&reserved, 1_000), Some(0.0));
        let unlimited = QueueDef { rate: 0.0, ..def };
        assert_eq!(unlimited.tokens_at(&drained, 2_000), None);
    }

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
    fn a_past_eta_is_now_and_a_future_one_is_kept() {
        let now = 1_800_000_000_000;
        let eta = |text: &str| {
            let item = serde_json::json!({"eta": text, "action": {"path": "/x"}});
            parse_task(item, now, chrono_tz::UTC, None).unwrap().eta_ms
        };
        assert_eq!(eta("0000-01-01T00:00:00Z"), now, "before 1970");
        assert_eq!(eta("2020-01-01 00:00:00"), now);
        assert_eq!(eta("2030-01-01T00:00:00Z"), 1_893_456_000_000);
    }

    #[test]
    fn expire_after_counts_from_the_eta() {
        let now = 1_800_000_000_000;
        let task = |extra: serde_json::Value| {
            let mut item = serde_json::json!({"action": {"path": "/x"}});
            item.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse_task(item, now, chrono_tz::UTC, None)
        };
        let t = task(serde_json::json!({"countdown": 60, "expire_after": "5m"})).unwrap();
        assert_eq!(t.expires_at_ms, Some(now + 60_000 + 300_000));
        assert_eq!(task(serde_json::json!({})).unwrap().expires_at_ms, None);
        for bad in [
            serde_json::json!({"expire_after": 0}),
            serde_json::json!({"expire_after": "31d"}),
            serde_json::json!({"expire_after": "soon"}),
            serde_json::json!({"expire_after": -1}),
        ] {
            let e = task(bad.clone()).unwrap_err();
            assert_eq!(e.code, "invalid_duration", "{bad}");
        }
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
}
