//! Queues in Redis (SPEC section 6): the definition hash `queue:{name}` (with its token
//! bucket), the `queues` index, per queue the pending-task index `queue:{name}:tasks`,
//! the `queue:{name}:failed` list and the `queue:{name}:running` set, and per task the
//! Plan `plan:{queue}/{task}:task` and, once it is gone, `tombstone:{queue}/{task}`.
//! Admission (pause, rate, max_concurrent) happens in `start_run.lua`, so the limits hold
//! across all hosts together.

use std::collections::HashMap;

use redis::AsyncCommands;

use super::{FinishedRun, Keys, RunOutcome, Store};
use crate::error::ApiError;

impl Keys {
    pub fn queue(&self, name: &str) -> String {
        format!("{}queue:{name}", self.prefix)
    }
    pub fn queue_tasks(&self, name: &str) -> String {
        format!("{}queue:{name}:tasks", self.prefix)
    }
    pub fn queue_failed(&self, name: &str) -> String {
        format!("{}queue:{name}:failed", self.prefix)
    }
    pub fn queue_running(&self, name: &str) -> String {
        format!("{}queue:{name}:running", self.prefix)
    }
    /// Queue tasks waiting to be claimed (score = when they may run).
    pub fn due_tasks(&self) -> String {
        format!("{}due_tasks", self.prefix)
    }
    pub fn queues(&self) -> String {
        format!("{}queues", self.prefix)
    }
    pub fn task_plan(&self, queue: &str, task: &str) -> String {
        format!("{}plan:{queue}/{task}:task", self.prefix)
    }
}

/// One task to add: name, eta (ms and RFC 3339), action JSON.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub name: String,
    pub eta_ms: i64,
    pub action_json: String,
}

/// A queue's counts for its view.
#[derive(Debug, Clone, Default)]
pub struct QueueCounts {
    pub pending: i64,
    pub failed: i64,
    pub running: i64,
}

impl Store {
    /// Creates or changes a queue; true when it was created.
    pub async fn queue_put(
        &self,
        name: &str,
        fields: &[(String, String)],
        now_ms: i64,
    ) -> Result<bool, ApiError> {
        let k = &self.keys;
        let mut invocation = self.scripts.queue_put.prepare_invoke();
        invocation
            .key(k.queue(name))
            .key(k.queues())
            .arg(&k.prefix)
            .arg(name)
            .arg(self.fmt(now_ms));
        for (f, v) in fields {
            invocation.arg(f).arg(v);
        }
        let mut conn = self.conn.clone();
        let reply: String = invocation.invoke_async(&mut conn).await?;
        Ok(reply == "created")
    }

    /// The queue hash; None when there is no such queue.
    pub async fn queue_load(
        &self,
        name: &str,
    ) -> Result<Option<HashMap<String, String>>, ApiError> {
        let mut conn = self.conn.clone();
        let q: HashMap<String, String> = conn.hgetall(self.keys.queue(name)).await?;
        Ok((!q.is_empty()).then_some(q))
    }

    /// Pending, failed and running task counts of a queue.
    pub async fn queue_counts(&self, name: &str) -> Result<QueueCounts, ApiError> {
        let mut conn = self.conn.clone();
        let (pending, failed, running): (i64, i64, i64) = redis::pipe()
            .zcard(self.keys.queue_tasks(name))
            .zcard(self.keys.queue_failed(name))
            .scard(self.keys.queue_running(name))
            .query_async(&mut conn)
            .await?;
        Ok(QueueCounts {
            pending,
            failed,
            running,
        })
    }

    /// Names of every queue.
    pub async fn queue_names(&self) -> Result<Vec<String>, ApiError> {
        let mut conn = self.conn.clone();
        Ok(conn.zrange(self.keys.queues(), 0, -1).await?)
    }

    /// Sets `state` (`running` | `paused`); false when there is no such queue.
    pub async fn queue_set_state(&self, name: &str, state: &str) -> Result<bool, ApiError> {
        let mut conn = self.conn.clone();
        // HSET only if the hash exists, so that pausing a missing queue creates nothing.
        let changed: i64 = redis::Script::new(
            "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
             redis.call('HSET', KEYS[1], 'state', ARGV[1]) return 1",
        )
        .key(self.keys.queue(name))
        .arg(state)
        .invoke_async(&mut conn)
        .await?;
        Ok(changed == 1)
    }

    /// Sets a queue running and puts its parked tasks back in `due_tasks` (in batches);
    /// false when there is no such queue.
    pub async fn queue_resume(&self, name: &str, notify_before_ms: i64) -> Result<bool, ApiError> {
        let k = &self.keys;
        let batch = 1000;
        let mut offset = 0;
        loop {
            let mut conn = self.conn.clone();
            let seen: i64 = self
                .scripts
                .queue_resume
                .key(k.queue(name))
                .key(k.queue_tasks(name))
                .key(k.due_tasks())
                .arg(&k.prefix)
                .arg(name)
                .arg(offset)
                .arg(batch)
                .arg(notify_before_ms)
                .invoke_async(&mut conn)
                .await?;
            if seen < 0 {
                return Ok(false);
            }
            if seen < batch {
                return Ok(true);
            }
            offset += batch;
        }
    }

    /// Adds tasks all or none: 'ok' | 'missing' | a duplicate's name as Err text.
    pub async fn task_add(
        &self,
        queue: &str,
        tasks: &[NewTask],
        default_queue_fields: &str,
        now_ms: i64,
        notify_before_ms: i64,
    ) -> Result<Result<(), Option<String>>, ApiError> {
        let k = &self.keys;
        let mut invocation = self.scripts.task_add.prepare_invoke();
        invocation
            .key(k.queue(queue))
            .key(k.queue_tasks(queue))
            .key(k.due_tasks())
            .key(k.queues())
            .arg(&k.prefix)
            .arg(queue)
            .arg(now_ms)
            .arg(self.fmt(now_ms))
            .arg(notify_before_ms)
            .arg(default_queue_fields);
        for t in tasks {
            invocation
                .arg(&t.name)
                .arg(t.eta_ms)
                .arg(self.fmt(t.eta_ms))
                .arg(&t.action_json);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<String> = invocation.invoke_async(&mut conn).await?;
        Ok(match reply.first().map(String::as_str) {
            Some("ok") => Ok(()),
            Some("duplicate") => Err(reply.get(1).cloned()),
            _ => Err(None),
        })
    }

    /// Deletes (`delete`) or runs now (`run`) one task: 'ok' | 'missing' | 'running'.
    pub async fn task_change(
        &self,
        queue: &str,
        task: &str,
        mode: &str,
        now_ms: i64,
        notify_before_ms: i64,
        tombstone_ms: u64,
    ) -> Result<String, ApiError> {
        let k = &self.keys;
        let mut conn = self.conn.clone();
        Ok(self
            .scripts
            .task_change
            .key(k.task_plan(queue, task))
            .key(k.queue_tasks(queue))
            .key(k.queue_failed(queue))
            .key(k.due_tasks())
            .arg(&k.prefix)
            .arg(queue)
            .arg(task)
            .arg(mode)
            .arg(now_ms)
            .arg(self.fmt(now_ms))
            .arg(notify_before_ms)
            .arg(tombstone_ms)
            .invoke_async(&mut conn)
            .await?)
    }

    /// One task's Plan hash.
    pub async fn task_load(
        &self,
        queue: &str,
        task: &str,
    ) -> Result<Option<HashMap<String, String>>, ApiError> {
        let mut conn = self.conn.clone();
        let t: HashMap<String, String> = conn.hgetall(self.keys.task_plan(queue, task)).await?;
        Ok((!t.is_empty()).then_some(t))
    }

    /// Tasks of one index (`pending` or `failed`), up to `limit`, with their Plan hashes.
    pub async fn task_list(
        &self,
        queue: &str,
        failed: bool,
        limit: usize,
    ) -> Result<Vec<(String, HashMap<String, String>)>, ApiError> {
        let mut conn = self.conn.clone();
        let index = if failed {
            self.keys.queue_failed(queue)
        } else {
            self.keys.queue_tasks(queue)
        };
        let names: Vec<String> = conn.zrange(index, 0, limit as isize - 1).await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.hgetall(self.keys.task_plan(queue, name));
        }
        let hashes: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
        Ok(names.into_iter().zip(hashes).collect())
    }

    /// Removes every task that is not running (in batches); with `drop` the queue goes
    /// too once it is empty. Returns (removed, left).
    pub async fn queue_purge(
        &self,
        name: &str,
        drop: bool,
        now_ms: i64,
        tombstone_ms: u64,
    ) -> Result<(i64, i64), ApiError> {
        let k = &self.keys;
        let mut total = 0;
        loop {
            let mut conn = self.conn.clone();
            let (removed, left): (i64, i64) = self
                .scripts
                .queue_purge
                .key(k.queue(name))
                .key(k.queue_tasks(name))
                .key(k.queue_failed(name))
                .key(k.due_tasks())
                .key(k.queues())
                .arg(&k.prefix)
                .arg(name)
                .arg(1000)
                .arg(self.fmt(now_ms))
                .arg(tombstone_ms)
                .arg(if drop { "1" } else { "0" })
                .invoke_async(&mut conn)
                .await?;
            total += removed;
            if removed == 0 || left == 0 {
                return Ok((total, left));
            }
        }
    }

    /// The time of the first task in `due_tasks` after `after_ms`, if any: the claimer
    /// sleeps until then.
    pub async fn next_task_due_ms(&self, after_ms: i64) -> redis::RedisResult<Option<i64>> {
        let mut conn = self.conn.clone();
        let first: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg(self.keys.due_tasks())
            .arg(format!("({after_ms}"))
            .arg("+inf")
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async(&mut conn)
            .await?;
        Ok(first.first().map(|(_, score)| *score as i64))
    }

    /// The queue hashes of `queues` and the `first_attempt_ms` of each task Plan in
    /// `plan_ids`, for applying retry blocks.
    #[allow(clippy::type_complexity)]
    pub async fn task_retry_inputs(
        &self,
        queues: &[String],
        plan_ids: &[String],
    ) -> redis::RedisResult<(Vec<HashMap<String, String>>, Vec<Option<i64>>)> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        for q in queues {
            pipe.hgetall(self.keys.queue(q));
        }
        let hashes: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        for id in plan_ids {
            pipe.hget(format!("{}plan:{id}", self.keys.prefix), "first_attempt_ms");
        }
        let firsts: Vec<Option<i64>> = pipe.query_async(&mut conn).await?;
        Ok((hashes, firsts))
    }

    /// Records finished task runs (`scripts/finish_task.lua`); per run whether this host
    /// still held the task.
    pub async fn finish_tasks(
        &self,
        host: &str,
        runs: &[FinishedRun],
        now_ms: i64,
        notify_before_ms: i64,
        tombstone_ms: u64,
    ) -> redis::RedisResult<Vec<bool>> {
        let k = &self.keys;
        let mut invocation = self.scripts.finish_task.prepare_invoke();
        invocation
            .key(k.held(host))
            .key(k.due_tasks())
            .key(k.runs())
            .arg(&k.prefix)
            .arg(host)
            .arg(now_ms)
            .arg(self.fmt(now_ms))
            .arg(notify_before_ms)
            .arg(self.runs_max_len)
            .arg(tombstone_ms);
        for run in runs {
            let (outcome, next_ms) = match run.outcome {
                RunOutcome::Done => ("done", now_ms),
                RunOutcome::Retry { next_ms } => ("retry", next_ms),
                RunOutcome::Failed => ("failed", now_ms),
            };
            let r = &run.record;
            invocation
                .arg(&run.plan.plan_id)
                .arg(&run.plan.claim)
                .arg(outcome)
                .arg(next_ms)
                .arg(self.fmt(next_ms))
                .arg(r.status.map(|s| s.to_string()).unwrap_or_default())
                .arg(r.error.as_deref().unwrap_or(""))
                .arg(r.outcome)
                .arg(super::run_record_json(host, "task", r).to_string());
        }
        let mut conn = self.conn.clone();
        let reply: Vec<String> = invocation.invoke_async(&mut conn).await?;
        Ok(reply.iter().map(|r| r == "ok").collect())
    }
}
