//! Queues in Redis (SPEC section 6): the definition hash `queue:{name}` (with its token
//! bucket), the `queues` index, per queue the pending-task index `queue:{name}:tasks`,
//! the `queue:{name}:failed` list and the `queue:{name}:running` set, and per task the
//! Plan `plan:{queue}/{task}:task` and, once it is gone, `tombstone:{queue}/{task}`.
//! A pull queue's tasks are never due to any host: workers lease them (`task_lease.lua`),
//! and `queue:{name}:leased` holds the leases.
//! Admission (pause, rate, max_concurrent) happens in `start_run.lua`, so the limits hold
//! across all hosts together.

use std::collections::HashMap;

use redis::AsyncCommands;
use serde_json::Value;

use super::{FinishedRun, RunOutcome, ShardKeys, Store};
use crate::error::ApiError;

/// One task to add: name, eta, expiry, and its action or payload.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub name: String,
    pub eta_ms: i64,
    /// When a first attempt not yet started is dropped instead (`expire_after`).
    pub expires_at_ms: Option<i64>,
    pub work: NewTaskWork,
}

/// A push task's action, or a pull task's payload and tag (as JSON text).
#[derive(Debug, Clone)]
pub enum NewTaskWork {
    Action(String),
    Payload {
        payload_json: String,
        tag: Option<String>,
    },
}

/// Why `task_add` stored nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskAddRefusal {
    /// No such queue.
    Missing,
    /// A task of this name exists or was used within the tombstone time.
    Duplicate(String),
    /// The tasks do not fit the queue's mode: it is a pull queue (true) or a push one.
    Mode { pull: bool },
}

/// A queue's counts for its view.
/// A page of a queue's task list.
#[derive(Debug, Clone, Default)]
pub struct TaskPage {
    /// Each task's name and Plan hash (empty: it went while the page was read).
    pub tasks: Vec<(String, HashMap<String, String>)>,
    /// The last one's score and name, when there may be more.
    pub next: Option<(String, String)>,
    /// How many tasks the list holds.
    pub total: u64,
}

#[derive(Debug, Clone, Default)]
pub struct QueueCounts {
    pub pending: i64,
    pub failed: i64,
    pub running: i64,
    /// Pull tasks under a lease that has not run out.
    pub leased: i64,
}

/// How many due tasks of a pull queue one lease call looks at, at most (to find the
/// ones of a tag, or past tasks given up).
const LEASE_SCAN: usize = 1000;

/// A pull task handed to a worker by `POST /queues/{q}/lease`.
#[derive(Debug, Clone)]
pub struct LeasedTask {
    pub name: String,
    pub payload: Value,
    pub tag: Option<String>,
    /// Leases of it so far, this one included.
    pub attempts: u32,
    pub eta_ms: i64,
    /// What ack, extend and nack must name: another worker's lease of the task (after
    /// this one ran out) has another.
    pub lease_id: String,
    pub lease_expires_ms: i64,
}

impl Store {
    /// The keys of the shard queue `name` (and every task of it) lives in.
    pub(crate) fn queue_keys(&self, name: &str) -> &ShardKeys {
        self.shard(self.placement.queue(name))
    }

    /// Creates or changes a queue; true when it was created.
    pub async fn queue_put(
        &self,
        name: &str,
        fields: &[(String, String)],
        now_ms: i64,
    ) -> Result<bool, ApiError> {
        let k = self.queue_keys(name);
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
        let mut conn = self.conn();
        let reply: String = invocation.invoke_async(&mut conn).await?;
        if reply == "mode_fixed" {
            return Err(ApiError::conflict(
                "queue_mode_fixed",
                format!("queue `{name}`'s mode (push or pull) was set when it was created and cannot change; make another queue"),
            ));
        }
        Ok(reply == "created")
    }

    /// The queue hash; None when there is no such queue.
    pub async fn queue_load(
        &self,
        name: &str,
    ) -> Result<Option<HashMap<String, String>>, ApiError> {
        let mut conn = self.conn();
        let q: HashMap<String, String> = conn.hgetall(self.queue_keys(name).queue(name)).await?;
        Ok((!q.is_empty()).then_some(q))
    }

    /// Pending, failed, running and (pull queues) leased task counts of a queue; a
    /// leased task counts as pending too, as it is not done.
    pub async fn queue_counts(&self, name: &str, now_ms: i64) -> Result<QueueCounts, ApiError> {
        let mut conn = self.conn();
        let k = self.queue_keys(name);
        let (pending, failed, running, leased): (i64, i64, i64, i64) = redis::pipe()
            .zcard(k.queue_tasks(name))
            .zcard(k.queue_failed(name))
            .scard(k.queue_running(name))
            .zcount(k.queue_leased(name), format!("({now_ms}"), "+inf")
            .query_async(&mut conn)
            .await?;
        Ok(QueueCounts {
            pending,
            failed,
            running,
            leased,
        })
    }

    /// Leases up to `count` due tasks of a pull queue (of `tag`, if given) for
    /// `lease_ms` (`scripts/task_lease.lua`). None when there is no such queue; Err
    /// `push_queue` for a push queue.
    pub async fn task_lease(
        &self,
        queue: &str,
        count: usize,
        lease_ms: i64,
        tag: Option<&str>,
        now_ms: i64,
    ) -> Result<Option<Vec<LeasedTask>>, ApiError> {
        let k = self.queue_keys(queue);
        let nonce = format!("{:08x}", rand::random::<u32>());
        let reply: Vec<redis::Value> = self
            .scripts
            .task_lease
            .key(k.queue(queue))
            .key(k.queue_tasks(queue))
            .key(k.queue_leased(queue))
            .key(k.queue_failed(queue))
            .arg(&k.prefix)
            .arg(queue)
            .arg(now_ms)
            .arg(count)
            .arg(lease_ms)
            .arg(tag.unwrap_or(""))
            .arg(&nonce)
            .arg(self.fmt(now_ms))
            .arg(LEASE_SCAN)
            .invoke_async(&mut self.conn())
            .await
            .map_err(ApiError::write_unknown)?;
        let text =
            |v: &redis::Value| redis::from_redis_value::<String>(v.clone()).unwrap_or_default();
        match reply.first().map(text).as_deref() {
            Some("missing") => return Ok(None),
            Some("push") => {
                return Err(ApiError::bad_request(
                    "push_queue",
                    format!(
                    "queue `{queue}` is a push queue: its hosts run its tasks, nobody leases them"
                ),
                ))
            }
            _ => {}
        }
        let rest: Vec<String> = reply.iter().skip(1).map(text).collect();
        Ok(Some(
            rest.chunks_exact(7)
                .map(|c| LeasedTask {
                    name: c[0].clone(),
                    payload: serde_json::from_str(&c[1]).unwrap_or(Value::Null),
                    tag: (!c[2].is_empty()).then(|| c[2].clone()),
                    attempts: c[3].parse().unwrap_or(0),
                    eta_ms: c[4].parse().unwrap_or(0),
                    lease_id: c[5].clone(),
                    lease_expires_ms: c[6].parse().unwrap_or(0),
                })
                .collect(),
        ))
    }

    /// Acknowledges (`ack`), extends (`extend`, by `lease_ms` from now) or gives back
    /// (`nack`, due again after `lease_ms`) a pull task under lease `lease_id`
    /// (`scripts/task_lease_change.lua`): 'ok' with the lease's end (extend), or
    /// 'missing' | 'lease_lost' | 'not_pull'.
    #[allow(clippy::too_many_arguments)]
    pub async fn task_lease_change(
        &self,
        queue: &str,
        task: &str,
        mode: &str,
        lease_id: &str,
        lease_ms: i64,
        now_ms: i64,
        tombstone_ms: u64,
    ) -> Result<(String, Option<i64>), ApiError> {
        let k = self.queue_keys(queue);
        let reply: Vec<String> = self
            .scripts
            .task_lease_change
            .key(k.task_plan(queue, task))
            .key(k.queue_tasks(queue))
            .key(k.queue_leased(queue))
            .arg(&k.prefix)
            .arg(queue)
            .arg(task)
            .arg(mode)
            .arg(lease_id)
            .arg(lease_ms)
            .arg(now_ms)
            .arg(self.fmt(now_ms))
            .arg(tombstone_ms)
            .invoke_async(&mut self.conn())
            .await
            .map_err(ApiError::write_unknown)?;
        let word = reply.first().cloned().unwrap_or_default();
        Ok((word, reply.get(1).and_then(|ms| ms.parse().ok())))
    }

    /// Names of every queue, from every shard, sorted.
    pub async fn queue_names(&self) -> Result<Vec<String>, ApiError> {
        let mut names = Vec::new();
        for shard in 0..self.shard_count() {
            names.extend(self.shard_queue_names(shard).await?);
        }
        names.sort();
        Ok(names)
    }

    /// Names of the queues that live in one shard.
    pub async fn shard_queue_names(&self, shard: u32) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.conn();
        conn.zrange(self.shard(shard).queues(), 0, -1).await
    }

    /// Sets `state` (`running` | `paused`); false when there is no such queue.
    pub async fn queue_set_state(&self, name: &str, state: &str) -> Result<bool, ApiError> {
        let mut conn = self.conn();
        // HSET only if the hash exists, so that pausing a missing queue creates nothing.
        let changed: i64 = redis::Script::new(
            "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
             redis.call('HSET', KEYS[1], 'state', ARGV[1]) return 1",
        )
        .key(self.queue_keys(name).queue(name))
        .arg(state)
        .invoke_async(&mut conn)
        .await?;
        Ok(changed == 1)
    }

    /// Sets a queue running and moves its waiting tasks back to `due_tasks` (in batches,
    /// `scripts/queue_resume.lua`); false when there is no such queue.
    pub async fn queue_resume(&self, name: &str, notify_before_ms: i64) -> Result<bool, ApiError> {
        let k = self.queue_keys(name);
        for _ in 0..100_000 {
            let mut conn = self.conn();
            let left: i64 = self
                .scripts
                .queue_resume
                .key(k.queue(name))
                .arg(&k.prefix)
                .arg(name)
                .arg(1000)
                .arg(notify_before_ms)
                .invoke_async(&mut conn)
                .await?;
            if left < 0 {
                return Ok(false);
            }
            if left == 0 {
                return Ok(true);
            }
        }
        Ok(true)
    }

    /// Gives a running queue's free slots to its waiting tasks (`scripts/queue_wake.lua`);
    /// returns how many tasks moved.
    pub async fn queue_wake(&self, name: &str, notify_before_ms: i64) -> redis::RedisResult<i64> {
        let k = self.queue_keys(name);
        let mut conn = self.conn();
        self.scripts
            .queue_wake
            .key(k.queue(name))
            .arg(&k.prefix)
            .arg(name)
            .arg(1000)
            .arg(notify_before_ms)
            .invoke_async(&mut conn)
            .await
    }

    /// Adds tasks all or none: 'ok' | 'missing' | a duplicate's name as Err text.
    pub async fn task_add(
        &self,
        queue: &str,
        tasks: &[NewTask],
        default_queue_fields: &str,
        now_ms: i64,
        notify_before_ms: i64,
    ) -> Result<Result<(), TaskAddRefusal>, ApiError> {
        self.memory.check_room(self.placement.queue(queue))?;
        let k = self.queue_keys(queue);
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
            invocation.arg(&t.name).arg(t.eta_ms);
            let expires = t.expires_at_ms.map(|at| at.to_string()).unwrap_or_default();
            // Per task: action, expiry, payload, tag (see task_add.lua).
            match &t.work {
                NewTaskWork::Action(action) => invocation.arg(action).arg(expires).arg("").arg(""),
                NewTaskWork::Payload { payload_json, tag } => invocation
                    .arg("")
                    .arg(expires)
                    .arg(payload_json)
                    .arg(tag.as_deref().unwrap_or("")),
            };
        }
        let mut conn = self.conn();
        let reply: Vec<String> = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(ApiError::write_unknown)?;
        Ok(match reply.first().map(String::as_str) {
            Some("ok") => Ok(()),
            Some("duplicate") => Err(TaskAddRefusal::Duplicate(
                reply.get(1).cloned().unwrap_or_default(),
            )),
            Some("mode") => Err(TaskAddRefusal::Mode {
                pull: reply.get(1).map(String::as_str) == Some("pull"),
            }),
            _ => Err(TaskAddRefusal::Missing),
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
        let k = self.queue_keys(queue);
        let mut conn = self.conn();
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
            .arg(notify_before_ms)
            .arg(tombstone_ms)
            .invoke_async(&mut conn)
            .await?)
    }

    /// One task's Plan hash (a pending task's record read as one: `scripts/task_get.lua`).
    pub async fn task_load(
        &self,
        queue: &str,
        task: &str,
    ) -> Result<Option<HashMap<String, String>>, ApiError> {
        let mut tasks = self.tasks_get(queue, &[task]).await?;
        Ok(tasks.pop().filter(|t| !t.is_empty()))
    }

    /// Tasks of `queue` by name, each as its Plan hash's fields (empty: no such task).
    async fn tasks_get(
        &self,
        queue: &str,
        names: &[&str],
    ) -> redis::RedisResult<Vec<HashMap<String, String>>> {
        let k = self.queue_keys(queue);
        let mut invocation = self.scripts.task_get.prepare_invoke();
        invocation.key(k.queue(queue)).arg(&k.prefix).arg(queue);
        for name in names {
            invocation.arg(*name);
        }
        invocation.invoke_async(&mut self.conn()).await
    }

    /// A page of one of a queue's indexes (`pending` by ETA or `failed` by failure time),
    /// either way, past `after` (the last of the page before: its score and name), with
    /// their Plan hashes: the page, the last one's position if there may be more, and how
    /// many the index holds.
    pub async fn task_page(
        &self,
        queue: &str,
        failed: bool,
        limit: usize,
        after: Option<(String, String)>,
        descending: bool,
    ) -> Result<TaskPage, ApiError> {
        let k = self.queue_keys(queue);
        let index = if failed {
            k.queue_failed(queue)
        } else {
            k.queue_tasks(queue)
        };
        let (score, member) = after.unwrap_or_default();
        let (total, items): (u64, Vec<(String, String)>) = self
            .scripts
            .zset_page
            .key(index)
            .arg(&k.prefix)
            .arg(score)
            .arg(member)
            .arg(limit)
            .arg(if descending { "desc" } else { "asc" })
            .invoke_async(&mut self.conn())
            .await?;
        let next = (items.len() == limit)
            .then(|| {
                items
                    .last()
                    .map(|(name, score)| (score.clone(), name.clone()))
            })
            .flatten();
        let mut tasks = Vec::new();
        if !items.is_empty() {
            let names: Vec<&str> = items.iter().map(|(name, _)| name.as_str()).collect();
            let hashes = self.tasks_get(queue, &names).await?;
            tasks = items
                .into_iter()
                .map(|(name, _)| name)
                .zip(hashes)
                .collect();
        }
        Ok(TaskPage { tasks, next, total })
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
        let k = self.queue_keys(name);
        let mut total = 0;
        loop {
            let mut conn = self.conn();
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
                .arg(now_ms)
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

    /// The queue hashes of `queues` and the `first_attempt_ms` of each task Plan in
    /// `plan_ids` (all of queues in `shard`), for applying retry blocks.
    #[allow(clippy::type_complexity)]
    pub async fn task_retry_inputs(
        &self,
        shard: u32,
        queues: &[String],
        plan_ids: &[String],
    ) -> redis::RedisResult<(Vec<HashMap<String, String>>, Vec<Option<i64>>)> {
        let k = self.shard(shard);
        let mut conn = self.conn();
        let mut pipe = redis::pipe();
        for q in queues {
            pipe.hgetall(k.queue(q));
        }
        let hashes: Vec<HashMap<String, String>> = pipe.query_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        for id in plan_ids {
            pipe.hget(k.plan(id), "first_attempt_ms");
        }
        let firsts: Vec<Option<i64>> = pipe.query_async(&mut conn).await?;
        Ok((hashes, firsts))
    }

    /// Records finished task runs (`scripts/finish_task.lua`); per run whether this host
    /// still held the task.
    pub async fn finish_tasks(
        &self,
        shard: u32,
        host: &str,
        runs: &[FinishedRun],
        now_ms: i64,
        notify_before_ms: i64,
        tombstone_ms: u64,
    ) -> redis::RedisResult<Vec<bool>> {
        let k = self.shard(shard);
        let mut invocation = self.scripts.finish_task.prepare_invoke();
        invocation
            .key(k.held())
            .key(k.due_tasks())
            .key(k.runs())
            .arg(&k.prefix)
            .arg(host)
            .arg(now_ms)
            .arg(notify_before_ms)
            .arg(self.runs_max_len)
            .arg(tombstone_ms);
        for run in runs {
            let (outcome, next_ms) = match run.outcome {
                RunOutcome::Done => ("done", now_ms),
                RunOutcome::Retry { next_ms } => ("retry", next_ms),
                // Only a Life's birth is ever invalidated.
                RunOutcome::Failed | RunOutcome::Invalidated => ("failed", now_ms),
            };
            let r = &run.record;
            invocation
                .arg(&run.plan.plan_id)
                .arg(&run.plan.claim)
                .arg(outcome)
                .arg(next_ms)
                .arg(r.status.map(|s| s.to_string()).unwrap_or_default())
                .arg(r.error.as_deref().unwrap_or(""))
                .arg(r.outcome)
                .arg(super::run_record_json(host, "task", r).to_string());
            let (callback, record) =
                super::Callback::args(&run.callback, &run.plan.plan_id, now_ms);
            invocation.arg(callback).arg(record);
        }
        let mut conn = self.conn();
        let reply: Vec<String> = invocation.invoke_async(&mut conn).await?;
        Ok(reply.iter().map(|r| r == "ok").collect())
    }
}
