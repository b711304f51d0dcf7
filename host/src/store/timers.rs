//! Timers in Redis (SPEC section 5): the definition hash `timer:{name}`, its one Plan
//! `plan:{name}:timer`, the `timers` index and the runs list `timer:{name}:runs`.
//! The Plan goes through the same `due` set, claims, leases and `start_run` fence as a
//! Life's; `finish_timer.lua` schedules the next slot.

use std::collections::HashMap;

use redis::AsyncCommands;
use serde_json::Value;

use super::Store;
use crate::error::ApiError;

/// Runs kept in a timer's runs list (skip records included).
pub const TIMER_RUNS_KEPT: usize = 200;

/// A timer as listed: its name, its hash and its Plan's hash.
pub type TimerEntry = (String, HashMap<String, String>, HashMap<String, String>);

/// `schedule`, `timezone`, `version` and `dialect` of a timer hash.
type TimerFinishFields = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The timer hash fields of its run policy (misfire, overlap, deadline, exclusions).
const TIMER_POLICY_FIELDS: [&str; 6] = [
    "misfire",
    "catch_up_limit",
    "catch_up_window_ms",
    "overlap",
    "starting_deadline_ms",
    "exclude_dates",
];

/// A timer's schedule as the finisher reads it to choose the next slot.
#[derive(Debug, Clone)]
pub struct TimerSlot {
    pub schedule: String,
    /// `unix`, or None for a schedule written before the unix dialect.
    pub dialect: Option<String>,
    pub timezone: String,
    pub version: String,
    /// The slot the run just recorded was for.
    pub slot_ms: Option<i64>,
    /// The timer's hash fields of its run policy (see `timers::TimerPolicy`).
    pub policy: HashMap<String, String>,
    /// Late runs of the catch-up under way, this one included; 0 when none is.
    pub catch_up_runs: u32,
}

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
    /// The slot the next run stands for, when it is not its fire time: a catch-up run
    /// of a missed slot, or a buffered overlapping one, fired at once.
    pub next_slot_ms: Option<i64>,
    /// Late runs of the catch-up under way, the next one included (`fire_all`); 0 when
    /// the next run is an ordinary slot.
    pub catch_up_runs: u32,
    pub version: &'a str,
    pub record: String,
    pub skips: Vec<String>,
    /// The callback to book with this run's outcome (see `store::Callback`).
    pub callback: Option<super::Callback>,
}

impl Store {
    /// The keys of the shard timer `name` lives in.
    pub(crate) fn timer_keys(&self, name: &str) -> &super::ShardKeys {
        self.shard(self.placement.timer(name))
    }

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
        if create {
            self.memory.check_room(self.placement.timer(name))?;
        }
        let k = self.timer_keys(name);
        let (next_ms, next_rfc) = match next {
            NextRun::At(ms, rfc) => (ms.to_string(), rfc.clone()),
            NextRun::Keep => ("keep".to_string(), String::new()),
            NextRun::Nothing => (String::new(), String::new()),
        };
        let mut invocation = self.scripts.timer_put.prepare_invoke();
        invocation
            .key(k.timer(name))
            .key(k.timer_plan(name))
            .key(k.timers_due())
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
        let mut conn = self.conn();
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
        let mut conn = self.conn();
        let (timer, plan): (HashMap<String, String>, HashMap<String, String>) = redis::pipe()
            .hgetall(self.timer_keys(name).timer(name))
            .hgetall(self.timer_keys(name).timer_plan(name))
            .query_async(&mut conn)
            .await?;
        Ok((!timer.is_empty()).then_some((timer, plan)))
    }

    /// Every timer (hash and Plan hash), by name, from every shard.
    pub async fn timer_list(&self) -> Result<Vec<TimerEntry>, ApiError> {
        Ok(self.timer_page(None, usize::MAX).await?.0)
    }

    /// A page of timers by name: the first `limit` after `after` (all shards merged),
    /// and the name to go on after when there are more. Each shard is asked for at
    /// most `limit + 1` names (one more tells whether it has more), so a page costs the
    /// same however many timers there are.
    pub async fn timer_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<TimerEntry>, Option<String>), ApiError> {
        let min = match after {
            Some(name) => format!("({name}"),
            None => "-".to_string(),
        };
        let reads = (0..self.shard_count()).map(|shard| {
            let mut conn = self.conn();
            let k = self.shard(shard);
            let min = min.clone();
            async move {
                let names: Vec<String> = redis::cmd("ZRANGEBYLEX")
                    .arg(k.timers())
                    .arg(&min)
                    .arg("+")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit.saturating_add(1).min(i64::MAX as usize) as i64)
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>((shard, names))
            }
        });
        let mut names: Vec<(String, u32)> = futures_util::future::try_join_all(reads)
            .await?
            .into_iter()
            .flat_map(|(shard, names)| names.into_iter().map(move |n| (n, shard)))
            .collect();
        names.sort();
        let more = names.len() > limit;
        names.truncate(limit);
        let next = if more {
            names.last().map(|(n, _)| n.clone())
        } else {
            None
        };
        let mut by_shard: HashMap<u32, Vec<String>> = HashMap::new();
        for (name, shard) in names {
            by_shard.entry(shard).or_default().push(name);
        }
        let reads = by_shard.into_iter().map(|(shard, names)| {
            let mut conn = self.conn();
            let k = self.shard(shard);
            async move {
                if names.is_empty() {
                    return Ok::<_, redis::RedisError>(Vec::new());
                }
                let mut pipe = redis::pipe();
                for name in &names {
                    pipe.hgetall(k.timer(name)).hgetall(k.timer_plan(name));
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
        });
        let mut all: Vec<_> = futures_util::future::try_join_all(reads)
            .await?
            .into_iter()
            .flatten()
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok((all, next))
    }

    /// Fires a timer now (`POST /timers/{name}/run`): 'ok' | 'missing' | 'running'.
    pub async fn timer_run_now(
        &self,
        name: &str,
        now_ms: i64,
        notify_before_ms: i64,
    ) -> Result<String, ApiError> {
        let k = self.timer_keys(name);
        let mut conn = self.conn();
        Ok(self
            .scripts
            .timer_run
            .key(k.timer(name))
            .key(k.timer_plan(name))
            .key(k.timers_due())
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
        let k = self.timer_keys(name);
        let mut conn = self.conn();
        let reply: String = self
            .scripts
            .timer_delete
            .key(k.timer(name))
            .key(k.timer_plan(name))
            .key(k.timers_due())
            .key(k.timers())
            .key(k.timer_runs(name))
            .arg(&k.prefix)
            .arg(name)
            .invoke_async(&mut conn)
            .await?;
        Ok(reply == "ok")
    }

    /// Rewrites a timer's schedule from an earlier dialect (`scripts/timer_dialect.lua`):
    /// true when this call rewrote it.
    pub async fn timer_rewrite_dialect(
        &self,
        name: &str,
        old: &str,
        new: &str,
        dialect: &str,
    ) -> Result<bool, ApiError> {
        let mut conn = self.conn();
        let done: i64 = self
            .scripts
            .timer_dialect
            .key(self.timer_keys(name).timer(name))
            .arg(&self.timer_keys(name).prefix)
            .arg(old)
            .arg(new)
            .arg(dialect)
            .invoke_async(&mut conn)
            .await?;
        Ok(done == 1)
    }

    /// The newest `limit` entries of a timer's runs list.
    pub async fn timer_runs(&self, name: &str, limit: usize) -> Result<Vec<Value>, ApiError> {
        let mut conn = self.conn();
        let items: Vec<String> = conn
            .lrange(
                self.timer_keys(name).timer_runs(name),
                0,
                limit as isize - 1,
            )
            .await?;
        Ok(items
            .iter()
            .filter_map(|i| serde_json::from_str(i).ok())
            .collect())
    }

    /// What the finisher needs to compute a timer's next slot. None when the timer is
    /// gone.
    pub async fn timer_for_finish(&self, name: &str) -> redis::RedisResult<Option<TimerSlot>> {
        let mut conn = self.conn();
        let (def, policy, slot): (TimerFinishFields, Vec<Option<String>>, Option<String>) =
            redis::pipe()
                .cmd("HMGET")
                .arg(self.timer_keys(name).timer(name))
                .arg("schedule")
                .arg("timezone")
                .arg("version")
                .arg("dialect")
                .cmd("HMGET")
                .arg(self.timer_keys(name).timer(name))
                .arg(&TIMER_POLICY_FIELDS[..])
                .arg("catch_up_runs")
                .hget(self.timer_keys(name).timer_plan(name), "slot_ms")
                .query_async(&mut conn)
                .await?;
        let mut policy: HashMap<String, String> = TIMER_POLICY_FIELDS
            .iter()
            .chain(["catch_up_runs"].iter())
            .zip(policy)
            .filter_map(|(k, v)| Some((k.to_string(), v?)))
            .collect();
        let catch_up_runs = policy
            .remove("catch_up_runs")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Ok(match def {
            (Some(schedule), Some(timezone), version, dialect) => Some(TimerSlot {
                schedule,
                dialect,
                timezone,
                version: version.unwrap_or_else(|| "0".into()),
                slot_ms: slot.and_then(|s| s.parse().ok()),
                policy,
                catch_up_runs,
            }),
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
        let k = self.timer_keys(run.name);
        let (next_ms, next_rfc) = match &run.next {
            Some((ms, rfc)) => (ms.to_string(), rfc.clone()),
            None => (String::new(), String::new()),
        };
        let mut invocation = self.scripts.finish_timer.prepare_invoke();
        invocation
            .key(k.held())
            .key(k.timers_due())
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
            .arg(TIMER_RUNS_KEPT)
            .arg(
                run.next_slot_ms
                    .map(|ms| ms.to_string())
                    .unwrap_or_default(),
            )
            .arg(run.catch_up_runs);
        let plan_id = format!("{}:timer", run.name);
        let (callback, record) = super::Callback::args(&run.callback, &plan_id, now_ms);
        invocation.arg(callback).arg(record).arg(self.fmt(now_ms));
        for skip in &run.skips {
            invocation.arg(skip);
        }
        let mut conn = self.conn();
        invocation.invoke_async(&mut conn).await
    }
}
