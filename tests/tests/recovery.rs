//! Recovery of Plans a live host holds in Redis but no longer tracks in memory: a claim
//! or start whose reply was lost (the script ran, the answer never arrived), or a run
//! whose outcome could not be recorded. The host's lease never expires, so only its own
//! audit can hand them back.

use std::time::Duration;

use kairos_e2e::{flags, now_ms, Api, Host, RedisServer, Sink};
use redis::AsyncCommands;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_host_hands_back_plans_it_holds_but_lost_track_of() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(
            &sink,
            &[
                ("--request-timeout", "1s"),
                ("--birth-delay-limit-time", "60s"),
            ],
        ),
    );
    let api = Api::new(&host);
    for id in ["orphan-preset", "orphan-running"] {
        let (status, body) = api
            .post("/schedules", &json!({"life_uuid": id, "birth_time": "2030-01-01 00:00:00", "birth": {"path": "/hook", "method": "POST"}}))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // Forge what a lost reply leaves behind: the Plans are held by this live host, one
    // Preset and one Running (its run "started" 6 s ago), nothing in its memory.
    let mut conn = redis.conn().await;
    let ks = redis.keyspace().await;
    // The host listens before it has taken its shards; a shard taken after the forgery
    // would hand the Plans back by its takeover, not by the audit under test.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for id in ["orphan-preset", "orphan-running"] {
        let owner = format!("{}owner", ks.life(id).prefix);
        loop {
            let who: Option<String> = conn.hget(&owner, "host").await.unwrap();
            if who.as_deref() == Some(host.host_id.as_str()) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{id}'s shard never taken"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let past = now_ms() - 6_000;
    for (id, entry) in [
        ("orphan-preset", format!("7|{past}|{}", host.host_id)),
        (
            "orphan-running",
            format!("7|{past}|{}|{past}|1", host.host_id),
        ),
    ] {
        // Layout 4: a Plan claimed or running is out of the due tree and in the shard's
        // `inflight` hash (`{claim}|{fire}|{host}[|{started}|{attempt}]`).
        let k = ks.life(id);
        let plan = format!("{id}:birth");
        assert!(redis.tree_remove(&k.due(), &plan).await, "{plan} was due");
        let _: () = conn.hset(k.inflight(), &plan, entry).await.unwrap();
    }

    // The audit (every second: what this host holds in Redis and does not track) hands
    // both back; they are claimed again and fire once each.
    sink.wait_until("both orphans fired", Duration::from_secs(15), |got| {
        ["orphan-preset", "orphan-running"]
            .iter()
            .all(|id| got.iter().any(|r| r.header("x-kairos-life") == Some(id)))
    })
    .await;
    for id in ["orphan-preset", "orphan-running"] {
        let life = api
            .wait_life(id, Duration::from_secs(5), |l| l["state"] == "Dead")
            .await;
        assert_eq!(sink.received_for(id).len(), 1, "{id} fired more than once");
        if id == "orphan-running" {
            // The interrupted run counted as an attempt; this is the second.
            assert_eq!(life["plans"][0]["attempts"], 2, "{life:#}");
            assert_eq!(
                sink.received_for(id)[0].header("x-kairos-execution-count"),
                Some("2")
            );
            // The cut-off attempt is in the history too, with the host it ran on.
            let history = kairos_e2e::history(&life);
            let interrupted: Vec<_> = history
                .iter()
                .filter(|r| r["outcome"] == "interrupted")
                .collect();
            assert_eq!(interrupted.len(), 1, "{history:#?}");
            assert_eq!(interrupted[0]["attempt"], 1);
            assert_eq!(interrupted[0]["host"], host.host_id.as_str());
        }
    }
    assert_eq!(redis.count_all("held").await, 0);
    assert!(host
        .log_text()
        .contains("handed back held Plans this host no longer tracked"));
}

/// A Life whose record is deleted by hand while its birth runs: the finish finds no
/// record, writes none back, and lets the Plan's claim go, so nothing is left held or
/// half-written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_life_deleted_by_hand_while_it_runs_is_not_written_back() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(1_500));
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let id = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
    let (status, body) = api
        .post(
            "/schedules",
            &json!({"life_uuid": id, "birth_time": kairos_e2e::at_ms_from_now(800),
                    "birth": {"path": "/slow", "method": "POST"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    sink.wait_count(1, Duration::from_secs(10)).await;

    // The run is under way (the sink holds its answer): delete the record by hand.
    let mut conn = redis.conn().await;
    let ks = redis.keyspace().await;
    let k = ks.life(id);
    let buckets: Option<u64> = conn.get(k.record_count()).await.unwrap();
    let mut deleted = 0;
    for b in 0..buckets.unwrap_or(1) {
        let n: i64 = conn.hdel(k.records(b), id).await.unwrap();
        deleted += n;
    }
    assert_eq!(deleted, 1, "the record was in one bucket");
    let held: Option<String> = conn
        .hget(k.inflight(), format!("{id}:birth"))
        .await
        .unwrap();
    assert!(
        held.is_some_and(|v| v.contains(&host.host_id)),
        "its birth is held while it runs"
    );

    // The finish lets the claim go and writes no record back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held: Option<String> = conn
            .hget(k.inflight(), format!("{id}:birth"))
            .await
            .unwrap();
        if held.is_none() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the claim was never let go"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !redis.life_records(k).await.contains_key(id),
        "the finish wrote the deleted record back"
    );
    let (status, _) = api.get(&format!("/schedules/{id}")).await;
    assert_eq!(status, 404);
    assert_eq!(sink.received().len(), 1, "the Life ran once");
}
