//! Recovery of Plans a live host holds in Redis but no longer tracks in memory: a claim
//! or start whose reply was lost (the script ran, the answer never arrived), or a run
//! whose outcome could not be recorded. The host's lease never expires, so only its own
//! audit can hand them back.

use std::time::Duration;

use kairos_e2e::{fast_flags, flags_with, now_ms, Api, Host, RedisServer, Sink};
use redis::AsyncCommands;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_host_hands_back_plans_it_holds_but_lost_track_of() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags_with(
            fast_flags(),
            &[
                ("--gateway-url", &sink.base_url()),
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
    let past = now_ms() - 6_000;
    let held = format!("kairos:held:{}", host.host_id);
    for (id, state) in [("orphan-preset", "Preset"), ("orphan-running", "Running")] {
        let plan = format!("{id}:birth");
        let _: () = conn.zrem("kairos:due", &plan).await.unwrap();
        let _: () = redis::cmd("HSET")
            .arg(format!("kairos:plan:{plan}"))
            .arg(&[
                "state",
                state,
                "lease_owner",
                &host.host_id,
                "claims",
                "7",
                "fire_at_ms",
                &past.to_string(),
            ])
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = conn.zadd(&held, &plan, past).await.unwrap();
    }
    let _: () = conn
        .hset("kairos:plan:orphan-running:birth", "attempts", 1)
        .await
        .unwrap();

    // The audit (cutoff: twice the 2 s lease plus the 1 s request timeout) hands both back;
    // they are claimed again and fire once each.
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
        }
    }
    let left: i64 = conn.zcard(&held).await.unwrap();
    assert_eq!(left, 0);
    assert!(host
        .log_text()
        .contains("handed back held Plans long past due"));
}
