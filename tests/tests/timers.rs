//! Recurring timers (SPEC section 5) end to end: real redis-server, real kairos hosts,
//! a real HTTP sink. The DST rules are unit-tested in `host/src/schedule.rs`.

use std::time::Duration;

use kairos_e2e::*;
use serde_json::{json, Value};

fn timer(name: &str, schedule: &str, tag: &str) -> Value {
    json!({"name": name, "schedule": schedule, "action": hook(tag)})
}

/// Requests of one timer, in arrival order.
fn calls(sink: &Sink, name: &str) -> Vec<Received> {
    sink.received()
        .into_iter()
        .filter(|r| r.header("x-kairos-timer") == Some(name))
        .collect()
}

fn eta(r: &Received) -> i64 {
    r.header("x-kairos-eta").unwrap().parse().unwrap()
}

async fn runs(api: &Api, name: &str) -> Vec<Value> {
    let (status, reply) = api.get(&format!("/timers/{name}/runs?limit=200")).await;
    assert_eq!(status, 200, "{reply}");
    reply["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_second_timer_fires_once_a_second_without_overlap_across_two_hosts() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(300));
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);

    let (status, reply) = api
        .post("/timers", &timer("tick", "*/1 * * * * *", "tick"))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert!(scheduled(&reply), "{reply:#}");
    assert_eq!(reply["preview_ms"].as_array().unwrap().len(), 5);
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    let (status, _) = Api::new(&b)
        .post("/timers/tick/deactivate", &json!({}))
        .await;
    assert_eq!(status, 200);

    let got = calls(&sink, "tick");
    assert!(
        (5..=8).contains(&got.len()),
        "about one call a second over 6.5 s, got {}",
        got.len()
    );
    let etas: Vec<i64> = got.iter().map(eta).collect();
    for pair in etas.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1000,
            "one call per slot, every slot: {etas:?}"
        );
    }
    for r in &got {
        assert!(
            r.at_ms - eta(r) < 800,
            "a call came {} ms after its slot",
            r.at_ms - eta(r)
        );
        assert!(r
            .header("idempotency-key")
            .unwrap()
            .starts_with("tick:timer@"));
    }
    assert_eq!(
        sink.max_concurrent(""),
        1,
        "two runs of one timer overlapped"
    );
    let history = runs(&api, "tick").await;
    assert!(
        history.iter().all(|r| r["outcome"] != "skipped"),
        "{history:#?}"
    );
    let hosts: std::collections::BTreeSet<&str> =
        history.iter().filter_map(|r| r["host"].as_str()).collect();
    assert!(
        hosts.iter().all(|h| *h == a.host_id || *h == b.host_id),
        "{hosts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_run_makes_a_logged_skip_not_an_overlap() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(2_300));
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);

    let (status, reply) = api
        .post("/timers", &timer("slow", "*/1 * * * * *", "slow"))
        .await;
    assert_eq!(status, 200, "{reply}");
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    Api::new(&b)
        .post("/timers/slow/deactivate", &json!({}))
        .await;

    let got = calls(&sink, "slow");
    assert!((1..=3).contains(&got.len()), "{} calls", got.len());
    assert_eq!(sink.max_concurrent(""), 1, "a slow run overlapped the next");
    let history = runs(&api, "slow").await;
    let skips: Vec<&Value> = history
        .iter()
        .filter(|r| r["outcome"] == "skipped")
        .collect();
    assert!(!skips.is_empty(), "no skip logged: {history:#?}");
    for skip in &skips {
        assert!(
            skip["reason"].as_str().unwrap().contains("still going"),
            "{skip}"
        );
        assert!(skip["skipped"].as_i64().unwrap() >= 1);
        assert!(skip["should_run_at_time"].is_string());
    }
    let ran = history.iter().find(|r| r["outcome"] == "success").unwrap();
    assert!(ran["duration_ms"].as_i64().unwrap() >= 2_000, "{ran}");
    for field in ["should_run_at", "started_at", "host"] {
        assert!(!ran[field].is_null(), "runs list lacks {field}: {ran}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_now_deactivate_activate_and_next_run() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    // Once a year: nothing fires on its own during this test.
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "yearly", "schedule": "0 0 0 1 1 *", "timezone": "Europe/London",
                    "action": hook("yearly"), "priority": 1, "retries": 0, "timeout": "5s"}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let next = reply["next_run_ms"].as_i64().unwrap();
    assert!(next > now_ms() + 86_400_000, "{reply}");
    let preview: Vec<i64> = reply["preview_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(preview.len(), 5);
    assert_eq!(preview[0], next);
    assert!(preview.windows(2).all(|w| w[1] > w[0] + 300 * 86_400_000));
    let (status, reply) = api
        .post("/timers", &timer("yearly", "0 * * * * *", "x"))
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("duplicate_timer"))
    );
    let (status, _) = api
        .post("/timers", &timer("bad", "61 * * * * *", "x"))
        .await;
    assert_eq!(status, 400);
    let (status, _) = api.get("/timers/nope").await;
    assert_eq!(status, 404);

    // Run now.
    let (status, reply) = api.post("/timers/yearly/run", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_count(1, Duration::from_secs(5)).await;
    let (_, view) = api.get("/timers/yearly").await;
    assert_eq!(
        view["next_run_ms"], next,
        "run-now keeps the schedule: {view:#}"
    );

    // PATCH next_run: fires then, and the schedule goes on afterwards.
    let at = now_ms() + 1_500;
    let (status, reply) = api
        .patch("/timers/yearly", &json!({"next_run": rfc3339_ms(at)}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["next_run_ms"], at);
    let got = sink.wait_count(2, Duration::from_secs(5)).await;
    assert_eq!(eta(&got[1]), at);
    assert!(got[1].at_ms >= at);
    let view = wait_timer(&api, "yearly", |v| v["next_run_ms"] == next).await;
    assert!(scheduled(&view), "{view:#}");

    // Deactivate stops an every-second timer; activate starts it again.
    let (status, _) = api
        .post("/timers", &timer("sec", "*/1 * * * * *", "sec"))
        .await;
    assert_eq!(status, 200);
    sink.wait_until("two ticks", Duration::from_secs(5), |r| {
        r.iter()
            .filter(|r| r.header("x-kairos-timer") == Some("sec"))
            .count()
            >= 2
    })
    .await;
    let (status, reply) = api.post("/timers/sec/deactivate", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["active"], false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = calls(&sink, "sec").len();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        calls(&sink, "sec").len(),
        stopped,
        "a deactivated timer fired"
    );
    let (_, view) = api.get("/timers/sec").await;
    assert_eq!(view["state"], "Inactive", "{view:#}");
    assert!(view["preview_ms"].as_array().unwrap().is_empty());

    let (status, reply) = api.post("/timers/sec/activate", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    assert!(scheduled(&reply), "{reply:#}");
    sink.wait_until("ticks again", Duration::from_secs(5), |r| {
        r.iter()
            .filter(|r| r.header("x-kairos-timer") == Some("sec"))
            .count()
            >= stopped + 2
    })
    .await;

    let (status, list) = api.get("/timers").await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    let (status, _) = api.delete("/timers/sec").await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after_delete = calls(&sink, "sec").len();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        calls(&sink, "sec").len(),
        after_delete,
        "a deleted timer fired"
    );
    let (status, _) = api.get("/timers/sec").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_a_timer_runs_once_and_logs_the_missed_slots() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let mut host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, _) = api
        .post("/timers", &timer("down", "*/1 * * * * *", "down"))
        .await;
    assert_eq!(status, 200);
    sink.wait_until("a tick", Duration::from_secs(5), |r| !r.is_empty())
        .await;
    assert!(host.terminate(Duration::from_secs(10)));
    let before = calls(&sink, "down").len();
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(calls(&sink, "down").len(), before);

    let restarted_at = now_ms();
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let got = sink
        .wait_until("a tick after the restart", Duration::from_secs(5), |r| {
            r.iter()
                .filter(|r| r.header("x-kairos-timer") == Some("down"))
                .count()
                > before
        })
        .await;
    let late = got
        .iter()
        .filter(|r| r.header("x-kairos-timer") == Some("down"))
        .nth(before)
        .unwrap();
    assert!(
        eta(late) < restarted_at - 2_000,
        "the overdue slot runs, once"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after: Vec<i64> = calls(&sink, "down")[before..].iter().map(eta).collect();
    assert!(
        after[1..].iter().all(|e| *e > restarted_at),
        "missed slots ran one by one: {after:?}"
    );
    let history = runs(&api, "down").await;
    let missed = history
        .iter()
        .find(|r| r["outcome"] == "skipped" && r["reason"].as_str().unwrap().starts_with("missed"))
        .unwrap_or_else(|| panic!("no missed-slots record: {history:#?}"));
    assert!(missed["skipped"].as_i64().unwrap() >= 2, "{missed}");
}

/// Waiting for its next slot: in the due set, or already claimed by a host.
fn scheduled(view: &Value) -> bool {
    matches!(view["state"].as_str(), Some("Standby") | Some("Preset"))
}

async fn wait_timer(api: &Api, name: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, view) = api.get(&format!("/timers/{name}")).await;
        if status == 200 && check(&view) {
            return view;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timer {name}: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_waiting_for_a_worker_go_by_priority() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(600));
    let host = Host::start(&redis.url(), &flags(&sink, &[("--workers", "1")]));
    let api = Api::new(&host);

    // Three timers due in the same second, and a booking just before that holds the only
    // worker until they are all waiting.
    let slot_ms = (now_ms() / 1000 + 3) * 1000;
    let time_of_day = chrono::DateTime::from_timestamp_millis(slot_ms)
        .unwrap()
        .format("%H:%M:%S")
        .to_string();
    for (name, priority) in [("p4", 4), ("p1", 1), ("p3", 3)] {
        let (status, reply) = api
            .post(
                "/timers",
                &json!({"name": name, "schedule": time_of_day, "timezone": "UTC",
                        "action": hook(name), "priority": priority}),
            )
            .await;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["next_run_ms"], slot_ms);
    }
    book(&api, &point("blocker", slot_ms - 300, hook("blocker"))).await;
    let got = sink.wait_count(4, Duration::from_secs(8)).await;
    let order: Vec<&str> = got
        .iter()
        .map(|r| r.header("x-kairos-timer").unwrap_or("blocker"))
        .collect();
    assert_eq!(order, ["blocker", "p1", "p3", "p4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_timeout_fails_and_is_retried() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(1_500));
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "to", "schedule": "0 0 0 1 1 *", "action": hook("to"),
                    "timeout": "300ms", "retries": 1}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    api.post("/timers/to/run", &json!({})).await;
    sink.wait_count(2, Duration::from_secs(5)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let history = loop {
        let history = runs(&api, "to").await;
        if history.len() >= 2 {
            break history;
        }
        assert!(std::time::Instant::now() < deadline, "{history:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Newest first: the retry failed for good, the first attempt was retried.
    assert_eq!(history[0]["outcome"], "failed", "{history:#?}");
    assert_eq!(history[1]["outcome"], "retry", "{history:#?}");
    for run in &history {
        assert!(
            run["error"].as_str().unwrap().contains("timeout of 300 ms"),
            "{run}"
        );
        assert!(run["duration_ms"].as_i64().unwrap() < 1_000, "{run}");
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(sink.received().len(), 2, "retries: 1 means two attempts");
    let (_, view) = api.get("/timers/to").await;
    assert_eq!(view["last_outcome"], "failed");
    assert!(
        scheduled(&view),
        "a failed run leaves the schedule going: {view:#}"
    );
}
