//! The hot path of firing: claim, start and finish, and what they carry.
//!
//! - `claim`: a Life's Plans come off the shard's due tree into `inflight` with their
//!   Life's record; timers' and tasks' off their due sets into `held` (`scripts/claim.lua`).
//! - `start_runs`: the fence before any action runs (`scripts/start_run.lua`).
//! - `finish_lives`: a batch of Life runs recorded, each Life's new record built here from
//!   the one it was claimed with (`lifecycle.rs`), written only under the run's claim
//!   (`scripts/finish_life.lua`). Timers and tasks have their own finish scripts
//!   (timers.rs, queues.rs).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::lifecycle::{self, Ended};
use super::outcome::Outcome;
use super::record::{LifeRecord, RunEntry};
use super::Store;
use crate::model::{LifeState, PlanKind, RunOpts};

/// How many times a batch's runs whose Lives changed meanwhile are built again.
const FINISH_TRIES: usize = 5;

/// A Plan claimed into a host's memory, with what is needed to fire it.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub plan_id: String,
    /// The shard the Plan is in.
    pub shard: u32,
    pub fire_at_ms: i64,
    /// Fencing token: the Plan's claim counter when this host claimed it.
    pub claim: String,
    pub action: String,
    pub attempts: u32,
    pub resource_id: Option<String>,
    /// A timer's priority, retries and timeout (default for Lives and tasks).
    pub opts: RunOpts,
    /// A Life's record as it was claimed: its finish writes the record that follows
    /// from it (`lifecycle::after_run`). None for timers and tasks.
    pub record: Option<Arc<LifeRecord>>,
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
    /// An earlier Plan of the same resource is unfinished: try again shortly.
    Busy,
    /// A birth missed by more than birth_delay_limit_time, by so many ms: nothing runs,
    /// and the host records it Invalidated (`RunOutcome::Invalidated`).
    Late(i64),
    /// A queue task its queue does not admit yet (paused, full, or out of tokens): it
    /// waits in Redis (the queue's waiting set, or `due_tasks`); drop it.
    Deferred,
    /// A queue task whose first attempt missed its `expire_after`: recorded as Expired in
    /// its queue's failed list, nothing to run.
    Dropped,
    /// This host's lease ran out: renew it, then try again (the Plan may have been taken
    /// over meanwhile, which the next try finds out).
    Expired,
}

/// One shard's Plans in a call of `start_run.lua`, started under this host's lease
/// generation `gen` on the shard.
pub struct StartSection<'a> {
    pub shard: u32,
    pub gen: u64,
    pub plans: Vec<&'a Claimed>,
}

/// One answer of `start_run.lua`.
fn start_outcome(word: &str) -> StartOutcome {
    match word {
        "busy" => StartOutcome::Busy,
        "deferred" => StartOutcome::Deferred,
        "dropped" => StartOutcome::Dropped,
        "expired" => StartOutcome::Expired,
        other => {
            if let Some(late) = other.strip_prefix("late:").and_then(|ms| ms.parse().ok()) {
                return StartOutcome::Late(late);
            }
            match other.strip_prefix("run:").and_then(|a| a.parse().ok()) {
                Some(attempts) => StartOutcome::Run { attempts },
                None => StartOutcome::Lost,
            }
        }
    }
}

/// How a run ended, as the finish scripts record it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    Done,
    Retry {
        next_ms: i64,
    },
    Failed,
    /// A Life's birth that came too late to run (`StartOutcome::Late`).
    Invalidated,
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
    /// The target's `Retry-After`, in ms, when it set the next attempt's time.
    pub retry_after_ms: Option<u64>,
}

/// A run whose outcome is to be recorded.
#[derive(Debug, Clone)]
pub struct FinishedRun {
    pub plan: Claimed,
    pub outcome: RunOutcome,
    pub record: RunRecord,
    /// The callback to book with the outcome, when the run finished its Plan for good
    /// and its action has one for that outcome.
    pub callback: Option<Callback>,
}

/// A callback Life booked by a finish script (`book_callback` in `common.lua`).
#[derive(Debug, Clone, PartialEq)]
pub struct Callback {
    /// A fresh id whose home is the shard of the finished Plan.
    pub life_uuid: String,
    /// The callback action, the outcome in its body or input.
    pub action_json: String,
}

impl Callback {
    /// The callback's Life: a point Life due at `now_ms`, reporting on `of` (a Plan id).
    fn record(&self, of: &str, now_ms: i64) -> Option<(LifeRecord, Vec<String>)> {
        let action: crate::model::Action = serde_json::from_str(&self.action_json).ok()?;
        let life = crate::model::NewLife {
            life_uuid: self.life_uuid.clone(),
            schedule_type: crate::model::ScheduleType::Point,
            resource_id: None,
            birth_at_ms: now_ms,
            death_at_ms: None,
            birth_action: action,
            death_action: None,
        };
        let mut record = lifecycle::booked(&life, now_ms);
        record.callback_of = Some(of.to_string());
        let plugins = super::lives::plugin_names(&[Some(&record.birth_action)]);
        Some((record, plugins))
    }
}

impl Callback {
    /// The two script arguments of a timer's or a task's run's callback, reporting on
    /// Plan `of` (`book_callback_record` in common.lua): its id and its Life's record, or
    /// two ''.
    pub(crate) fn args(callback: &Option<Callback>, of: &str, now_ms: i64) -> (String, String) {
        match callback
            .as_ref()
            .and_then(|c| Some((c, c.record(of, now_ms)?)))
        {
            Some((c, (record, _))) => (c.life_uuid.clone(), record.to_json()),
            None => (String::new(), String::new()),
        }
    }
}

/// What a `claim` call got.
#[derive(Debug)]
pub enum ClaimReply {
    Claimed {
        plans: Vec<Claimed>,
        /// When the shard's first task left in `due_tasks` is due.
        next_task_ms: Option<i64>,
    },
    /// The shard is another host's now.
    Lost,
    /// This host's lease on the shard ran out: renew, then claim.
    Expired,
}

impl Store {
    /// Claims up to `limit` Plans of `shard` due before `until_ms` (queue tasks: before
    /// `tasks_until_ms`) for `host` under generation `gen`.
    #[allow(clippy::too_many_arguments)]
    pub async fn claim(
        &self,
        shard: u32,
        host: &str,
        gen: u64,
        until_ms: i64,
        limit: usize,
        tasks_until_ms: i64,
        task_limit: usize,
    ) -> redis::RedisResult<ClaimReply> {
        let k = self.shard(shard);
        // A Life's Plans come as one flat list, three values each (a nested row costs
        // Redis more to send), their records read after (`claimed_records`); timers'
        // and tasks' Plans as rows of seven.
        type Reply = (String, Vec<String>, Vec<Vec<String>>, String, u64);
        let (word, lives, rows, next_task, buckets): Reply = self
            .scripts
            .claim
            .key(k.due())
            .key(k.held())
            .key(k.owner())
            .key(k.due_tasks())
            .key(k.claim_seq())
            .key(k.timers_due())
            .key(k.inflight())
            .arg(&k.prefix)
            .arg(host)
            .arg(gen)
            .arg(until_ms)
            .arg(limit)
            .arg(tasks_until_ms)
            .arg(task_limit)
            .invoke_async(&mut self.conn())
            .await?;
        match word.as_str() {
            "lost" => return Ok(ClaimReply::Lost),
            "expired" => return Ok(ClaimReply::Expired),
            _ => {}
        }
        let mut plans: Vec<Claimed> = Vec::with_capacity(lives.len() / 3 + rows.len());
        let mut lives = lives.into_iter();
        let mut claimed = Vec::with_capacity(lives.len() / 3);
        while let (Some(plan_id), Some(fire), Some(claim)) =
            (lives.next(), lives.next(), lives.next())
        {
            claimed.push((plan_id, fire, claim));
        }
        let payloads = self.claimed_records(shard, &claimed, buckets).await?;
        for ((plan_id, fire, claim), payload) in claimed.into_iter().zip(payloads) {
            // A Life's Plan: fired from its record. One whose Life is gone (a stale
            // member of the due tree) is left held: the audit hands it back, and
            // release.lua drops it for want of a record.
            let Some(payload) = payload else {
                tracing::debug!(plan = %plan_id, "a claimed Plan's Life is gone; left for the audit");
                continue;
            };
            let death = plan_id.ends_with(":death");
            let record = match LifeRecord::from_json(&payload) {
                Ok(record) => record,
                Err(e) => {
                    tracing::error!(plan = %plan_id, error = %e, "a claimed Life's record is unreadable; its Plan is left held for the audit");
                    continue;
                }
            };
            let action = record
                .action(death)
                .map(|a| serde_json::to_string(a).expect("actions serialize"))
                .unwrap_or_default();
            plans.push(Claimed {
                plan_id,
                shard,
                fire_at_ms: parse_ms(&fire),
                claim,
                action,
                attempts: record.plan(death).attempts,
                resource_id: record.resource_id.clone(),
                opts: RunOpts::default(),
                record: Some(Arc::new(record)),
            });
        }
        plans.extend(rows.into_iter().map(|row| {
            let mut row = row.into_iter();
            let mut next = || row.next().unwrap_or_default();
            let (plan_id, fire, claim, payload) = (next(), next(), next(), next());
            let (attempts, rid, opts) = (next(), next(), next());
            Claimed {
                plan_id,
                shard,
                fire_at_ms: parse_ms(&fire),
                claim,
                action: payload,
                attempts: attempts.parse().unwrap_or(0),
                resource_id: (!rid.is_empty()).then_some(rid),
                opts: if opts.is_empty() {
                    RunOpts::default()
                } else {
                    serde_json::from_str(&opts).unwrap_or_default()
                },
                record: None,
            }
        }));
        Ok(ClaimReply::Claimed {
            plans,
            next_task_ms: next_task.parse::<f64>().ok().map(|f| f as i64),
        })
    }

    /// The records of Lives' Plans just claimed from `shard`, in their order (None: the
    /// Life is gone), read with plain HGETs from the buckets that `buckets` (the count
    /// the claim saw) places them in: Redis does less for these than for the same reads
    /// inside the claim script. A record moved meanwhile by a bucket split is read again
    /// once from where the new count places it.
    async fn claimed_records(
        &self,
        shard: u32,
        claimed: &[(String, String, String)],
        buckets: u64,
    ) -> redis::RedisResult<Vec<Option<String>>> {
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.shard(shard);
        let uuids: Vec<&str> = claimed
            .iter()
            .map(|(plan_id, _, _)| plan_id.rsplit_once(':').map_or("", |(uuid, _)| uuid))
            .collect();
        let read = |buckets: u64, which: Vec<usize>| {
            let mut pipe = redis::pipe();
            for &i in &which {
                let bucket =
                    super::inspect::bucket_index(super::inspect::id_hash(uuids[i]), buckets);
                pipe.hget(k.records(bucket), uuids[i]);
            }
            let mut conn = self.conn();
            async move {
                let got: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
                Ok::<_, redis::RedisError>(which.into_iter().zip(got).collect::<Vec<_>>())
            }
        };
        let mut out: Vec<Option<String>> = vec![None; claimed.len()];
        let mut missing = Vec::new();
        for (i, got) in read(buckets, (0..claimed.len()).collect()).await? {
            match got {
                Some(rec) => out[i] = Some(rec),
                None => missing.push(i),
            }
        }
        if !missing.is_empty() {
            let now: Option<u64> =
                redis::AsyncCommands::get(&mut self.conn(), k.record_count()).await?;
            let now = now.unwrap_or(1);
            if now != buckets {
                for (i, got) in read(now, missing).await? {
                    out[i] = got;
                }
            }
        }
        Ok(out)
    }

    /// Fencing check and Preset -> Running for a batch of one shard's Plans (see
    /// `scripts/start_run.lua`); lateness and the lease are judged by Redis's clock.
    pub async fn start_runs(
        &self,
        shard: u32,
        host: &str,
        gen: u64,
        plans: &[&Claimed],
        birth_delay_limit_ms: i64,
    ) -> redis::RedisResult<Vec<StartOutcome>> {
        let section = StartSection {
            shard,
            gen,
            plans: plans.to_vec(),
        };
        let mut answers = self
            .start_sections(host, std::slice::from_ref(&section), birth_delay_limit_ms)
            .await?;
        Ok(answers.pop().unwrap_or_default())
    }

    /// [`Store::start_runs`] for the Plans of many shards in one call, a section a shard:
    /// each section's answers, in order. On a Redis Cluster the sections must be of one
    /// shard's node (a call goes to one node): callers give one section there.
    pub async fn start_sections(
        &self,
        host: &str,
        sections: &[StartSection<'_>],
        birth_delay_limit_ms: i64,
    ) -> redis::RedisResult<Vec<Vec<StartOutcome>>> {
        let Some(first) = sections.first() else {
            return Ok(Vec::new());
        };
        let mut invocation = self.scripts.start_run.prepare_invoke();
        invocation
            .key(self.shard(first.shard).inflight())
            .arg("")
            .arg(host)
            .arg(birth_delay_limit_ms)
            .arg(self.runs_max_len);
        for section in sections {
            invocation
                .arg(&self.shard(section.shard).prefix)
                .arg(section.gen)
                .arg(section.plans.len());
            for plan in &section.plans {
                // A Life's Plan: the attempt this run is, and its resource.
                invocation
                    .arg(&plan.plan_id)
                    .arg(&plan.claim)
                    .arg(plan.attempts + 1)
                    .arg(plan.resource_id.as_deref().unwrap_or(""));
            }
        }
        let reply: Vec<String> = invocation.invoke_async(&mut self.conn()).await?;
        let want: usize = sections.iter().map(|s| s.plans.len()).sum();
        if reply.len() != want {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "start_run answered a reply of the wrong length",
                format!("{} answers for {want} Plans", reply.len()),
            )));
        }
        let mut reply = reply.iter().map(|r| start_outcome(r));
        Ok(sections
            .iter()
            .map(|s| reply.by_ref().take(s.plans.len()).collect())
            .collect())
    }

    /// Records a batch of finished Life runs (`scripts/finish_life.lua`): each Life's
    /// record after its run (`lifecycle::after_run`), built from the record the Plan was
    /// claimed with, or (for a Life changed meanwhile: `stale`) from the record as it is
    /// now. Returns per run whether this host still held the Plan. On a standalone Redis
    /// the runs may be of any shards, all in one call; on a Redis Cluster they must be of
    /// one shard (a call goes to one node).
    pub async fn finish_lives(
        &self,
        host: &str,
        runs: &[FinishedRun],
        now_ms: i64,
        notify_before_ms: i64,
    ) -> redis::RedisResult<Vec<bool>> {
        let mut outcome: Vec<Option<bool>> = vec![None; runs.len()];
        // Runs whose Life changed while they ran, with the record as it is now.
        let mut fresh: Vec<Option<(String, LifeRecord)>> = vec![None; runs.len()];
        for _ in 0..FINISH_TRIES {
            let todo: Vec<usize> = (0..runs.len()).filter(|i| outcome[*i].is_none()).collect();
            if todo.is_empty() {
                break;
            }
            let reply = self
                .finish_lives_once(host, runs, &todo, &fresh, now_ms, notify_before_ms)
                .await?;
            for (i, word) in reply {
                match word.as_str() {
                    "ok" => outcome[i] = Some(true),
                    "stale" => {
                        let uuid = runs[i].plan.plan_id.rsplit_once(':').map_or("", |(u, _)| u);
                        match self.load_in(runs[i].plan.shard, uuid).await {
                            Ok(Some(loaded)) => fresh[i] = Some((loaded.text, loaded.record)),
                            _ => outcome[i] = Some(false),
                        }
                    }
                    _ => outcome[i] = Some(false),
                }
            }
        }
        Ok(outcome.into_iter().map(|o| o.unwrap_or(false)).collect())
    }

    /// One call of `finish_life.lua` for the runs `todo` (indices into `runs`), a section
    /// per shard: each run's answer with its index.
    async fn finish_lives_once(
        &self,
        host: &str,
        runs: &[FinishedRun],
        todo: &[usize],
        fresh: &[Option<(String, LifeRecord)>],
        now_ms: i64,
        notify_before_ms: i64,
    ) -> redis::RedisResult<Vec<(usize, String)>> {
        let mut sections: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &i in todo {
            sections.entry(runs[i].plan.shard).or_default().push(i);
        }
        let Some(&first) = sections.keys().next() else {
            return Ok(Vec::new());
        };
        let mut invocation = self.scripts.finish_life.prepare_invoke();
        invocation
            .key(self.shard(first).inflight())
            .arg("")
            .arg(host)
            .arg(now_ms)
            .arg(notify_before_ms)
            .arg(self.runs_max_len);
        let mut order = Vec::with_capacity(todo.len());
        for (shard, section) in &sections {
            invocation
                .arg(&self.shard(*shard).prefix)
                .arg(section.len());
            for &i in section {
                self.finish_args(&mut invocation, host, &runs[i], fresh[i].as_ref(), now_ms);
                order.push(i);
            }
        }
        let reply: Vec<String> = invocation.invoke_async(&mut self.conn()).await?;
        Ok(order.into_iter().zip(reply).collect())
    }

    /// One run's arguments of `finish_life.lua`: five, and the groups its flags name.
    fn finish_args(
        &self,
        invocation: &mut redis::ScriptInvocation<'_>,
        host: &str,
        run: &FinishedRun,
        fresh: Option<&(String, LifeRecord)>,
        now_ms: i64,
    ) {
        let (uuid, kind) = run
            .plan
            .life_and_kind()
            .unwrap_or(("", crate::model::PlanKind::Birth));
        let (expect, base) = match fresh {
            Some((text, record)) => (text.as_str(), record.clone()),
            None => (
                "",
                run.plan
                    .record
                    .as_deref()
                    .cloned()
                    .expect("a Life's Plan is claimed with its record"),
            ),
        };
        let r = &run.record;
        let entry = RunEntry {
            plan: if kind == crate::model::PlanKind::Death {
                "d"
            } else {
                "b"
            }
            .into(),
            attempt: r.attempt,
            should_run_at_ms: r.should_run_at_ms,
            started_at_ms: r.started_at_ms,
            duration_ms: r.duration_ms as i64,
            host: host.to_string(),
            outcome: r.outcome.to_string(),
            status: r.status.map(i64::from),
            error: r.error.clone(),
            output: r.output.clone(),
            logs: r.logs.clone(),
            retry_after_ms: r.retry_after_ms.map(|ms| ms as i64),
        };
        let ended = match run.outcome {
            RunOutcome::Done => Ended::Done,
            RunOutcome::Retry { next_ms } => Ended::Retry { next_ms },
            RunOutcome::Failed => Ended::Failed,
            RunOutcome::Invalidated => Ended::Invalidated,
        };
        let change = lifecycle::after_run(
            &base,
            uuid,
            kind,
            ended,
            entry,
            format!("{host}#{}", run.plan.claim),
            now_ms,
        );
        let census = change.census.map_or(['-', '-'], |(from, to)| {
            [census_code(from), census_code(to)]
        });
        let finished = match (change.finished, Outcome::of(&change.record)) {
            (true, Some((o, _))) if o.is_failure() => 'F',
            (true, _) => '1',
            _ => '0',
        };
        let mut flags = String::from_iter([finished, census[0], census[1]]);
        let mut extras: Vec<String> = Vec::new();
        if !expect.is_empty() {
            flags.push('x');
            extras.push(expect.to_string());
        }
        if let Some((plan, ms)) = &change.due {
            flags.push('q');
            extras.extend([plan.clone(), ms.to_string()]);
        }
        if !change.order_leave.is_empty() {
            flags.push('o');
            extras.extend([
                change.order_leave.join(" "),
                change.record.resource_id.clone().unwrap_or_default(),
            ]);
        }
        // A retry books no callback: the Plan has not finished.
        let callback = match (&run.outcome, &run.callback) {
            (RunOutcome::Retry { .. }, _) | (_, None) => None,
            (_, Some(c)) => c.record(&run.plan.plan_id, now_ms).map(|r| (c, r)),
        };
        if let Some((c, (rec, plugins))) = callback {
            flags.push('c');
            extras.extend([c.life_uuid.clone(), rec.to_json(), plugins.join(" ")]);
        }
        if self.runs_max_len > 0 {
            flags.push('s');
            extras.extend([
                run_record_json(host, kind.as_str(), r).to_string(),
                r.outcome.to_string(),
            ]);
        }
        invocation
            .arg(&run.plan.plan_id)
            .arg(&run.plan.claim)
            .arg(change.record.to_json())
            .arg(flags)
            .arg(super::inspect::id_hash(uuid));
        for extra in extras {
            invocation.arg(extra);
        }
    }
}

/// A score as Redis sends it (it may have a fraction), in whole ms.
fn parse_ms(score: &str) -> i64 {
    score.parse::<f64>().map(|f| f as i64).unwrap_or(0)
}

/// A Life state's one-letter code in `finish_life.lua`'s flags (its CENSUS_CODES).
fn census_code(state: LifeState) -> char {
    match state {
        LifeState::Inexistent => 'I',
        LifeState::Alive => 'A',
        LifeState::Dead => 'D',
        LifeState::Stillbirth => 'S',
        LifeState::Invalidated => 'V',
    }
}

/// A run as written to history: the same JSON for Lives, timers and tasks.
pub fn run_record_json(host: &str, plan: &str, r: &RunRecord) -> Value {
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
    if let Some(ms) = r.retry_after_ms {
        record["retry_after_ms"] = Value::from(ms);
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's census codes are the ones `finish_life.lua` reads back (CENSUS_CODES):
    /// a code that named another state would count every finish in the wrong state.
    #[test]
    fn census_codes_name_the_same_states_in_the_script() {
        let script = include_str!("scripts/finish_life.lua");
        let table = &script[script.find("local CENSUS_CODES = {").expect("the table")..];
        let table = &table[..table.find('}').expect("its end")];
        let states = [
            LifeState::Inexistent,
            LifeState::Alive,
            LifeState::Dead,
            LifeState::Stillbirth,
            LifeState::Invalidated,
        ];
        let mut codes: Vec<char> = states.iter().map(|s| census_code(*s)).collect();
        for state in states {
            let entry = format!("{} = '{}'", census_code(state), state.as_str());
            assert!(table.contains(&entry), "{entry} not in {table}");
        }
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), states.len(), "two states share a code");
        assert!(!codes.contains(&'-'), "'-' stands for no state");
    }
}
