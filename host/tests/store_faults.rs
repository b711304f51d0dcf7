//! Faults staged at the store's boundary, each deterministic: a script called twice as a
//! host does when the first reply was lost, a lease that ran out, a claim of a Plan
//! deleted and created again, a resource's Plans out of order, a dead host's run cut off,
//! a queue resumed with removals in between, a shard taken over from a frozen host. Each
//! talks to a real redis-server of its own and goes through the same `Store` calls as the
//! engine, on a keyspace of one shard (whose keys `key()` names).

use kairos::model::NewLife;
use kairos::model::ScheduleType;
use kairos::store::inspect;
use kairos::store::record::{Inflight, LifeRecord};
use kairos::store::{
    ClaimReply, Claimed, IdOrigin, NewTask, NewTaskWork, RunOutcome, StartOutcome, Store, Takeover,
    TimerFinish,
};
use redis::AsyncCommands;

mod common;
use common::{done, hook, now_ms, Redis};

fn point(id: &str, at_ms: i64) -> NewLife {
    NewLife {
        life_uuid: id.into(),
        schedule_type: ScheduleType::Point,
        resource_id: None,
        birth_at_ms: at_ms,
        death_at_ms: None,
        birth_action: hook(),
        death_action: None,
    }
}

fn term(id: &str, resource: &str, birth_ms: i64, death_ms: i64) -> NewLife {
    NewLife {
        life_uuid: id.into(),
        schedule_type: ScheduleType::Term,
        resource_id: Some(resource.into()),
        birth_at_ms: birth_ms,
        death_at_ms: Some(death_ms),
        birth_action: hook(),
        death_action: Some(hook()),
    }
}

const FAR: i64 = 60_000;

fn defaults() -> String {
    kairos::queues::QueueDef::defaults_json()
}

async fn book(store: &Store, life: &NewLife) {
    store
        .book(life, IdOrigin::Given, now_ms(), 1_000, now_ms() + FAR)
        .await
        .unwrap();
}

/// A key of the one shard.
fn key(store: &Store, rest: &str) -> String {
    format!("{}{rest}", store.shard(0).prefix)
}

/// `host` takes the shard (its lease must be free or run out), handing back what the
/// previous owner held; returns the generation.
async fn own(store: &Store, host: &str) -> u64 {
    match store.shard_takeover(0, host, 30_000).await.unwrap() {
        Takeover::Taken { gen, .. } => {
            // As the supervisor does: again until nothing is left (a run cut off is
            // recorded between two calls).
            for _ in 0..3 {
                let (_, left) = store
                    .shard_release(0, host, gen, 1000, now_ms() + FAR, false, now_ms())
                    .await
                    .unwrap();
                if left == 0 {
                    return gen;
                }
            }
            panic!("the shard's held Plans were not all handed back")
        }
        Takeover::HeldBy(other) => panic!("{other} holds the shard"),
    }
}

/// The shard's lease runs out (its owner froze or died).
async fn lapse(redis: &Redis, store: &Store) {
    let _: () = redis
        .conn()
        .await
        .hset(store.shard(0).owner(), "until", 0)
        .await
        .unwrap();
}

/// Claims what is due within a minute for `host` at `gen`.
async fn claim(store: &Store, host: &str, gen: u64) -> Vec<Claimed> {
    match store
        .claim(0, host, gen, now_ms() + FAR, 1000, now_ms() + 1_000, 1000)
        .await
        .unwrap()
    {
        ClaimReply::Claimed { plans, .. } => plans,
        other => panic!("claim refused: {other:?}"),
    }
}

async fn start(store: &Store, host: &str, gen: u64, plans: &[&Claimed]) -> Vec<StartOutcome> {
    store
        .start_runs(0, host, gen, plans, 180_000)
        .await
        .unwrap()
}

/// Life `id`'s record and its Plans' `inflight` entries.
async fn record(redis: &Redis, store: &Store, id: &str) -> (LifeRecord, [Option<Inflight>; 2]) {
    inspect::life(&mut redis.conn().await, store.shard(0), id)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no record of {id}"))
}

/// Where `member` is in the shard's tree `tree` (`due`, `lives`, `finished`): its leaf's
/// key and its score.
async fn in_tree(redis: &Redis, store: &Store, tree: &str, member: &str) -> Option<(String, i64)> {
    let mut conn = redis.conn().await;
    let tree = key(store, tree);
    let entries: Vec<String> = conn.zrange(&tree, 0, -1).await.unwrap();
    for entry in entries {
        let leaf = format!("{tree}:{}", entry.rsplit_once('|').unwrap().1);
        let score: Option<i64> = conn.zscore(&leaf, member).await.unwrap();
        if let Some(score) = score {
            return Some((leaf, score));
        }
    }
    None
}

fn of<'a>(plans: &'a [Claimed], id: &str) -> &'a Claimed {
    plans
        .iter()
        .find(|p| p.plan_id == id)
        .unwrap_or_else(|| panic!("{id} was not claimed: {plans:?}"))
}

/// A lost reply of start_run: the host retries and must get the applied answer, not
/// `lost` (which left the Plan Running with nobody calling it).
#[tokio::test]
async fn a_start_retried_after_its_reply_was_lost_gets_the_applied_answer() {
    let redis = Redis::start();
    let store = redis.store().await;
    let gen = own(&store, "h1").await;
    book(&store, &point("p1", now_ms() + 500)).await;
    let claimed = claim(&store, "h1", gen).await;
    let plan = of(&claimed, "p1:birth");
    let first = start(&store, "h1", gen, &[plan]).await;
    assert_eq!(first, [StartOutcome::Run { attempts: 1 }]);
    // The reply was lost: the executor calls again with the same claim.
    let again = start(&store, "h1", gen, &[plan]).await;
    assert_eq!(
        again,
        [StartOutcome::Run { attempts: 1 }],
        "a retried start answers as the applied one did, and counts no second attempt"
    );
    let (_, inflight) = record(&redis, &store, "p1").await;
    let running = inflight[0].as_ref().and_then(|f| f.running);
    assert_eq!(running.map(|(_, attempt)| attempt), Some(1));
}

/// A lost reply of finish_run (and finish_task, finish_timer): the retry answers `ok`
/// and writes nothing twice.
#[tokio::test]
async fn finishes_retried_after_a_lost_reply_record_each_run_once() {
    let redis = Redis::start();
    // With the runs stream on (it is off by default), to count its entries too.
    let store = redis.store().await.with_runs_max_len(1000);
    let mut conn = redis.conn().await;
    let gen = own(&store, "h1").await;
    book(&store, &point("p2", now_ms() + 500)).await;
    store
        .task_add(
            "default",
            &[NewTask {
                name: "t2".into(),
                eta_ms: now_ms(),
                expires_at_ms: None,
                work: NewTaskWork::Action(serde_json::to_string(&hook()).unwrap()),
            }],
            &defaults(),
            now_ms(),
            now_ms() + FAR,
        )
        .await
        .unwrap()
        .unwrap();
    let claimed = claim(&store, "h1", gen).await;
    let (life, task) = (of(&claimed, "p2:birth"), of(&claimed, "default/t2:task"));
    assert_eq!(start(&store, "h1", gen, &[life, task]).await.len(), 2);

    for _ in 0..2 {
        let held = store
            .finish_lives("h1", &[done(life, 1)], now_ms(), now_ms() + FAR)
            .await
            .unwrap();
        assert_eq!(held, [true], "the retry answers as the first call did");
        let held = store
            .finish_tasks(
                0,
                "h1",
                &[done(task, 1)],
                now_ms(),
                now_ms() + FAR,
                3_600_000,
            )
            .await
            .unwrap();
        assert_eq!(held, [true]);
    }
    let stream: i64 = conn.xlen(key(&store, "runs")).await.unwrap();
    assert_eq!(stream, 2, "one stream entry per run, not per call");
    assert_eq!(record(&redis, &store, "p2").await.0.state, "Dead");
}

/// A Life whose record was deleted by hand while its Plan ran: the finish does not write
/// the record back (it writes without reading first, and takes back a write that found
/// no record), answers the run lost, and lets the claim go; the other run of the same
/// call is recorded.
#[tokio::test]
async fn a_finish_does_not_bring_back_a_life_deleted_while_it_ran() {
    let redis = Redis::start();
    let store = redis.store().await;
    let mut conn = redis.conn().await;
    let gen = own(&store, "h1").await;
    book(&store, &point("gone", now_ms() + 500)).await;
    book(&store, &point("kept", now_ms() + 500)).await;
    let claimed = claim(&store, "h1", gen).await;
    let (gone, kept) = (of(&claimed, "gone:birth"), of(&claimed, "kept:birth"));
    assert_eq!(start(&store, "h1", gen, &[gone, kept]).await.len(), 2);
    let k = store.shard(0);
    let n: Option<u64> = conn.get(k.record_count()).await.unwrap();
    let bucket = k.records(inspect::bucket_index(
        inspect::id_hash("gone"),
        n.unwrap_or(1),
    ));
    let deleted: i64 = conn.hdel(&bucket, "gone").await.unwrap();
    assert_eq!(deleted, 1, "the record was where inspect says");

    let held = store
        .finish_lives(
            "h1",
            &[done(gone, 1), done(kept, 1)],
            now_ms(),
            now_ms() + FAR,
        )
        .await
        .unwrap();
    assert_eq!(
        held,
        [false, true],
        "the deleted Life's run is lost, the other's recorded"
    );
    assert!(
        inspect::life(&mut conn, k, "gone").await.unwrap().is_none(),
        "no record came back"
    );
    let claims: Vec<String> = conn.hkeys(key(&store, "inflight")).await.unwrap();
    assert!(claims.is_empty(), "both claims are let go: {claims:?}");
    assert_eq!(record(&redis, &store, "kept").await.0.state, "Dead");
}

#[tokio::test]
async fn a_timer_finish_retried_logs_the_run_once_and_a_deactivated_timer_stops_retrying() {
    let redis = Redis::start();
    let store = redis.store().await;
    let mut conn = redis.conn().await;
    let gen = own(&store, "h1").await;
    let fields = |active: &str| {
        vec![
            ("schedule".to_string(), "* * * * * *".to_string()),
            ("dialect".to_string(), "unix".to_string()),
            ("timezone".to_string(), "UTC".to_string()),
            (
                "action".to_string(),
                serde_json::to_string(&hook()).unwrap(),
            ),
            ("active".to_string(), active.to_string()),
        ]
    };
    let at = now_ms() + 200;
    store
        .timer_put(
            "tick",
            true,
            "",
            &kairos::store::NextRun::At(at, store.fmt_time(at)),
            false,
            &serde_json::to_string(&hook()).unwrap(),
            "{}",
            now_ms(),
            now_ms() + FAR,
            &fields("1"),
        )
        .await
        .unwrap();
    let claimed = claim(&store, "h1", gen).await;
    let plan = of(&claimed, "tick:timer");
    start(&store, "h1", gen, &[plan]).await;
    let version: String = conn
        .hget(key(&store, "timer:tick"), "version")
        .await
        .unwrap_or_default();
    let finish = |outcome: &'static str, next_ms: i64| TimerFinish {
        name: "tick",
        claim: &plan.claim,
        outcome,
        next: Some((next_ms, store.fmt_time(next_ms))),
        next_slot_ms: None,
        catch_up_runs: 0,
        version: &version,
        record: format!("{{\"outcome\":\"{outcome}\"}}"),
        skips: Vec::new(),
        callback: None,
    };
    let next = now_ms() + 5_000;
    for _ in 0..2 {
        let reply = store
            .finish_timer("h1", &finish("done", next), now_ms(), now_ms() + FAR)
            .await
            .unwrap();
        assert_eq!(reply, "ok");
    }
    let runs: i64 = conn.llen(key(&store, "timer:tick:runs")).await.unwrap();
    assert_eq!(runs, 1, "a retried finish_timer logged the run twice");

    // Next slot: the run fails and wants a retry, but the timer was deactivated meanwhile.
    let _: () = conn
        .zadd(key(&store, "timers_due"), "tick:timer", now_ms() - 1)
        .await
        .unwrap();
    let claimed = claim(&store, "h1", gen).await;
    let plan = of(&claimed, "tick:timer").clone();
    start(&store, "h1", gen, &[&plan]).await;
    let _: () = conn
        .hset(key(&store, "timer:tick"), "active", "0")
        .await
        .unwrap();
    let reply = store
        .finish_timer(
            "h1",
            &TimerFinish {
                name: "tick",
                claim: &plan.claim,
                outcome: "retry",
                next: Some((now_ms() + 100, store.fmt_time(now_ms() + 100))),
                next_slot_ms: None,
                catch_up_runs: 0,
                version: &version,
                record: "{\"outcome\":\"retry\"}".into(),
                skips: Vec::new(),
                callback: None,
            },
            now_ms(),
            now_ms() + FAR,
        )
        .await
        .unwrap();
    assert_eq!(reply, "ok");
    let due: Option<f64> = conn
        .zscore(key(&store, "timers_due"), "tick:timer")
        .await
        .unwrap();
    assert_eq!(
        due, None,
        "a deactivated timer must not fire its pending retry"
    );
    let state: String = conn
        .hget(key(&store, "plan:tick:timer"), "state")
        .await
        .unwrap();
    assert_eq!(state, "Inactive");
}

/// Claim numbers never repeat, even for a Plan deleted and created again under the same
/// id: a stale in-memory entry of the first must fail the fence of the second.
#[tokio::test]
async fn claim_numbers_are_never_used_twice_for_a_plan_created_again() {
    let redis = Redis::start();
    let store = redis.store().await;
    let mut conn = redis.conn().await;
    let gen = own(&store, "h1").await;
    book(&store, &point("again", now_ms() + 500)).await;
    let old = of(&claim(&store, "h1", gen).await, "again:birth").clone();
    // The Life goes (as a sweep or a DELETE and re-create would leave it) and is booked
    // again under the same id.
    let bucket = inspect::bucket_index(inspect::id_hash("again"), 1);
    let _: () = conn
        .hdel(store.shard(0).records(bucket), "again")
        .await
        .unwrap();
    let _: () = conn
        .hdel(store.shard(0).inflight(), "again:birth")
        .await
        .unwrap();
    book(&store, &point("again", now_ms() + 500)).await;
    let new = of(&claim(&store, "h1", gen).await, "again:birth").clone();
    assert_ne!(
        old.claim, new.claim,
        "claim numbers restarted with the Plan hash"
    );
    assert_eq!(
        start(&store, "h1", gen, &[&old]).await,
        [StartOutcome::Lost]
    );
    assert_eq!(
        start(&store, "h1", gen, &[&new]).await,
        [StartOutcome::Run { attempts: 1 }]
    );
}

/// A host whose shard lease ran out (frozen, then resumed) must not start a run while
/// another host may be taking the shard over; renewed in time, it goes on. Once another
/// host has taken the shard, the first can neither claim nor start there any more, even
/// after it renews nothing (its generation is stale).
#[tokio::test]
async fn a_host_whose_shard_lease_ran_out_or_was_taken_starts_and_claims_nothing() {
    let redis = Redis::start();
    let store = redis.store().await;
    let gen = own(&store, "h1").await;
    book(&store, &point("frozen", now_ms() + 300)).await;
    book(&store, &point("later", now_ms() + 400)).await;
    let claimed = claim(&store, "h1", gen).await;
    let plan = of(&claimed, "frozen:birth").clone();
    lapse(&redis, &store).await;
    assert_eq!(
        start(&store, "h1", gen, &[&plan]).await,
        [StartOutcome::Expired]
    );
    assert!(matches!(
        store
            .claim(0, "h1", gen, now_ms() + FAR, 10, now_ms(), 10)
            .await
            .unwrap(),
        ClaimReply::Expired
    ));
    assert_eq!(
        renew(&store, "h1", gen).await,
        [true],
        "not taken over: the lease is still this host's to renew"
    );
    assert_eq!(
        start(&store, "h1", gen, &[&plan]).await,
        [StartOutcome::Run { attempts: 1 }],
        "renewed in time (nobody took it over), it runs"
    );
    // Frozen again, and this time h2 takes the shard over.
    lapse(&redis, &store).await;
    let gen2 = own(&store, "h2").await;
    assert!(gen2 > gen);
    let later = of(&claimed, "later:birth").clone();
    assert_eq!(
        start(&store, "h1", gen, &[&later]).await,
        [StartOutcome::Lost],
        "the old generation starts nothing"
    );
    assert!(matches!(
        store
            .claim(0, "h1", gen, now_ms() + FAR, 10, now_ms(), 10)
            .await
            .unwrap(),
        ClaimReply::Lost
    ));
    assert_eq!(renew(&store, "h1", gen).await, [false]);
    // What h1 had claimed is h2's to fire, the cut-off run included.
    let taken = claim(&store, "h2", gen2).await;
    let ids: Vec<&str> = taken.iter().map(|p| p.plan_id.as_str()).collect();
    assert!(
        ids.contains(&"frozen:birth") && ids.contains(&"later:birth"),
        "{ids:?}"
    );
    // h1's late outcome of the run cut off is recorded but changes nothing.
    let held = store
        .finish_lives("h1", &[done(&plan, 1)], now_ms(), now_ms() + FAR)
        .await
        .unwrap();
    assert_eq!(held, [false]);
    let life = store.life_view("frozen", 10).await.unwrap().unwrap();
    assert_eq!(life["state"], "Inexistent", "{life:#}");
}

/// The Plans of one resource run in due order: B's birth waits while A's death is
/// unfinished, on this host and on the host that takes the shard over, and starts once
/// A's death is done.
#[tokio::test]
async fn a_resource_plan_waits_for_every_earlier_plan_of_its_resource() {
    let redis = Redis::start();
    let store = redis.store().await;
    let gen = own(&store, "h1").await;
    let t = now_ms();
    book(&store, &term("a", "conn-1", t + 200, t + 1_200)).await;
    book(&store, &term("b", "conn-1", t + 3_000, t + 4_000)).await;
    let claimed = claim(&store, "h1", gen).await;
    let a_birth = of(&claimed, "a:birth");
    let b_birth = of(&claimed, "b:birth");
    assert_eq!(
        start(&store, "h1", gen, &[a_birth]).await,
        [StartOutcome::Run { attempts: 1 }]
    );
    store
        .finish_lives("h1", &[done(a_birth, 1)], now_ms(), now_ms() + FAR)
        .await
        .unwrap();
    // A is Alive; its death starts, and then h1 dies mid-call.
    let a_death = of(&claim(&store, "h1", gen).await, "a:death").clone();
    assert_eq!(
        start(&store, "h1", gen, &[&a_death]).await,
        [StartOutcome::Run { attempts: 1 }]
    );
    assert_eq!(
        start(&store, "h1", gen, &[b_birth]).await,
        [StartOutcome::Busy],
        "B's birth must not run while A's death is unfinished"
    );
    // h2 takes the shard over; h1's run was cut off (it may have reached the target).
    lapse(&redis, &store).await;
    let gen2 = own(&store, "h2").await;
    let claimed = claim(&store, "h2", gen2).await;
    let b_birth = of(&claimed, "b:birth").clone();
    let a_death = of(&claimed, "a:death").clone();
    assert_eq!(
        start(&store, "h2", gen2, &[&b_birth]).await,
        [StartOutcome::Busy]
    );
    assert_eq!(
        start(&store, "h2", gen2, &[&a_death]).await,
        [StartOutcome::Run { attempts: 2 }]
    );
    store
        .finish_lives("h2", &[done(&a_death, 2)], now_ms(), now_ms() + FAR)
        .await
        .unwrap();
    assert_eq!(
        start(&store, "h2", gen2, &[&b_birth]).await,
        [StartOutcome::Run { attempts: 1 }]
    );
    let life = store.life_view("a", 50).await.unwrap().unwrap();
    let outcomes: Vec<&str> = life["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["outcome"].as_str())
        .collect();
    assert!(
        outcomes.contains(&"interrupted"),
        "the cut-off death attempt is in the history: {life:#}"
    );
}

/// A birth cut off by its host's crash may have reached its target. If it then comes
/// back too late to run again, the Life must still get its death.
#[tokio::test]
async fn a_late_birth_that_may_have_reached_its_target_is_followed_by_its_death() {
    let redis = Redis::start();
    let store = redis.store().await;
    let mut conn = redis.conn().await;
    let gen = own(&store, "h1").await;
    let t = now_ms();
    book(&store, &term("cut", "conn-2", t + 200, t + 30_000)).await;
    let birth = of(&claim(&store, "h1", gen).await, "cut:birth").clone();
    assert_eq!(
        start(&store, "h1", gen, &[&birth]).await,
        [StartOutcome::Run { attempts: 1 }]
    );
    // h1 dies mid-call; h2 takes the shard over; nobody picks the birth up for a long
    // time.
    lapse(&redis, &store).await;
    let gen2 = own(&store, "h2").await;
    // The takeover handed the cut-off birth back, due at its time; move that ten
    // minutes back.
    let (leaf, _) = in_tree(&redis, &store, "due", "cut:birth").await.unwrap();
    let _: () = conn
        .zadd(&leaf, "cut:birth", now_ms() - 600_000)
        .await
        .unwrap();
    let birth = of(&claim(&store, "h2", gen2).await, "cut:birth").clone();
    let late = start(&store, "h2", gen2, &[&birth]).await;
    assert!(
        matches!(late[..], [StartOutcome::Late(ms)] if ms >= 600_000),
        "{late:?}"
    );
    // The host records it as the engine does: Invalidated, under its claim.
    let mut run = done(&birth, 2);
    run.outcome = RunOutcome::Invalidated;
    run.record.outcome = "invalidated";
    let held = store
        .finish_lives("h2", &[run], now_ms(), now_ms() + FAR)
        .await
        .unwrap();
    assert_eq!(held, [true]);
    let life = store.life_view("cut", 50).await.unwrap().unwrap();
    assert_eq!(life["state"], "Alive", "{life:#}");
    assert!(
        in_tree(&redis, &store, "due", "cut:death").await.is_some(),
        "its death is due: the deactivate is sent"
    );
    let (cut, _) = record(&redis, &store, "cut").await;
    assert!(cut.birth_uncertain, "{cut:?}");
}

/// A queue at its max_concurrent keeps its waiting tasks in Redis, not in a host's
/// memory; a finishing run hands its slot to the first of them.
#[tokio::test]
async fn a_full_queue_waits_in_redis_and_a_finished_run_wakes_the_next() {
    let redis = Redis::start();
    let store = redis.store().await;
    let mut conn = redis.conn().await;
    let gen = own(&store, "h1").await;
    store
        .queue_put("one", &[("max_concurrent".into(), "1".into())], now_ms())
        .await
        .unwrap();
    let tasks: Vec<NewTask> = ["t1", "t2", "t3"]
        .iter()
        .map(|n| NewTask {
            name: n.to_string(),
            eta_ms: now_ms(),
            expires_at_ms: None,
            work: NewTaskWork::Action(serde_json::to_string(&hook()).unwrap()),
        })
        .collect();
    store
        .task_add("one", &tasks, &defaults(), now_ms(), now_ms() + FAR)
        .await
        .unwrap()
        .unwrap();
    let claimed = claim(&store, "h1", gen).await;
    let plans: Vec<&Claimed> = claimed.iter().collect();
    let outcomes = start(&store, "h1", gen, &plans).await;
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == StartOutcome::Deferred)
            .count(),
        2,
        "{outcomes:?}"
    );
    let held: i64 = conn.zcard(key(&store, "held")).await.unwrap();
    assert_eq!(
        held, 1,
        "only the running task is held; the others wait in Redis"
    );
    let waiting: i64 = conn.zcard(key(&store, "queue:one:waiting")).await.unwrap();
    assert_eq!(waiting, 2);
    let running = claimed
        .iter()
        .zip(&outcomes)
        .find(|(_, o)| matches!(o, StartOutcome::Run { .. }))
        .unwrap()
        .0;
    store
        .finish_tasks(
            0,
            "h1",
            &[done(running, 1)],
            now_ms(),
            now_ms() + FAR,
            3_600_000,
        )
        .await
        .unwrap();
    let waiting: i64 = conn.zcard(key(&store, "queue:one:waiting")).await.unwrap();
    assert_eq!(waiting, 1, "the freed slot went to the first waiting task");
    let due: i64 = conn.zcard(key(&store, "due_tasks")).await.unwrap();
    assert_eq!(due, 1);
}

/// Resume moves every waiting task back, whatever finishes or arrives between its
/// batches (it used to page the task index by rank, so a removal in front made it skip a
/// parked task for good).
#[tokio::test]
async fn resume_strands_no_task_when_tasks_finish_in_between() {
    let redis = Redis::start();
    let store = redis.store().await;
    let mut conn = redis.conn().await;
    let gen = own(&store, "h1").await;
    store
        .queue_put("q", &[("max_concurrent".into(), "0".into())], now_ms())
        .await
        .unwrap();
    let tasks: Vec<NewTask> = (0..5)
        .map(|i| NewTask {
            name: format!("t{i}"),
            eta_ms: now_ms() + i,
            expires_at_ms: None,
            work: NewTaskWork::Action(serde_json::to_string(&hook()).unwrap()),
        })
        .collect();
    store
        .task_add("q", &tasks, &defaults(), now_ms(), now_ms() + FAR)
        .await
        .unwrap()
        .unwrap();
    // t0 runs; then the queue is paused and the others are parked as they come due.
    let claimed = claim(&store, "h1", gen).await;
    let r0 = of(&claimed, "q/t0:task").clone();
    assert_eq!(
        start(&store, "h1", gen, &[&r0]).await,
        [StartOutcome::Run { attempts: 1 }]
    );
    store.queue_set_state("q", "paused").await.unwrap();
    let rest: Vec<&Claimed> = claimed.iter().filter(|p| p.plan_id != r0.plan_id).collect();
    assert!(start(&store, "h1", gen, &rest)
        .await
        .iter()
        .all(|o| *o == StartOutcome::Deferred));
    // The first resume batch is interrupted (staged: the queue set running by hand), t0
    // finishes, then resume runs.
    let _: () = conn
        .hset(key(&store, "queue:q"), "state", "running")
        .await
        .unwrap();
    store
        .finish_tasks(
            0,
            "h1",
            &[done(&r0, 1)],
            now_ms(),
            now_ms() + FAR,
            3_600_000,
        )
        .await
        .unwrap();
    assert!(store.queue_resume("q", now_ms() + FAR).await.unwrap());
    let waiting: i64 = conn.zcard(key(&store, "queue:q:waiting")).await.unwrap();
    assert_eq!(waiting, 0);
    let due: Vec<String> = conn.zrange(key(&store, "due_tasks"), 0, -1).await.unwrap();
    assert_eq!(due.len(), 4, "every parked task is back: {due:?}");
}

/// The audit's release moves only the claim it names: a newer claim of the same Plan
/// (claimed again after a lost lease) is never taken away.
#[tokio::test]
async fn release_moves_only_the_claim_it_names() {
    let redis = Redis::start();
    let store = redis.store().await;
    let gen = own(&store, "h1").await;
    book(&store, &point("rel", now_ms() + 300)).await;
    let plan = of(&claim(&store, "h1", gen).await, "rel:birth").clone();
    let moved = store
        .release(
            0,
            "h1",
            &[(plan.plan_id.clone(), "999999".into())],
            now_ms() + FAR,
            i64::MAX,
            now_ms(),
        )
        .await
        .unwrap();
    assert_eq!(moved, 0);
    let moved = store
        .release(
            0,
            "h1",
            &[(plan.plan_id.clone(), plan.claim.clone())],
            now_ms() + FAR,
            i64::MAX,
            now_ms(),
        )
        .await
        .unwrap();
    assert_eq!(moved, 1);
}

/// A Redis at its maxmemory (noeviction) refuses new bookings, answered 507, but the
/// runs under way still record their outcomes and move on: the scripts of the firing path
/// may use memory past the limit (`allow-oom`), so no run is left Running for want of a
/// few bytes and fired again.
#[tokio::test]
async fn a_redis_at_maxmemory_refuses_bookings_but_runs_under_way_finish() {
    let redis = Redis::start();
    let store = redis.store().await;
    let mut conn = redis.conn().await;
    let gen = own(&store, "h1").await;
    book(&store, &point("before", now_ms() + 200)).await;
    let claimed = claim(&store, "h1", gen).await;
    let plan = of(&claimed, "before:birth");

    // Redis is full from here on.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let refused = store
        .book(
            &point("after", now_ms() + 200),
            IdOrigin::Given,
            now_ms(),
            1_000,
            now_ms() + FAR,
        )
        .await
        .unwrap_err();
    assert_eq!(refused.status.as_u16(), 507, "{refused:?}");
    assert_eq!(refused.code, "storage_full");

    assert_eq!(
        start(&store, "h1", gen, &[plan]).await,
        [StartOutcome::Run { attempts: 1 }]
    );
    let held = store
        .finish_lives("h1", &[done(plan, 1)], now_ms(), now_ms() + FAR)
        .await
        .unwrap();
    assert_eq!(held, [true]);
    assert_eq!(record(&redis, &store, "before").await.0.state, "Dead");
    let after = inspect::life(&mut conn, store.shard(0), "after")
        .await
        .unwrap();
    assert!(after.is_none(), "nothing of the refused booking was stored");
}

/// `/metrics` shows a backlog: Plans past their fire time that nobody has claimed, and
/// how long the oldest has waited; Plans due later are not overdue.
#[tokio::test]
async fn overdue_plans_and_the_oldest_ones_age_are_counted() {
    let redis = Redis::start();
    let store = redis.store().await;
    let mut conn = redis.conn().await;
    book(&store, &point("later", now_ms() + 600_000)).await;
    book(&store, &point("late", now_ms() + 600_000)).await;
    let stats = store.cluster_stats(now_ms()).await.unwrap();
    assert_eq!(
        (stats.due, stats.overdue, stats.oldest_overdue_ms),
        (2, 0, 0)
    );
    // No host claimed it, and its time passed a minute ago.
    let (leaf, _) = in_tree(&redis, &store, "due", "late:birth").await.unwrap();
    let _: () = conn
        .zadd(&leaf, "late:birth", now_ms() - 60_000)
        .await
        .unwrap();
    let stats = store.cluster_stats(now_ms()).await.unwrap();
    assert_eq!((stats.due, stats.overdue), (2, 1));
    assert!(
        (60_000..70_000).contains(&stats.oldest_overdue_ms),
        "{stats:?}"
    );
}

/// `host`'s renewal of shard 0 under `gen` (a 30 s lease).
async fn renew(store: &Store, host: &str, gen: u64) -> Vec<bool> {
    store
        .shard_renew(host, &[(0, gen)], 30_000, std::time::Duration::from_secs(5))
        .await
        .into_iter()
        .map(|kept| kept.unwrap())
        .collect()
}
