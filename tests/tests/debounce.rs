//! Debounced bookings (`debounce: {key, period, max_wait}`, Inngest's and Trigger.dev's
//! semantics) end to end: a burst fires once with its last payload, a stream still fires
//! by max_wait, keys do not touch each other, and the answer names the Life that fires.

use std::time::{Duration, Instant};

use kairos_e2e::*;
use serde_json::{json, Value};

fn debounced(tag: &str, key: &str, period: &str, max_wait: &str) -> Value {
    json!({"birth": hook(tag), "debounce": {"key": key, "period": period, "max_wait": max_wait}})
}

fn tag_of(r: &Received) -> String {
    let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    body["tag"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_fires_once_with_its_last_payload() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let mut lives = Vec::new();
    let first_at = now_ms();
    let mut last_at = first_at;
    for n in 0..10 {
        last_at = now_ms();
        let (status, reply) = api
            .post(
                "/schedules",
                &debounced(&format!("burst-{n}"), "cust-1", "1500ms", "1h"),
            )
            .await;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(
            reply["debounced"].as_bool().unwrap_or(false),
            n > 0,
            "{reply}"
        );
        lives.push(reply["life_uuid"].as_str().unwrap().to_string());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        lives.iter().all(|l| l == &lives[0]),
        "one Life for the key: {lives:?}"
    );
    // Another key is its own window.
    let (status, other) = api
        .post("/schedules", &debounced("other", "cust-2", "1500ms", "1h"))
        .await;
    assert_eq!(status, 200, "{other}");
    assert_ne!(other["life_uuid"], lives[0].as_str());
    assert!(other.get("debounced").is_none(), "{other}");

    let (_, life) = api.get(&format!("/schedules/{}", lives[0])).await;
    assert_eq!(state(&life), "Inexistent", "{life:#}");
    assert_eq!(
        life["debounce"],
        json!({"key": "cust-1", "bookings": 10}),
        "{life:#}"
    );
    sink.wait_count(2, Duration::from_secs(6)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let got = sink.received();
    let burst: Vec<&Received> = got
        .iter()
        .filter(|r| tag_of(r).starts_with("burst"))
        .collect();
    assert_eq!(
        burst.len(),
        1,
        "the burst fired once: {:?}",
        got.iter().map(tag_of).collect::<Vec<_>>()
    );
    assert_eq!(tag_of(burst[0]), "burst-9", "with the last payload");
    assert_eq!(burst[0].header("x-kairos-life"), Some(lives[0].as_str()));
    assert!(
        burst[0].at_ms >= last_at + 1_450 && burst[0].at_ms > first_at + 2_000,
        "it fired {} ms after the last booking, before its period had passed",
        burst[0].at_ms - last_at
    );
    assert_eq!(got.iter().filter(|r| tag_of(r) == "other").count(), 1);

    // The window closed when its Life fired: the next booking starts a new Life.
    let (status, again) = api
        .post("/schedules", &debounced("after", "cust-1", "1s", "1h"))
        .await;
    assert_eq!(status, 200, "{again}");
    assert_ne!(again["life_uuid"], lives[0].as_str());
    assert!(again.get("debounced").is_none(), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_still_fires_by_max_wait() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    // A booking every 200 ms for 6 s, each one pushing the fire time 1 s out: without
    // max_wait (2 s) it would not fire before the stream ends.
    let start = Instant::now();
    let first_at = now_ms();
    let mut n = 0;
    let mut answers = Vec::new();
    while start.elapsed() < Duration::from_secs(6) && n < 100 {
        let (status, reply) = api
            .post(
                "/schedules",
                &debounced(&format!("s-{n}"), "stream", "1s", "2s"),
            )
            .await;
        assert_eq!(status, 200, "{reply}");
        answers.push(reply);
        n += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let got = sink.received();
    assert!(
        (2..=4).contains(&got.len()),
        "a 6 s stream with max_wait 2 s fires about every 2 s; fired {}",
        got.len()
    );
    let first = &got[0];
    assert!(
        first.at_ms <= first_at + 2_000 + 400,
        "the first fire came {} ms after the first booking, past max_wait",
        first.at_ms - first_at
    );
    // Each answer names the Life that fires and the time it will (capped by max_wait).
    let first_life = answers[0]["life_uuid"].as_str().unwrap();
    let capped: Vec<&Value> = answers
        .iter()
        .filter(|a| a["life_uuid"] == first_life)
        .collect();
    assert!(capped.len() > 3, "{answers:#?}");
    let cap = capped[0]["birth_time_ms"].as_i64().unwrap() - 1_000 + 2_000;
    for a in &capped {
        assert!(a["birth_time_ms"].as_i64().unwrap() <= cap, "{a}");
    }
    assert_eq!(
        capped.last().unwrap()["birth_time_ms"].as_i64().unwrap(),
        cap
    );
    // It fired with the payload of the last booking its window took.
    let last_tag = format!("s-{}", capped.len() - 1);
    assert_eq!(tag_of(first), last_tag);
    assert_eq!(first.header("x-kairos-life"), Some(first_life));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debounce_is_refused_where_it_cannot_mean_anything() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let cases = [
        json!({"birth": hook("x"), "debounce": {"key": "k"}}),
        json!({"birth": hook("x"), "debounce": {"key": "", "period": 5}}),
        json!({"birth": hook("x"), "debounce": {"key": "k", "period": 0}}),
        json!({"birth": hook("x"), "debounce": {"key": "k", "period": "10s", "max_wait": "5s"}}),
        json!({"birth": hook("x"), "debounce": "k"}),
        json!({"birth": hook("x"), "birth_time": "2030-01-01T00:00:00Z", "debounce": {"key": "k", "period": 5}}),
        json!({"birth": hook("x"), "life_uuid": "mine", "debounce": {"key": "k", "period": 5}}),
        json!({"birth": hook("x"), "resource_id": "r", "debounce": {"key": "k", "period": 5}}),
        json!({"schedule_type": "term", "birth": hook("x"), "death": hook("y"), "death_time": "2030-01-01T00:00:00Z", "debounce": {"key": "k", "period": 5}}),
    ];
    for body in cases {
        let (status, reply) = api.post("/schedules", &body).await;
        assert_eq!(status, 400, "{body} -> {reply}");
        assert_eq!(
            reply["error"]["code"], "invalid_debounce",
            "{body} -> {reply}"
        );
    }
    let typo = json!({"birth": hook("x"), "debounce": {"key": "k", "period": 5, "max_wiat": 9}});
    let (status, reply) = api.post("/schedules", &typo).await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["code"], "unknown_field", "{reply}");
    // A period inside the execution guard is too soon, as any booking would be.
    let (status, reply) = api
        .post("/schedules", &debounced("x", "k", "100ms", "1s"))
        .await;
    assert_eq!(status, 406, "{reply}");
    // PATCH takes no debounce.
    let (status, booked) = api
        .post("/schedules", &debounced("x", "k", "1h", "2h"))
        .await;
    assert_eq!(status, 200, "{booked}");
    let id = booked["life_uuid"].as_str().unwrap();
    let (status, reply) = api
        .patch(
            &format!("/schedules/{id}"),
            &json!({"debounce": {"key": "k", "period": 5}}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(reply["error"]["code"], "invalid_debounce");
    // A cancelled Life closes its window.
    let (status, _) = api.delete(&format!("/schedules/{id}")).await;
    assert_eq!(status, 200);
    let (status, next) = api
        .post("/schedules", &debounced("x", "k", "1h", "2h"))
        .await;
    assert_eq!(status, 200, "{next}");
    assert_ne!(next["life_uuid"], id);
    assert!(sink.received().is_empty());
}
