//! Adversarial review: interleavings of DELETE/PATCH with runs, retries after a cancel,
//! hostile inputs, sweep racing a run, and the self-audit. Each test names the invariant
//! it checks. Most began as failing tests of bugs the review found (now fixed, kept as
//! regression tests); tests marked "GUARD" pinned down a tricky interleaving that was
//! already right.

use std::time::{Duration, Instant};

use kairos_e2e::*;
use serde_json::{json, Value};

fn is_plan(kind: &'static str) -> impl Fn(&Received) -> bool {
    move |r: &Received| r.header("x-kairos-plan") == Some(kind)
}

fn retrying_hook(tag: &str, retry_count: u32, retry_interval_s: f64) -> Value {
    json!({
        "path": "/hook", "method": "POST", "body": {"tag": tag},
        "retry_count": retry_count, "retry_interval": retry_interval_s,
    })
}

// ---------------------------------------------------------------------------------------
// Was BUG 1: DELETE ?force=true while a term's birth ran ended the Life (Stillbirth), then
// the birth's finish_run turned it back into Alive with a death that would never run.
// Now a Life is never finished while one of its Plans runs: a DELETE of a term whose
// birth runs (force or not) asks for the death to run right after the birth.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_delete_during_a_term_birth_is_not_undone_by_the_birth_finishing() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    sink.set_delay(Duration::from_millis(1500));

    let id = "force-term-birth";
    let birth_ms = now_ms() + 1000;
    let mut body = term(id, birth_ms, birth_ms + 60_000, hook("on"), hook("off"));
    body["resource_id"] = json!("res-force-term");
    book(&api, &body).await;
    sink.wait_until("the birth call", Duration::from_secs(5), |got| {
        got.iter().any(is_plan("birth"))
    })
    .await;
    let (status, reply) = api.delete(&format!("/schedules/{id}?force=true")).await;
    assert_eq!(status, 200, "{reply:#}");
    assert_eq!(reply["state"], "Inexistent", "{reply:#}");

    // The birth returns; the death runs at once instead of 60 s later; the Life ends Dead
    // and never sits Alive with a cancelled death (the resource is not left activated).
    let life = api
        .wait_life(id, Duration::from_secs(8), |l| state(l) == "Dead")
        .await;
    assert_eq!(plan(&life, "death")["state"], "Done", "{life:#}");
    let deaths = sink
        .received_for(id)
        .iter()
        .filter(|r| is_plan("death")(r))
        .count();
    assert_eq!(deaths, 1, "{life:#}");
    let k = redis.keyspace().await.resource("res-force-term").clone();
    assert!(redis.finished_at(&k, id).await.is_some());
}

// ---------------------------------------------------------------------------------------
// Was BUG 2: DELETE ?force=true while a point birth ran and then asked for a retry left
// the Life Stillbirth with the birth running again. Now force refuses (409) while a Plan
// runs; once the run has returned and waits for its retry, force ends the Life and
// nothing runs any more.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_delete_during_a_failing_birth_stops_its_retries() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    sink.set_delay(Duration::from_millis(800));
    sink.answer(&[503, 503, 503, 503]);

    let id = "force-point-retry";
    let birth_ms = now_ms() + 1000;
    book(&api, &point(id, birth_ms, retrying_hook(id, 3, 0.2))).await;
    sink.wait_count(1, Duration::from_secs(5)).await;
    let (status, reply) = api.delete(&format!("/schedules/{id}?force=true")).await;
    assert_eq!(status, 409, "{reply:#}");
    assert_eq!(reply["error"]["code"], "plan_running");
    // The first run returns 503 and waits 200 ms for its retry: DELETE it then.
    sink.set_delay(Duration::from_millis(0));
    let deadline = Instant::now() + Duration::from_secs(5);
    let reply = loop {
        let (status, reply) = api.delete(&format!("/schedules/{id}?force=true")).await;
        if status == 200 {
            break reply;
        }
        assert_eq!(reply["error"]["code"], "plan_running", "{reply:#}");
        assert!(Instant::now() < deadline, "force DELETE never went through");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reply["state"], "Stillbirth");
    let calls_at_delete = sink.received_for(id).len();

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let life = api.wait_life(id, Duration::from_secs(1), |_| true).await;
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    assert_eq!(plan(&life, "birth")["state"], "Cancelled", "{life:#}");
    assert_eq!(
        sink.received_for(id).len(),
        calls_at_delete,
        "the birth ran again after the force DELETE: {life:#}"
    );
}

// ---------------------------------------------------------------------------------------
// Regression test (review bug 3, fixed): DELETE (no force) while a term's birth runs sets cancel_requested; if that run
// asks for a retry, the birth is started again after the cancel was acknowledged.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_during_a_term_birth_does_not_start_the_birth_again() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    sink.set_delay(Duration::from_millis(800));
    sink.answer(&[503]);

    let id = "cancel-term-retry";
    let birth_ms = now_ms() + 1000;
    book(
        &api,
        &term(
            id,
            birth_ms,
            birth_ms + 60_000,
            retrying_hook("on", 2, 0.2),
            hook("off"),
        ),
    )
    .await;
    sink.wait_count(1, Duration::from_secs(5)).await;
    let (status, reply) = api.delete(&format!("/schedules/{id}")).await;
    assert_eq!(status, 200, "{reply:#}");

    let life = api
        .wait_life(id, Duration::from_secs(8), |l| {
            matches!(state(l), "Dead" | "Stillbirth")
        })
        .await;
    let births = sink
        .received_for(id)
        .iter()
        .filter(|r| is_plan("birth")(r))
        .count();
    assert_eq!(
        births, 1,
        "the birth was started {births} times; the Life was cancelled during the first: {life:#}"
    );
}

// ---------------------------------------------------------------------------------------
// Was BUG 4: DELETE ?force=true of an Alive term while its death ran and failed left the
// Life Dead with the death retried. Now force refuses (409) while the death runs; between
// retries it ends the Life and the death stops ("until it succeeds or the Life is
// deleted", SPEC 1).
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_delete_during_a_failing_death_stops_death_retries() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let id = "force-death-retry";
    let birth_ms = now_ms() + 1000;
    book(
        &api,
        &term(id, birth_ms, birth_ms + 1200, hook("on"), hook("off")),
    )
    .await;
    api.wait_life(id, Duration::from_secs(5), |l| state(l) == "Alive")
        .await;
    sink.set_delay(Duration::from_millis(800));
    sink.answer(&[500; 20]);
    sink.wait_until("the death call", Duration::from_secs(5), |got| {
        got.iter().any(is_plan("death"))
    })
    .await;
    let (status, reply) = api.delete(&format!("/schedules/{id}?force=true")).await;
    assert_eq!(status, 409, "{reply:#}");
    assert_eq!(reply["error"]["code"], "plan_running");
    // Between two failing runs (death_retry_interval 300 ms) the force DELETE goes through.
    let deadline = Instant::now() + Duration::from_secs(8);
    let reply = loop {
        let (status, reply) = api.delete(&format!("/schedules/{id}?force=true")).await;
        if status == 200 {
            break reply;
        }
        assert_eq!(reply["error"]["code"], "plan_running", "{reply:#}");
        assert!(Instant::now() < deadline, "force DELETE never went through");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reply["state"], "Dead");
    let deaths_at_delete = sink
        .received_for(id)
        .iter()
        .filter(|r| is_plan("death")(r))
        .count();

    // death_retry_interval is 300 ms: several retries would have happened by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let deaths = sink
        .received_for(id)
        .iter()
        .filter(|r| is_plan("death")(r))
        .count();
    let life = api.wait_life(id, Duration::from_secs(1), |_| true).await;
    assert_eq!(plan(&life, "death")["state"], "Cancelled", "{life:#}");
    assert_eq!(
        deaths, deaths_at_delete,
        "the death ran again after the Life was force-deleted: {life:#}"
    );
}

// ---------------------------------------------------------------------------------------
// Regression test (review bug 5, fixed): PATCH of an Alive term's death (a Plan still Standby) is refused with 406,
// because the merged booking re-checks the execution guard on the past birth time.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_moves_the_death_of_an_alive_life() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let id = "extend-alive";
    let birth_ms = now_ms() + 1000;
    let death_ms = birth_ms + 20_000;
    book(&api, &term(id, birth_ms, death_ms, hook("on"), hook("off"))).await;
    api.wait_life(id, Duration::from_secs(5), |l| state(l) == "Alive")
        .await;
    // The death Plan is pending (Standby in `due`, or Preset: claimed in the look-ahead).
    let k = redis.keyspace().await.life(id).clone();
    let dstate = redis.plan_field(&k, &format!("{id}:death"), "state").await;
    assert!(
        matches!(dstate.as_deref(), Some("Standby" | "Preset")),
        "{dstate:?}"
    );

    let later = death_ms + 60_000;
    let (status, reply) = api
        .patch(
            &format!("/schedules/{id}"),
            &json!({"death_time": rfc3339_ms(later)}),
        )
        .await;
    assert_eq!(
        status, 200,
        "extending an Alive Life's term (its death Plan is Standby) was refused: {reply:#}"
    );
    let life = api.wait_life(id, Duration::from_secs(1), |_| true).await;
    assert_eq!(plan(&life, "death")["fire_at_ms"], json!(later));
}

// ---------------------------------------------------------------------------------------
// Regression test (review bug 6, fixed): Hostile input: a webhook request_timeout of 1e16 s on a Plan with a resource
// makes start_run's `SET lock PX <ttl>` fail inside the script, so the whole batch errors,
// is rescheduled, errors again... The booking is accepted (200) and never runs.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_request_timeout_is_refused_or_runs() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let id = "poison";
    let birth_ms = now_ms() + 1000;
    let mut body = point(
        id,
        birth_ms,
        json!({"path": "/hook", "method": "POST", "request_timeout": 1e16}),
    );
    body["resource_id"] = json!("res-poison");
    // A bystander booked for the same millisecond, without a resource.
    let bystander = "bystander";
    let (status, reply) = api.post("/schedules", &body).await;
    // Durations over a day are refused at booking, so nothing out of range is ever stored.
    assert_eq!(status, 400, "{reply:#}");
    assert_eq!(reply["error"]["code"], "invalid_duration");
    if status == 400 {
        return;
    }
    book(&api, &point(bystander, birth_ms, hook(bystander))).await;

    tokio::time::sleep(Duration::from_millis(4000)).await;
    let life = api.wait_life(id, Duration::from_secs(1), |_| true).await;
    let other = api
        .wait_life(bystander, Duration::from_secs(1), |_| true)
        .await;
    let log = host.log_text();
    let errors = log.matches("cannot start runs").count();
    let first_error = log
        .lines()
        .find(|l| l.contains("cannot start runs"))
        .unwrap_or("");
    assert_eq!(
        sink.received_for(id).len(),
        1,
        "an accepted booking did not run within 3 s of its time (bystander: {}, its birth {}, {} failed start_run calls, first: {first_error}); life: {life:#}",
        state(&other),
        plan(&other, "birth")["state"],
        errors
    );
}

// ---------------------------------------------------------------------------------------
// Regression test (review bug 7, fixed): The sweep deletes a force-deleted Life while its birth still runs; when the run
// ends, finish_run's 'lost' branch HSETs the run record into `life:{id}` and so creates
// a zombie Life hash: no state, in no index, never swept again.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ending_after_its_life_was_swept_leaves_no_zombie() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // 0.00001 days = 864 ms of retention; the sweep runs every second.
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--schedule-history-duration-days", "0.00001")]),
    );
    let api = Api::new(&host);
    sink.set_delay(Duration::from_millis(3500));

    let id = "swept-while-running";
    let birth_ms = now_ms() + 1000;
    book(&api, &point(id, birth_ms, hook(id))).await;
    sink.wait_count(1, Duration::from_secs(5)).await;
    // A Life is never finished while its Plan runs, so the sweep cannot reach it here; a
    // host that lost the Plan (stalled past its lease) can still finish a run after the
    // Life is gone. Remove the Life's keys as the sweep would, while the call is under way.
    let k = redis.keyspace().await.life(id).clone();
    let n: Option<u64> = redis::cmd("GET")
        .arg(k.record_count())
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    let bucket =
        kairos::store::inspect::bucket_index(kairos::store::inspect::id_hash(id), n.unwrap_or(1));
    let deleted: i64 = redis::cmd("HDEL")
        .arg(k.records(bucket))
        .arg(id)
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the record was where layout 4 puts it");
    // The call returns (3.5 s after it started) and its outcome is recorded.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let zombie = redis.life_record(&k, id).await;
    let (status, view) = api.get(&format!("/schedules/{id}")).await;
    assert!(
        zombie.is_none(),
        "a swept Life came back (record {:?}, finished: {:?}); GET answers {status}: {view:#}",
        zombie.map(|z| z.0),
        redis.finished_at(&k, id).await,
    );
    assert_eq!(
        redis.plan_field(&k, &format!("{id}:birth"), "claims").await,
        None,
        "nothing of it is left in flight"
    );
}

// ---------------------------------------------------------------------------------------
// GUARD. A Plan kept waiting by an earlier, unfinished Plan of its resource, long past
// due, stays with its host (the audit hands back only what a host does not track) and
// runs exactly once when the earlier Plan ends.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_a_plan_waiting_for_its_resource_runs_once_when_it_frees() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--request-timeout", "1s")]));
    let api = Api::new(&host);

    // An earlier (phantom) Plan of the resource is unfinished for the next 7 s.
    let mut conn = redis.conn().await;
    let k = redis.keyspace().await.resource("res-busy").clone();
    let _: () = redis::cmd("ZADD")
        .arg(k.order("res-busy"))
        .arg(now_ms() - 60_000)
        .arg("phantom:birth")
        .query_async(&mut conn)
        .await
        .unwrap();
    let id = "busy-point";
    let birth_ms = now_ms() + 1000;
    let mut body = point(id, birth_ms, hook(id));
    body["resource_id"] = json!("res-busy");
    book(&api, &body).await;
    tokio::time::sleep(Duration::from_millis(7000)).await;
    assert!(
        sink.received_for(id).is_empty(),
        "ran while an earlier Plan of its resource was unfinished"
    );
    let claims_while_waiting = redis
        .plan_field(&k, &format!("{id}:birth"), "claims")
        .await
        .unwrap();
    let _: () = redis::cmd("ZREM")
        .arg(k.order("res-busy"))
        .arg("phantom:birth")
        .query_async(&mut conn)
        .await
        .unwrap();

    let life = api
        .wait_life(id, Duration::from_secs(5), |l| state(l) == "Dead")
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.received_for(id).len(), 1, "{life:#}");
    // The run that ended it marks the record with its host and claim.
    let (record, _) = redis.life_record(&k, id).await.unwrap();
    assert_eq!(
        record.done_by,
        Some(format!("{}#{claims_while_waiting}", host.host_id)),
        "the waiting Plan stayed with its host under one claim"
    );
    assert_eq!(
        redis.zcard(&k.order("res-busy")).await,
        0,
        "it left the order set"
    );
}

// ---------------------------------------------------------------------------------------
// GUARD. DELETE (no force) of an Alive term whose death is in a retry wait moves the death
// to now; it runs once more and the Life ends Dead.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_delete_during_a_death_retry_wait_runs_the_death_now() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--death-retry-interval", "30s")]),
    );
    let api = Api::new(&host);

    let id = "death-wait-cancel";
    let birth_ms = now_ms() + 1000;
    book(
        &api,
        &term(id, birth_ms, birth_ms + 1200, hook("on"), hook("off")),
    )
    .await;
    api.wait_life(id, Duration::from_secs(5), |l| state(l) == "Alive")
        .await;
    sink.answer(&[500]);
    api.wait_life(id, Duration::from_secs(5), |l| {
        plan(l, "death")["attempts"] == 1
            && matches!(
                plan(l, "death")["state"].as_str(),
                Some("Standby" | "Preset")
            )
    })
    .await;
    let (status, reply) = api.delete(&format!("/schedules/{id}")).await;
    assert_eq!(status, 200, "{reply:#}");
    let life = api
        .wait_life(id, Duration::from_secs(3), |l| state(l) == "Dead")
        .await;
    assert_eq!(plan(&life, "death")["attempts"], 2, "{life:#}");
    assert_eq!(
        redis
            .tree_score(
                &redis.keyspace().await.life(id).due(),
                &format!("{id}:death")
            )
            .await,
        None
    );
}

// ---------------------------------------------------------------------------------------
// Was BUG 8: DELETE ?force=true while a point birth ran on host A answered Stillbirth, and
// after A died host B ran the birth again for a finished Life. Now the DELETE is refused
// (409) while the birth runs, so the Life stays pending: B re-runs the interrupted birth
// (at-least-once, same Idempotency-Key) and the Life ends Dead, consistently.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_delete_refused_during_a_run_keeps_the_life_consistent_after_its_host_dies() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let mut a = Host::start(&redis.url(), &flags(&sink, &[]));
    let api_a = Api::new(&a);
    sink.set_delay(Duration::from_millis(4000));

    let id = "force-then-host-dies";
    let birth_ms = now_ms() + 1000;
    book(&api_a, &point(id, birth_ms, hook(id))).await;
    sink.wait_count(1, Duration::from_secs(5)).await;
    let (status, reply) = api_a.delete(&format!("/schedules/{id}?force=true")).await;
    assert_eq!(status, 409, "{reply:#}");
    assert_eq!(reply["error"]["code"], "plan_running");

    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api_b = Api::new(&b);
    sink.set_delay(Duration::from_millis(0));
    a.kill9();
    // Lease 2 s; B's supervisor looks every ~670 ms.
    let life = api_b
        .wait_life(id, Duration::from_secs(10), |l| state(l) == "Dead")
        .await;
    let calls = sink.received_for(id);
    assert_eq!(
        calls.len(),
        2,
        "one interrupted run and one re-run: {life:#}"
    );
    assert_eq!(
        calls[0].header("idempotency-key"),
        calls[1].header("idempotency-key")
    );
    assert_eq!(plan(&life, "birth")["state"], "Done", "{life:#}");
}

// ---------------------------------------------------------------------------------------
// Regression test (review bug 9, fixed): Hostile input: retry_interval near i64::MAX ms. executor::decide computes
// `now_ms + retry_interval_ms as i64`, which overflows: in a debug build the run task
// panics, its outcome is never recorded, and the Plan stays Running (in in_flight, so
// the audit never hands it back) forever; in a release build it wraps negative and the
// retry fires at once instead of ~292 million years later.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_retry_interval_is_refused_or_honoured() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    sink.answer(&[503, 503]);

    let id = "huge-retry-interval";
    let birth_ms = now_ms() + 1000;
    let body = point(id, birth_ms, retrying_hook(id, 1, 9_223_371_000_000_000.0));
    let (status, reply) = api.post("/schedules", &body).await;
    // Durations over a day are refused at booking, so nothing out of range is ever stored.
    assert_eq!(status, 400, "{reply:#}");
    assert_eq!(reply["error"]["code"], "invalid_duration");
    if status == 400 {
        return;
    }
    sink.wait_count(1, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let life = api.wait_life(id, Duration::from_secs(1), |_| true).await;
    let calls = sink.received_for(id).len();
    let birth_state = plan(&life, "birth")["state"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let panicked = host.log_text().contains("overflow");
    assert!(
        calls == 1 && birth_state == "Standby",
        "after a 503 the birth should wait for its (far) retry: {calls} calls, birth {birth_state}, \
         host log mentions an overflow: {panicked}; {life:#}"
    );
}

// ---------------------------------------------------------------------------------------
// Regression test (review bug 10, fixed): Hostile input: a duration of 1e20 seconds makes booking::parse_seconds call
// Duration::from_secs_f64, which panics; the handler task dies and the client gets a
// dropped connection instead of a 400.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_range_duration_is_a_400_not_a_panic() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let base = format!("http://{}", host.addr);
    let body = point(
        "huge-duration",
        now_ms() + 60_000,
        json!({"path": "/hook", "method": "POST", "request_timeout": 1e20}),
    );
    let reply =
        tokio::task::spawn(async move { Api::at(&base).post("/schedules", &body).await }).await;
    let log = host.log_text();
    let panicked = log.lines().find(|l| l.contains("panicked")).unwrap_or("");
    match reply {
        Ok((status, reply)) => assert_eq!(status, 400, "{reply:#}"),
        Err(e) => panic!("the request got no answer ({e}); host log: {panicked}"),
    }
}
