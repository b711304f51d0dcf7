//! All Redis access: the key layout (documented in `docs/redis-layout.md`) and the Lua
//! scripts in `scripts/` through which every multi-key change goes.
//!
//! **Architecture invariant:** a Plan changes state only inside one of the scripts of
//! this module, each atomic in Redis, so a crash of a host between two steps leaves every
//! booking whole or absent, never half-written.
//!
//! Keys, all under `{prefix}:` (default `kairos:`):
//! - `life:{uuid}` (hash): a Life. `plan:{uuid}:{birth|death}` (hash): a Plan.
//! - `due` (sorted set, score = fire time in epoch ms): Plans waiting to be claimed.
//! - `lives` (sorted set, all scores 0, member `{birth_ms:013}:{uuid}`): every Life by
//!   birth time, for listing with exact cursors.
//! - `resource:{id}` (sorted set, score = birth ms): Lives of one resource.
//! - `hosts` (sorted set, score = lease deadline ms), `held:{host}` (sorted set, score =
//!   fire time): which host holds which claimed Plans.
//! - `lock:{resource}` (string with expiry): the resource's run lock.
//! - `runs` (stream, capped): every run of every Life; each run is also a field
//!   `run:{plan}:{attempt}` (JSON) of its Life hash, which is the Life's history.
//!   `finished` (sorted set, score = finish time): Lives to sweep after retention.
//!   `notify` (pub/sub channel): a Plan became due within the look-ahead window.
//! - Timers (`timers.rs`) and queues (`queues.rs`) add their own keys; their Plans go
//!   through the same `due`, `held:{host}`, `claim` and `start_run` as a Life's.

mod queues;
mod timers;

pub use queues::{NewTask, QueueCounts};
pub use timers::{NextRun, TimerFinish, TimerPut, TIMER_RUNS_KEPT};

use std::collections::HashMap;

use chrono::{SecondsFormat, TimeZone};
use chrono_tz::Tz;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use serde_json::{json, Map, Value};

use crate::booking::NewLife;
use crate::error::ApiError;
use crate::model::{Action, PlanKind, RunOpts, ScheduleType};

/// Builds key names under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The configured prefix followed by `:`.
    pub prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Keys {
            prefix: format!("{prefix}:"),
        }
    }
    pub fn life(&self, uuid: &str) -> String {
        format!("{}life:{uuid}", self.prefix)
    }
    pub fn plan_of(&self, uuid: &str, kind: PlanKind) -> String {
        format!("{}plan:{uuid}:{}", self.prefix, kind.as_str())
    }
    pub fn due(&self) -> String {
        format!("{}due", self.prefix)
    }
    pub fn lives(&self) -> String {
        format!("{}lives", self.prefix)
    }
    pub fn resource(&self, resource_id: &str) -> String {
        format!("{}resource:{resource_id}", self.prefix)
    }
    pub fn hosts(&self) -> String {
        format!("{}hosts", self.prefix)
    }
    pub fn held(&self, host: &str) -> String {
        format!("{}held:{host}", self.prefix)
    }
    pub fn runs(&self) -> String {
        format!("{}runs", self.prefix)
    }
    pub fn finished(&self) -> String {
        format!("{}finished", self.prefix)
    }
    pub fn notify(&self) -> String {
        format!("{}notify", self.prefix)
    }
    /// The Lives booked with plugin `name` (any version), for `DELETE /plugins/{name}`.
    pub fn plugin_lives(&self, name: &str) -> String {
        format!("{}plugin:{name}:lives", self.prefix)
    }
}

/// The member of `lives` for a Life (see the module docs).
pub fn lives_member(birth_ms: i64, uuid: &str) -> String {
    format!("{birth_ms:013}:{uuid}")
}

/// Formats epoch ms as RFC 3339 in `tz` (`Z` for UTC, milliseconds only when non-zero).
pub fn rfc3339(ms: i64, tz: Tz) -> String {
    match tz.timestamp_millis_opt(ms).single() {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::AutoSi, true),
        None => String::new(),
    }
}

struct Scripts {
    book: Script,
    patch: Script,
    cancel: Script,
    claim: Script,
    start_run: Script,
    finish_run: Script,
    reclaim: Script,
    release: Script,
    sweep: Script,
    timer_put: Script,
    timer_run: Script,
    timer_delete: Script,
    finish_timer: Script,
    queue_put: Script,
    queue_purge: Script,
    queue_resume: Script,
    task_add: Script,
    task_change: Script,
    finish_task: Script,
}

fn script(body: &str) -> Script {
    Script::new(&format!("{}\n{}", include_str!("scripts/common.lua"), body))
}

impl Scripts {
    fn load() -> Self {
        Scripts {
            book: script(include_str!("scripts/book.lua")),
            patch: script(include_str!("scripts/patch.lua")),
            cancel: script(include_str!("scripts/cancel.lua")),
            claim: script(include_str!("scripts/claim.lua")),
            start_run: script(include_str!("scripts/start_run.lua")),
            finish_run: script(include_str!("scripts/finish_run.lua")),
            reclaim: script(include_str!("scripts/reclaim.lua")),
            release: script(include_str!("scripts/release.lua")),
            sweep: script(include_str!("scripts/sweep.lua")),
            timer_put: script(include_str!("scripts/timer_put.lua")),
            timer_run: script(include_str!("scripts/timer_run.lua")),
            timer_delete: script(include_str!("scripts/timer_delete.lua")),
            finish_timer: script(include_str!("scripts/finish_timer.lua")),
            queue_put: script(include_str!("scripts/queue_put.lua")),
            queue_purge: script(include_str!("scripts/queue_purge.lua")),
            queue_resume: script(include_str!("scripts/queue_resume.lua")),
            task_add: script(include_str!("scripts/task_add.lua")),
            task_change: script(include_str!("scripts/task_change.lua")),
            finish_task: script(include_str!("scripts/finish_task.lua")),
        }
    }
}

/// A Plan claimed into a host's memory, with what is needed to fire it.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub plan_id: String,
    pub fire_at_ms: i64,
    /// Fencing token: the Plan's claim counter when this host claimed it.
    pub claim: String,
    pub action: String,
    pub attempts: u32,
    pub resource_id: Option<String>,
    /// A timer's priority, retries and timeout (default for Lives and tasks).
    pub opts: RunOpts,
}

/// Whose Plan a claimed Plan is, from its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    /// `{uuid}:{birth|death}`.
    Life(&'a str, PlanKind),
    /// `{name}:timer`.
    Timer(&'a str),
    /// `{queue}/{task}:task`.
    Task { queue: &'a str, task: &'a str },
}

impl Claimed {
    /// The Life and kind encoded in the plan id `{uuid}:{kind}`.
    pub fn life_and_kind(&self) -> Option<(&str, PlanKind)> {
        let (uuid, kind) = self.plan_id.rsplit_once(':')?;
        Some((uuid, kind.parse().ok()?))
    }

    /// Whose Plan this is.
    pub fn owner(&self) -> Option<Owner<'_>> {
        let (head, kind) = self.plan_id.rsplit_once(':')?;
        match kind {
            "timer" => Some(Owner::Timer(head)),
            "task" => {
                let (queue, task) = head.split_once('/')?;
                Some(Owner::Task { queue, task })
            }
            other => Some(Owner::Life(head, other.parse().ok()?)),
        }
    }
}

/// What `start_run` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    /// Run it; this is execution number `attempts`.
    Run { attempts: u32 },
    /// This host no longer holds the Plan: drop it.
    Lost,
    /// Another Plan of the same resource is running: try again shortly.
    Busy,
    /// A birth missed by more than birth_delay_limit_time; recorded, nothing to run.
    Invalidated,
    /// A queue task its queue does not admit yet (paused, rate, max_concurrent): try
    /// again after this many ms.
    Wait { retry_in_ms: i64 },
    /// A queue task that must wait longer: it went back to `due_tasks`; drop it.
    Deferred,
}

/// How a run ended, as `finish_run` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    Done,
    Retry { next_ms: i64 },
    Failed,
}

/// One run as written to the Life's history stream (the host is the batch's).
#[derive(Debug, Clone)]
pub struct RunRecord {
    pub should_run_at_ms: i64,
    pub started_at_ms: i64,
    pub duration_ms: u64,
    pub outcome: &'static str,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub attempt: u32,
    /// What a plugin returned.
    pub output: Option<Value>,
    /// A plugin's log lines.
    pub logs: Vec<String>,
}

/// A run whose outcome is to be recorded.
#[derive(Debug, Clone)]
pub struct FinishedRun {
    pub plan: Claimed,
    pub outcome: RunOutcome,
    pub record: RunRecord,
}

/// What `DELETE /schedules/{id}` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The Life's state afterwards.
    Done(String),
    Missing,
    Finished(String),
    Running,
}

/// Filters of `GET /schedules`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<String>,
    pub resource_id: Option<String>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    pub limit: usize,
    pub cursor: Option<String>,
}

/// The Redis-backed store of Lives and Plans. Cheap to clone: it shares one multiplexed,
/// self-reconnecting connection.
/// The plugin names (without `@version`) a booking's actions use.
fn plugin_names(life: &NewLife) -> Vec<&str> {
    let mut names: Vec<&str> = [Some(&life.birth_action), life.death_action.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|a| match a {
            crate::model::Action::Plugin(p) => Some(p.plugin.split('@').next().unwrap_or("")),
            crate::model::Action::Webhook(_) => None,
        })
        .collect();
    names.dedup();
    names
}

#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    client: redis::Client,
    pub keys: Keys,
    scripts: std::sync::Arc<Scripts>,
    timezone: Tz,
    /// Approximate cap of the `runs` stream.
    runs_max_len: usize,
}

impl Store {
    /// A handle on the shared connection, for modules that keep keys of their own.
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Connects (and keeps reconnecting) to the Redis at `url`.
    pub async fn connect(url: &str, key_prefix: &str, timezone: Tz) -> redis::RedisResult<Store> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
            .set_response_timeout(Some(std::time::Duration::from_secs(10)))
            .set_number_of_retries(3)
            .set_max_delay(std::time::Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
        Ok(Store {
            conn,
            client,
            keys: Keys::new(key_prefix),
            scripts: std::sync::Arc::new(Scripts::load()),
            timezone,
            runs_max_len: 100_000,
        })
    }

    /// Sets the approximate cap of the `runs` stream.
    pub fn with_runs_max_len(mut self, max_len: usize) -> Self {
        self.runs_max_len = max_len;
        self
    }

    /// The client, for opening a pub/sub connection.
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())
    }

    /// Epoch ms as RFC 3339 in the configured zone, as times are stored.
    pub fn fmt_time(&self, ms: i64) -> String {
        self.fmt(ms)
    }

    fn fmt(&self, ms: i64) -> String {
        rfc3339(ms, self.timezone)
    }

    /// Books a validated Life atomically; refuses with 409 on a resource overlap or an
    /// existing id.
    pub async fn book(
        &self,
        life: &NewLife,
        now_ms: i64,
        guard_ms: i64,
        notify_before_ms: i64,
    ) -> Result<(), ApiError> {
        let k = &self.keys;
        let uuid = &life.life_uuid;
        let rid = life.resource_id.as_deref().unwrap_or("");
        let birth_action = serde_json::to_string(&life.birth_action).expect("actions serialize");
        let death_action = life
            .death_action
            .as_ref()
            .map(|a| serde_json::to_string(a).expect("actions serialize"))
            .unwrap_or_default();
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.book.prepare_invoke();
        invocation
            .key(k.life(uuid))
            .key(k.plan_of(uuid, PlanKind::Birth))
            .key(k.plan_of(uuid, PlanKind::Death))
            .key(k.due())
            .key(k.lives())
            .key(k.resource(rid));
        for name in plugin_names(life) {
            invocation.key(k.plugin_lives(name));
        }
        let reply: Vec<String> = invocation
            .arg(&k.prefix)
            .arg(uuid)
            .arg(life.schedule_type.as_str())
            .arg(rid)
            .arg(life.birth_at_ms)
            .arg(self.fmt(life.birth_at_ms))
            .arg(life.death_at_ms.map(|m| m.to_string()).unwrap_or_default())
            .arg(life.death_at_ms.map(|m| self.fmt(m)).unwrap_or_default())
            .arg(birth_action)
            .arg(death_action)
            .arg(now_ms)
            .arg(guard_ms)
            .arg(notify_before_ms)
            .arg(self.fmt(now_ms))
            .invoke_async(&mut conn)
            .await?;
        match reply.first().map(String::as_str) {
            Some("ok") => Ok(()),
            Some("resource_conflict") => Err(conflict_error(rid, reply.get(1))),
            Some("duplicate") => Err(ApiError::conflict(
                "duplicate_life_uuid",
                format!("a Life with life_uuid `{uuid}` already exists"),
            )),
            other => Err(ApiError::unavailable(format!(
                "unexpected reply from book: {other:?}"
            ))),
        }
    }

    /// Loads a Life as a booking (for PATCH) with its version.
    pub async fn load_booking(
        &self,
        uuid: &str,
    ) -> Result<Option<(NewLife, String, String)>, ApiError> {
        let mut conn = self.conn.clone();
        let (life, birth, death): (
            HashMap<String, String>,
            HashMap<String, String>,
            HashMap<String, String>,
        ) = redis::pipe()
            .hgetall(self.keys.life(uuid))
            .hgetall(self.keys.plan_of(uuid, PlanKind::Birth))
            .hgetall(self.keys.plan_of(uuid, PlanKind::Death))
            .query_async(&mut conn)
            .await?;
        if life.is_empty() {
            return Ok(None);
        }
        let parse_action = |plan: &HashMap<String, String>| -> Option<Action> {
            plan.get("action")
                .and_then(|a| serde_json::from_str(a).ok())
        };
        let schedule_type = match life.get("schedule_type").map(String::as_str) {
            Some("term") => ScheduleType::Term,
            _ => ScheduleType::Point,
        };
        let booking = NewLife {
            life_uuid: uuid.to_string(),
            schedule_type,
            resource_id: life.get("resource_id").cloned(),
            birth_at_ms: life
                .get("birth_at_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            death_at_ms: life.get("death_at_ms").and_then(|v| v.parse().ok()),
            birth_action: parse_action(&birth)
                .ok_or_else(|| ApiError::unavailable("stored birth action unreadable"))?,
            death_action: parse_action(&death),
        };
        Ok(Some((
            booking,
            life.get("version").cloned().unwrap_or_else(|| "0".into()),
            life.get("state").cloned().unwrap_or_default(),
        )))
    }

    /// Applies a merged PATCH atomically if the Life is still at `version`.
    /// Returns Ok(false) when the Life changed meanwhile (the caller retries).
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        current: &NewLife,
        version: &str,
        merged: &NewLife,
        now_ms: i64,
        guard_ms: i64,
        notify_before_ms: i64,
    ) -> Result<bool, ApiError> {
        let k = &self.keys;
        let uuid = &merged.life_uuid;
        let birth_changed = current.birth_at_ms != merged.birth_at_ms
            || current.birth_action != merged.birth_action;
        let death_changed = current.death_at_ms != merged.death_at_ms
            || current.death_action != merged.death_action;
        let resource_changed = current.resource_id != merged.resource_id;
        let new_rid = merged.resource_id.as_deref().unwrap_or("");
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.patch.prepare_invoke();
        invocation
            .key(k.life(uuid))
            .key(k.plan_of(uuid, PlanKind::Birth))
            .key(k.plan_of(uuid, PlanKind::Death))
            .key(k.due())
            .key(k.lives())
            .key(k.resource(current.resource_id.as_deref().unwrap_or("")))
            .key(k.resource(new_rid));
        for name in plugin_names(merged) {
            invocation.key(k.plugin_lives(name));
        }
        let reply: Vec<String> = invocation
            .arg(&k.prefix)
            .arg(uuid)
            .arg(version)
            .arg(new_rid)
            .arg(merged.birth_at_ms)
            .arg(self.fmt(merged.birth_at_ms))
            .arg(
                merged
                    .death_at_ms
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            )
            .arg(merged.death_at_ms.map(|m| self.fmt(m)).unwrap_or_default())
            .arg(serde_json::to_string(&merged.birth_action).expect("actions serialize"))
            .arg(
                merged
                    .death_action
                    .as_ref()
                    .map(|a| serde_json::to_string(a).expect("actions serialize"))
                    .unwrap_or_default(),
            )
            .arg(now_ms)
            .arg(guard_ms)
            .arg(notify_before_ms)
            .arg(if birth_changed { "1" } else { "0" })
            .arg(if death_changed { "1" } else { "0" })
            .arg(if resource_changed { "1" } else { "0" })
            .invoke_async(&mut conn)
            .await?;
        match reply.first().map(String::as_str) {
            Some("ok") => Ok(true),
            Some("changed") => Ok(false),
            Some("cancelled") => Err(ApiError::conflict(
                "life_cancelled",
                "this Life was cancelled (DELETE) and its death runs now; it cannot change",
            )),
            Some("not_pending") => Err(ApiError::conflict(
                "plan_not_pending",
                format!(
                    "the {} Plan has already started or finished; only Plans still Standby can change",
                    reply.get(1).map(String::as_str).unwrap_or("birth")
                ),
            )),
            Some("resource_conflict") => Err(conflict_error(new_rid, reply.get(1))),
            other => Err(ApiError::unavailable(format!("unexpected reply from patch: {other:?}"))),
        }
    }

    /// Cancels a Life (DELETE).
    pub async fn cancel(
        &self,
        uuid: &str,
        force: bool,
        now_ms: i64,
        notify_before_ms: i64,
    ) -> Result<CancelOutcome, ApiError> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        let reply: Vec<String> = self
            .scripts
            .cancel
            .key(k.life(uuid))
            .key(k.plan_of(uuid, PlanKind::Birth))
            .key(k.plan_of(uuid, PlanKind::Death))
            .key(k.due())
            .arg(&k.prefix)
            .arg(uuid)
            .arg(now_ms)
            .arg(self.fmt(now_ms))
            .arg(if force { "1" } else { "0" })
            .arg(notify_before_ms)
            .invoke_async(&mut conn)
            .await?;
        let second = reply.get(1).cloned().unwrap_or_default();
        Ok(match reply.first().map(String::as_str) {
            Some("ok") => CancelOutcome::Done(second),
            Some("missing") => CancelOutcome::Missing,
            Some("finished") => CancelOutcome::Finished(second),
            Some("running") => CancelOutcome::Running,
            other => {
                return Err(ApiError::unavailable(format!(
                    "unexpected reply from cancel: {other:?}"
                )))
            }
        })
    }

    /// The Life as the API shows it: fields, Plans and recent history (newest first).
    pub async fn life_view(
        &self,
        uuid: &str,
        history_count: usize,
    ) -> Result<Option<Value>, ApiError> {
        let mut conn = self.conn.clone();
        type Hash = HashMap<String, String>;
        let (life, birth, death): (Hash, Hash, Hash) = redis::pipe()
            .hgetall(self.keys.life(uuid))
            .hgetall(self.keys.plan_of(uuid, PlanKind::Birth))
            .hgetall(self.keys.plan_of(uuid, PlanKind::Death))
            .query_async(&mut conn)
            .await?;
        if life.is_empty() {
            return Ok(None);
        }
        let mut view = life_summary(uuid, &life);
        let plans: Vec<Value> = [(PlanKind::Birth, birth), (PlanKind::Death, death)]
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .map(|(kind, p)| self.plan_view(*kind, p))
            .collect();
        view.insert("plans".into(), Value::Array(plans));
        view.insert(
            "history".into(),
            Value::Array(self.history_view(&life, history_count)),
        );
        Ok(Some(Value::Object(view)))
    }

    fn plan_view(&self, kind: PlanKind, p: &HashMap<String, String>) -> Value {
        let mut out = Map::new();
        let text = |k: &str| p.get(k).cloned().map(Value::String).unwrap_or(Value::Null);
        let num = |k: &str| {
            p.get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .map(Value::from)
                .unwrap_or(Value::Null)
        };
        out.insert("kind".into(), Value::String(kind.as_str().into()));
        out.insert("state".into(), text("state"));
        out.insert("fire_at".into(), text("fire_at"));
        out.insert("fire_at_ms".into(), num("fire_at_ms"));
        out.insert("attempts".into(), num("attempts"));
        out.insert("last_status".into(), num("last_status"));
        out.insert("last_error".into(), text("last_error"));
        let next = match p.get("state").map(String::as_str) {
            Some("Standby") | Some("Preset") => {
                p.get("fire_at_ms").and_then(|v| v.parse::<i64>().ok())
            }
            _ => None,
        };
        out.insert(
            "next_attempt_at".into(),
            next.map(|ms| Value::String(self.fmt(ms)))
                .unwrap_or(Value::Null),
        );
        out.insert(
            "next_attempt_at_ms".into(),
            next.map(Value::from).unwrap_or(Value::Null),
        );
        if let (Some("Preset" | "Running"), Some(owner)) =
            (p.get("state").map(String::as_str), p.get("lease_owner"))
        {
            out.insert("held_by".into(), Value::String(owner.clone()));
        }
        out.insert(
            "action".into(),
            p.get("action")
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or(Value::Null),
        );
        Value::Object(out)
    }

    /// The run records kept in the Life hash (`run:{plan}:{attempt}`), newest first, with
    /// RFC 3339 times next to the epoch ms.
    fn history_view(&self, life: &HashMap<String, String>, count: usize) -> Vec<Value> {
        let mut runs: Vec<Map<String, Value>> = life
            .iter()
            .filter(|(field, _)| field.starts_with("run:"))
            .filter_map(|(_, record)| match serde_json::from_str(record) {
                Ok(Value::Object(map)) => Some(map),
                _ => None,
            })
            .collect();
        let started =
            |r: &Map<String, Value>| r.get("started_at").and_then(Value::as_i64).unwrap_or(0);
        runs.sort_by_key(|r| std::cmp::Reverse(started(r)));
        runs.truncate(count);
        runs.into_iter()
            .map(|mut run| {
                for name in ["should_run_at", "started_at"] {
                    if let Some(ms) = run.get(name).and_then(Value::as_i64) {
                        run.insert(format!("{name}_ms"), Value::from(ms));
                        run.insert(name.into(), Value::String(self.fmt(ms)));
                    }
                }
                Value::Object(run)
            })
            .collect()
    }

    /// Lists Lives by birth time with filters; returns the page and the next cursor.
    pub async fn list(
        &self,
        filter: &ListFilter,
    ) -> Result<(Vec<Value>, Option<String>), ApiError> {
        let mut conn = self.conn.clone();
        let min_member = match (&filter.cursor, filter.from_ms) {
            (Some(cursor), _) => format!("({cursor}"),
            (None, Some(from)) => format!("[{from:013}"),
            (None, None) => "-".to_string(),
        };
        let max_member = match filter.to_ms {
            Some(to) => format!("[{to:013}:\u{7f}"),
            None => "+".to_string(),
        };
        // Scan in batches until the page is full or the range is exhausted; a state filter
        // that matches few Lives may return a short page with a cursor to continue.
        let batch = (filter.limit * 2).clamp(16, 1000);
        let max_scanned = filter.limit.max(1) * 20;
        let mut scanned = 0usize;
        let mut page = Vec::new();
        let mut next_min = min_member;
        let mut last_member: Option<String> = None;
        let mut exhausted = false;

        // With a resource filter the candidates come from that resource's index, which is
        // small; without, from the lex index.
        let resource_members: Option<Vec<String>> = match &filter.resource_id {
            Some(rid) => {
                let items: Vec<(String, i64)> = conn
                    .zrange_withscores(self.keys.resource(rid), 0, -1)
                    .await?;
                let mut members: Vec<String> = items
                    .into_iter()
                    .map(|(id, ms)| lives_member(ms, &id))
                    .collect();
                members.sort();
                Some(members)
            }
            None => None,
        };

        while page.len() < filter.limit && scanned < max_scanned {
            let members: Vec<String> = match &resource_members {
                Some(all) => all
                    .iter()
                    .filter(|m| lex_in_range(m, &next_min, &max_member))
                    .take(batch)
                    .cloned()
                    .collect(),
                None => {
                    redis::cmd("ZRANGEBYLEX")
                        .arg(self.keys.lives())
                        .arg(&next_min)
                        .arg(&max_member)
                        .arg("LIMIT")
                        .arg(0)
                        .arg(batch)
                        .query_async(&mut conn)
                        .await?
                }
            };
            if members.is_empty() {
                exhausted = true;
                break;
            }
            let fetched = members.len();
            let uuid_of = |member: &str| {
                member
                    .split_once(':')
                    .map(|(_, u)| u.to_string())
                    .unwrap_or_default()
            };
            let mut pipe = redis::pipe();
            for member in &members {
                pipe.hgetall(self.keys.life(&uuid_of(member)));
            }
            let lives: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
            for (member, life) in members.into_iter().zip(lives) {
                scanned += 1;
                last_member = Some(member.clone());
                next_min = format!("({member}");
                if life.is_empty() {
                    continue;
                }
                if let Some(state) = &filter.state {
                    if life.get("state") != Some(state) {
                        continue;
                    }
                }
                page.push(Value::Object(life_summary(&uuid_of(&member), &life)));
                if page.len() == filter.limit {
                    break;
                }
            }
            if fetched < batch && page.len() < filter.limit {
                exhausted = true;
                break;
            }
        }
        let next_cursor = if exhausted { None } else { last_member };
        Ok((page, next_cursor))
    }

    // ---- firing engine ----

    /// Claims up to `limit` Plans due before `until_ms` (queue tasks: before
    /// `tasks_until_ms`) for `host`.
    pub async fn claim(
        &self,
        host: &str,
        until_ms: i64,
        limit: usize,
        heartbeat_deadline_ms: i64,
        tasks_until_ms: i64,
    ) -> redis::RedisResult<Vec<Claimed>> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        #[allow(clippy::type_complexity)]
        let rows: Vec<(String, String, String, String, String, String, String)> = self
            .scripts
            .claim
            .key(k.due())
            .key(k.held(host))
            .key(k.hosts())
            .key(k.due_tasks())
            .arg(&k.prefix)
            .arg(host)
            .arg(until_ms)
            .arg(limit)
            .arg(heartbeat_deadline_ms)
            .arg(tasks_until_ms)
            .invoke_async(&mut conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(
                |(plan_id, fire, claim, action, attempts, rid, opts)| Claimed {
                    plan_id,
                    fire_at_ms: fire.parse::<f64>().map(|f| f as i64).unwrap_or(0),
                    claim,
                    action,
                    attempts: attempts.parse().unwrap_or(0),
                    resource_id: (!rid.is_empty()).then_some(rid),
                    opts: if opts.is_empty() {
                        RunOpts::default()
                    } else {
                        serde_json::from_str(&opts).unwrap_or_default()
                    },
                },
            )
            .collect())
    }

    /// Fencing check and Preset -> Running for a batch (see `scripts/start_run.lua`).
    /// `plans` pairs each Plan with the expiry of its resource lock.
    pub async fn start_runs(
        &self,
        host: &str,
        plans: &[(&Claimed, u64)],
        now_ms: i64,
        birth_delay_limit_ms: i64,
    ) -> redis::RedisResult<Vec<StartOutcome>> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.start_run.prepare_invoke();
        invocation
            .key(k.held(host))
            .key(k.runs())
            .arg(&k.prefix)
            .arg(host)
            .arg(now_ms)
            .arg(birth_delay_limit_ms)
            .arg(self.runs_max_len);
        for (plan, lock_ttl_ms) in plans {
            invocation
                .arg(&plan.plan_id)
                .arg(&plan.claim)
                .arg(*lock_ttl_ms);
        }
        let reply: Vec<String> = invocation.invoke_async(&mut conn).await?;
        Ok(reply
            .iter()
            .map(|r| match r.as_str() {
                "busy" => StartOutcome::Busy,
                "invalidated" => StartOutcome::Invalidated,
                "deferred" => StartOutcome::Deferred,
                other if other.starts_with("wait:") => StartOutcome::Wait {
                    retry_in_ms: other[5..].parse().unwrap_or(50),
                },
                other => match other.strip_prefix("run:").and_then(|a| a.parse().ok()) {
                    Some(attempts) => StartOutcome::Run { attempts },
                    None => StartOutcome::Lost,
                },
            })
            .collect())
    }

    /// Records a batch of runs and moves the state machines on (see
    /// `scripts/finish_run.lua`). Returns per run whether this host still held the Plan.
    pub async fn finish_runs(
        &self,
        host: &str,
        runs: &[FinishedRun],
        now_ms: i64,
        notify_before_ms: i64,
    ) -> redis::RedisResult<Vec<bool>> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.finish_run.prepare_invoke();
        invocation
            .key(k.held(host))
            .key(k.due())
            .key(k.runs())
            .arg(&k.prefix)
            .arg(host)
            .arg(now_ms)
            .arg(self.fmt(now_ms))
            .arg(notify_before_ms)
            .arg(self.runs_max_len);
        for run in runs {
            let (outcome, next_ms) = match run.outcome {
                RunOutcome::Done => ("done", now_ms),
                RunOutcome::Retry { next_ms } => ("retry", next_ms),
                RunOutcome::Failed => ("failed", now_ms),
            };
            let r = &run.record;
            let kind = run
                .plan
                .life_and_kind()
                .map(|(_, k)| k.as_str())
                .unwrap_or("birth");
            let record = run_record_json(host, kind, r);
            // The RFC 3339 form is needed only where the script writes a new fire time.
            let next_rfc = if matches!(run.outcome, RunOutcome::Retry { .. }) {
                self.fmt(next_ms)
            } else {
                String::new()
            };
            invocation
                .arg(&run.plan.plan_id)
                .arg(&run.plan.claim)
                .arg(outcome)
                .arg(next_ms)
                .arg(next_rfc)
                .arg(r.status.map(|s| s.to_string()).unwrap_or_default())
                .arg(r.error.as_deref().unwrap_or(""))
                .arg(r.attempt)
                .arg(r.outcome)
                .arg(record.to_string());
        }
        let reply: Vec<String> = invocation.invoke_async(&mut conn).await?;
        Ok(reply.iter().map(|r| r == "ok").collect())
    }

    /// Renews this host's lease on every Plan it holds.
    pub async fn heartbeat(&self, host: &str, deadline_ms: i64) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        conn.zadd::<_, _, _, ()>(self.keys.hosts(), host, deadline_ms)
            .await
    }

    /// Hosts whose lease ran out before `now_ms`.
    pub async fn expired_hosts(&self, now_ms: i64) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.conn.clone();
        conn.zrangebyscore(self.keys.hosts(), "-inf", now_ms).await
    }

    /// Puts up to `batch` Plans held by `host` back into the due set. `expired_before_ms`
    /// is Some for a supervisor acting on a dead host (nothing happens if it renewed its
    /// lease), None for a host handing back its own. Returns (moved, left).
    pub async fn reclaim(
        &self,
        host: &str,
        batch: usize,
        expired_before_ms: Option<i64>,
        notify_before_ms: i64,
    ) -> redis::RedisResult<(i64, i64)> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        self.scripts
            .reclaim
            .key(k.hosts())
            .key(k.held(host))
            .key(k.due())
            .arg(&k.prefix)
            .arg(host)
            .arg(batch)
            .arg(expired_before_ms.map(|m| m.to_string()).unwrap_or_default())
            .arg(notify_before_ms)
            .invoke_async(&mut conn)
            .await
    }

    /// Plans waiting in the due sets (queue tasks included), and hosts whose lease is
    /// current at `now_ms`.
    pub async fn cluster_stats(&self, now_ms: i64) -> redis::RedisResult<(i64, i64)> {
        let mut conn = self.conn.clone();
        let (due, due_tasks, hosts): (i64, i64, i64) = redis::pipe()
            .zcard(self.keys.due())
            .zcard(self.keys.due_tasks())
            .zcount(self.keys.hosts(), now_ms, "+inf")
            .query_async(&mut conn)
            .await?;
        Ok((due + due_tasks, hosts))
    }

    /// Plans `host` holds with a fire time before `before_ms` (at most `limit`).
    pub async fn held_due_before(
        &self,
        host: &str,
        before_ms: i64,
        limit: usize,
    ) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.conn.clone();
        redis::cmd("ZRANGEBYSCORE")
            .arg(self.keys.held(host))
            .arg("-inf")
            .arg(before_ms)
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await
    }

    /// Hands named Plans held by `host` back to the due set (a Running one only if it
    /// started before `running_before_ms`); returns how many moved.
    pub async fn release(
        &self,
        host: &str,
        plan_ids: &[String],
        notify_before_ms: i64,
        running_before_ms: i64,
    ) -> redis::RedisResult<i64> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        let mut invocation = self.scripts.release.prepare_invoke();
        invocation
            .key(k.held(host))
            .arg(&k.prefix)
            .arg(host)
            .arg(notify_before_ms)
            .arg(running_before_ms);
        for id in plan_ids {
            invocation.arg(id);
        }
        invocation.invoke_async(&mut conn).await
    }

    /// Deletes up to `batch` Lives finished before `cutoff_ms`; returns how many.
    pub async fn sweep(&self, cutoff_ms: i64, batch: usize) -> redis::RedisResult<i64> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        self.scripts
            .sweep
            .key(k.finished())
            .key(k.lives())
            .key(k.runs())
            .arg(&k.prefix)
            .arg(cutoff_ms)
            .arg(batch)
            .invoke_async(&mut conn)
            .await
    }
}

/// A run as written to history: the same JSON for Lives, timers and tasks.
pub(crate) fn run_record_json(host: &str, plan: &str, r: &RunRecord) -> Value {
    let mut record = json!({
        "plan": plan,
        "attempt": r.attempt,
        "should_run_at": r.should_run_at_ms,
        "started_at": r.started_at_ms,
        "duration_ms": r.duration_ms,
        "host": host,
        "outcome": r.outcome,
    });
    if let Some(status) = r.status {
        record["status"] = Value::from(status);
    }
    if let Some(error) = &r.error {
        record["error"] = Value::from(error.as_str());
    }
    if let Some(output) = &r.output {
        record["output"] = output.clone();
    }
    if !r.logs.is_empty() {
        record["logs"] = json!(r.logs);
    }
    record
}

fn conflict_error(rid: &str, other: Option<&String>) -> ApiError {
    ApiError::conflict(
        "resource_conflict",
        format!(
            "resource `{rid}` is booked by Life `{}` within execution_delay_guard_time of these times",
            other.map(String::as_str).unwrap_or("?")
        ),
    )
}

/// Whether `member` lies within a ZRANGEBYLEX-style range (`-`, `+`, `[x`, `(x`).
fn lex_in_range(member: &str, min: &str, max: &str) -> bool {
    let above = match min {
        "-" => true,
        _ if min.starts_with('(') => member > &min[1..],
        _ => member >= min.trim_start_matches('['),
    };
    let below = match max {
        "+" => true,
        _ if max.starts_with('(') => member < &max[1..],
        _ => member <= max.trim_start_matches('['),
    };
    above && below
}

/// The fields of a Life common to the list and the detail view.
fn life_summary(uuid: &str, life: &HashMap<String, String>) -> Map<String, Value> {
    let mut out = Map::new();
    let text = |k: &str| {
        life.get(k)
            .cloned()
            .map(Value::String)
            .unwrap_or(Value::Null)
    };
    let num = |k: &str| {
        life.get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .map(Value::from)
            .unwrap_or(Value::Null)
    };
    out.insert("life_uuid".into(), Value::String(uuid.to_string()));
    out.insert("schedule_type".into(), text("schedule_type"));
    out.insert("state".into(), text("state"));
    out.insert("resource_id".into(), text("resource_id"));
    out.insert("birth_time".into(), text("birth_at"));
    out.insert("birth_time_ms".into(), num("birth_at_ms"));
    out.insert("death_time".into(), text("death_at"));
    out.insert("death_time_ms".into(), num("death_at_ms"));
    out.insert("created_at".into(), text("created_at"));
    out.insert("updated_at_ms".into(), num("updated_at_ms"));
    if life.contains_key("finished_at_ms") {
        out.insert("finished_at_ms".into(), num("finished_at_ms"));
    }
    if life.get("cancel_requested").map(String::as_str) == Some("1") {
        out.insert("cancel_requested".into(), Value::Bool(true));
    }
    out
}

/// A JSON summary of a freshly booked Life, for the POST response.
pub fn booked_view(life: &NewLife, tz: Tz) -> Value {
    json!({
        "life_uuid": life.life_uuid,
        "schedule_type": life.schedule_type.as_str(),
        "state": "Inexistent",
        "resource_id": life.resource_id,
        "birth_time": rfc3339(life.birth_at_ms, tz),
        "birth_time_ms": life.birth_at_ms,
        "death_time": life.death_at_ms.map(|m| rfc3339(m, tz)),
        "death_time_ms": life.death_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lives_members_sort_by_time() {
        let a = lives_member(999, "zz");
        let b = lives_member(1_765_811_100_000, "aa");
        assert!(a < b);
        assert_eq!(b, "1765811100000:aa");
        assert!(lex_in_range(&b, "(0000000000999:zz", "+"));
        assert!(!lex_in_range(&a, "(0000000000999:zz", "+"));
        assert!(lex_in_range(&b, "[1765811100000", "[1765811100000:\u{7f}"));
    }

    #[test]
    fn plan_ids_say_whose_plan_it_is() {
        let claimed = |id: &str| Claimed {
            plan_id: id.into(),
            fire_at_ms: 0,
            claim: "1".into(),
            action: String::new(),
            attempts: 0,
            resource_id: None,
            opts: RunOpts::default(),
        };
        assert_eq!(
            claimed("6f69:death").owner(),
            Some(Owner::Life("6f69", PlanKind::Death))
        );
        assert_eq!(
            claimed("nightly-report:timer").owner(),
            Some(Owner::Timer("nightly-report"))
        );
        assert_eq!(
            claimed("mail/welcome-42:task").owner(),
            Some(Owner::Task {
                queue: "mail",
                task: "welcome-42"
            })
        );
        assert_eq!(claimed("x:sideways").owner(), None);
        assert_eq!(claimed("no-slash:task").owner(), None);
    }

    #[test]
    fn rfc3339_uses_the_zone() {
        assert_eq!(rfc3339(0, chrono_tz::UTC), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(1500, chrono_tz::Asia::Tokyo),
            "1970-01-01T09:00:01.500+09:00"
        );
    }
}
