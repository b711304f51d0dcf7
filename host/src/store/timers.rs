//! Timers in Redis (SPEC section 5): the definition hash `timer:{name}`, its one Plan
//! `plan:{name}:timer`, the `timers` index and the runs list `timer:{name}:runs`.
//! The Plan goes through the same `due` set, claims, leases and `start_run` fence as a
//! Life's; `finish_timer.lua` schedules the next slot.

use std::collections::HashMap;

use redis::AsyncCommands;
use serde_json::Value;

use super::{Keys, Store};
use crate::error::ApiError;

/// Runs kept in a timer's runs list (skip records included).
pub const TIMER_RUNS_KEPT: usize = 200;

impl Keys {
    pub fn timer(&self, name: &str) -> String {
        format!("{}timer:{name}", self.prefix)
    }
    pub fn timer_plan(&self, name: &str) -> String {
        format!("{}plan:{name}:timer", self.prefix)
    }
    pub fn timer_runs(&self, name: &str) -> String {
        format!("{}timer:{name}:runs", self.prefix)
    }
    pub fn timers(&self) -> String {
        format!("{}timers", self.prefix)
    }
}

/// `schedule`, `timezone` and `version` of a timer hash.
type TimerFinishFields = (Option<String>, Option<String>, Option<String>);

/// When a timer's Plan should fire after a `timer_put`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextRun {
    /// At this time (ms, RFC 3339).
    At(i64, String),
    /// Leave the Plan's fire time as it is (the change does not move the schedule).
    Keep,
    /// Nothing scheduled: the timer is inactive or never fires again.
    Nothing,
}

/// What `timer_put` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimerPut {
    /// Written; the Plan's state afterwards.
    Ok(String),
    Duplicate,
    Missing,
    /// The timer's version moved since it was read: read again and retry.
    Changed,
}

/// What one timer run's recording needs besides the run itself.
#[derive(Debug, Clone)]
pub struct TimerFinish<'a> {
    pub name: &'a str,
    pub claim: &'a str,
    /// `done`, `retry` or `failed`.
    pub outcome: &'a str,
    pub next: Option<(i64, String)>,
    pub version: &'a str,
    pub record: String,
    pub skips: Vec<String>,
}

impl Store {
    /// Creates (`create`) or changes (`update`, at `version`) a timer. `fields` are the
    /// definition's field/value pairs for the timer hash.
    #[allow(clippy::too_many_arguments)]
    pub async fn timer_put(
        &self,
        name: &str,
        create: bool,
        version: &str,
        next: &NextRun,
        next_explicit: bool,
        action_json: &str,
        opts_json: &str,
        now_ms: i64,
        notify_before_ms: i64,
        fields: &[(String, String)],
    ) -> Result<TimerPut, ApiError> {
        let k = &self.keys;
        let (next_ms, next_rfc) = match next {
            NextRun::At(ms, rfc) => (ms.to_string(), rfc.clone()),
            NextRun::Keep => ("keep".to_string(), String::new()),
            NextRun::Nothing => (String::new(), String::new()),
        };
        let mut invocation = self.scripts.timer_put.prepare_invoke();
        invocation
            .key(k.timer(name))
            .key(k.timer_plan(name))
            .key(k.due())
            .key(k.timers())
            .arg(&k.prefix)
            .arg(name)
            .arg(if create { "create" } else { "update" })
            .arg(version)
            .arg(next_ms)
            .arg(next_rfc)
            .arg(if next_explicit { "1" } else { "0" })
            .arg(action_json)
            .arg(opts_json)
            .arg(now_ms)
            .arg(notify_before_ms);
        for (field, value) in fields {
            invocation.arg(field).arg(value);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<String> = invocation.invoke_async(&mut conn).await?;
        Ok(match reply.first().map(String::as_str) {
            Some("ok") => TimerPut::Ok(reply.get(1).cloned().unwrap_or_default()),
            Some("duplicate") => TimerPut::Duplicate,
            Some("missing") => TimerPut::Missing,
            _ => TimerPut::Changed,
        })
    }

    /// The timer hash and its Plan hash; None when there is no such timer.
    pub async fn timer_load(
        &self,
        name: &str,
    ) -> Result<Option<(HashMap<String, String>, HashMap<String, String>)>, ApiError> {
        let mut conn = self.conn.clone();
        let (timer, plan): (HashMap<String, String>, HashMap<String, String>) = redis::pipe()
            .hgetall(self.keys.timer(name))
            .hgetall(self.keys.timer_plan(name))
            .query_async(&mut conn)
            .await?;
        Ok((!timer.is_empty()).then_some((timer, plan)))
    }

    /// Every timer (hash and Plan hash), by name.
    pub async fn timer_list(
        &self,
    ) -> Result<Vec<(String, HashMap<String, String>, HashMap<String, String>)>, ApiError> {
        let mut conn = self.conn.clone();
        let names: Vec<String> = conn.zrange(self.keys.timers(), 0, -1).await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.hgetall(self.keys.timer(name))
                .hgetall(self.keys.timer_plan(name));
        }
        let hashes: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
        let mut out = Vec::new();
        let mut it = hashes.into_iter();
        for name in names {
            let (Some(timer), Some(plan)) = (it.next(), it.next()) else {
                break;
            };
            if !timer.is_empty() {
                out.push((name, timer, plan));
            }
        }
        Ok(out)
    }

    /// Fires a timer now (`POST /timers/{name}/run`): 'ok' | 'missing' | 'running'.
    pub async fn timer_run_now(
        &self,
        name: &str,
        now_ms: i64,
        notify_before_ms: i64,
    ) -> Result<String, ApiError> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        Ok(self
            .scripts
            .timer_run
            .key(k.timer(name))
            .key(k.timer_plan(name))
            .key(k.due())
            .arg(&k.prefix)
            .arg(name)
            .arg(now_ms)
            .arg(self.fmt(now_ms))
            .arg(notify_before_ms)
            .invoke_async(&mut conn)
            .await?)
    }

    /// Deletes a timer; false when there was none.
    pub async fn timer_delete(&self, name: &str) -> Result<bool, ApiError> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        let reply: String = self
            .scripts
            .timer_delete
            .key(k.timer(name))
            .key(k.timer_plan(name))
            .key(k.due())
            .key(k.timers())
            .key(k.timer_runs(name))
            .arg(&k.prefix)
            .arg(name)
            .invoke_async(&mut conn)
            .await?;
        Ok(reply == "ok")
    }

    /// The newest `limit` entries of a timer's runs list.
    pub async fn timer_runs(&self, name: &str, limit: usize) -> Result<Vec<Value>, ApiError> {
        let mut conn = self.conn.clone();
        let items: Vec<String> = conn
            .lrange(self.keys.timer_runs(name), 0, limit as isize - 1)
            .await?;
        Ok(items
            .iter()
            .filter_map(|i| serde_json::from_str(i).ok())
            .collect())
    }

    /// What the finisher needs to compute a timer's next slot: `schedule`, `timezone`,
    /// `version`, and the Plan's `slot_ms`. None when the timer is gone.
    pub async fn timer_for_finish(
        &self,
        name: &str,
    ) -> redis::RedisResult<Option<(String, String, String, Option<i64>)>> {
        let mut conn = self.conn.clone();
        let (def, slot): (TimerFinishFields, Option<String>) = redis::pipe()
            .cmd("HMGET")
            .arg(self.keys.timer(name))
            .arg("schedule")
            .arg("timezone")
            .arg("version")
            .hget(self.keys.timer_plan(name), "slot_ms")
            .query_async(&mut conn)
            .await?;
        Ok(match def {
            (Some(schedule), Some(timezone), version) => Some((
                schedule,
                timezone,
                version.unwrap_or_else(|| "0".into()),
                slot.and_then(|s| s.parse().ok()),
            )),
            _ => None,
        })
    }

    /// Records one timer run and schedules what follows (`scripts/finish_timer.lua`):
    /// 'ok' | 'lost' | 'changed'.
    pub async fn finish_timer(
        &self,
        host: &str,
        run: &TimerFinish<'_>,
        now_ms: i64,
        notify_before_ms: i64,
    ) -> redis::RedisResult<String> {
        let k = &self.keys;
        let (next_ms, next_rfc) = match &run.next {
            Some((ms, rfc)) => (ms.to_string(), rfc.clone()),
            None => (String::new(), String::new()),
        };
        let mut invocation = self.scripts.finish_timer.prepare_invoke();
        invocation
            .key(k.held(host))
            .key(k.due())
            .key(k.runs())
            .key(k.timer(run.name))
            .key(k.timer_plan(run.name))
            .key(k.timer_runs(run.name))
            .arg(&k.prefix)
            .arg(host)
            .arg(run.name)
            .arg(run.claim)
            .arg(run.outcome)
            .arg(next_ms)
            .arg(next_rfc)
            .arg(run.version)
            .arg(&run.record)
            .arg(now_ms)
            .arg(notify_before_ms)
            .arg(self.runs_max_len)
            .arg(TIMER_RUNS_KEPT);
        for skip in &run.skips {
            invocation.arg(skip);
        }
        let mut conn = self.conn.clone();
        invocation.invoke_async(&mut conn).await
    }
}
