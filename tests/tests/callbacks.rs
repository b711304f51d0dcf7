//! Callbacks (`on_success` / `on_failure` on any action, QStash's callbacks) end to end:
//! run once with the outcome when a Life's Plan, a queue task or a timer run finishes for
//! good, booked in the same write as the outcome.

use std::time::Duration;

use kairos_e2e::*;
use serde_json::{json, Value};

fn hook_with(path: &str, extra: Value) -> Value {
    let mut a = json!({"path": path, "method": "POST"});
    a.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    a
}

fn body(r: &Received) -> Value {
    serde_json::from_slice(&r.body).unwrap_or(Value::Null)
}

fn at(path: &str, got: &[Received]) -> Vec<Received> {
    got.iter().filter(|r| r.path == path).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_life_calls_on_success_once_with_its_outcome() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let id = "cb-ok";
    let birth = hook_with(
        "/work",
        json!({"on_success": {"path": "/done", "method": "POST"},
               "on_failure": {"path": "/failed", "method": "POST"}}),
    );
    let (status, reply) = api
        .post("/schedules", &point(id, now_ms() + 1_000, birth))
        .await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_count(2, Duration::from_secs(8)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = sink.received();
    assert_eq!(at("/work", &got).len(), 1);
    assert!(at("/failed", &got).is_empty());
    let done = at("/done", &got);
    assert_eq!(done.len(), 1, "the callback ran once: {got:?}");
    let outcome = body(&done[0]);
    assert_eq!(outcome["callback_of"], format!("{id}:birth"), "{outcome}");
    assert_eq!(outcome["life_uuid"], id);
    assert_eq!(outcome["plan"], "birth");
    assert_eq!(outcome["outcome"], "success");
    assert_eq!(outcome["status"], 200);
    assert_eq!(outcome["attempts"], 1);
    assert!(outcome["duration_ms"].is_u64());
    // The callback is a Life of its own, which says whose callback it is.
    let cb = done[0].header("x-kairos-life").unwrap().to_string();
    assert_ne!(cb, id);
    let (status, life) = api.get(&format!("/schedules/{cb}")).await;
    assert_eq!(status, 200, "{life}");
    assert_eq!(life["callback_of"], format!("{id}:birth"), "{life:#}");
    assert_eq!(state(&life), "Dead");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_birth_that_fails_for_good_calls_on_failure_after_its_last_retry() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // The birth's two attempts fail; the callback is answered 200.
    sink.answer(&[500, 500]);
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let id = "cb-fail";
    let birth = hook_with(
        "/work",
        json!({"retry_count": 1, "retry_interval": 0.2,
               "on_success": {"path": "/done", "method": "POST"},
               "on_failure": {"path": "/failed", "method": "PUT", "headers": {"x-team": "ops"}}}),
    );
    let (status, reply) = api
        .post("/schedules", &point(id, now_ms() + 1_000, birth))
        .await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_count(3, Duration::from_secs(8)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = sink.received();
    assert_eq!(at("/work", &got).len(), 2, "{got:?}");
    assert!(at("/done", &got).is_empty());
    let failed = at("/failed", &got);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].method, "PUT");
    assert_eq!(failed[0].header("x-team"), Some("ops"));
    let outcome = body(&failed[0]);
    assert_eq!(outcome["outcome"], "failure", "{outcome}");
    assert_eq!(outcome["status"], 500);
    assert_eq!(outcome["attempts"], 2);
    assert!(outcome["error"].is_string(), "{outcome}");
    let (_, life) = api.get(&format!("/schedules/{id}")).await;
    assert_eq!(state(&life), "Stillbirth");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_and_timers_call_their_callbacks() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    api.put("/queues/q", &json!({"rate": 0, "retry": {"limit": 0}}))
        .await;
    let (status, reply) = api
        .post(
            "/queues/q/tasks",
            &json!({"name": "t1", "action": hook_with("/task", json!({"on_success": {"path": "/task-done", "method": "POST"}}))}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "tick", "schedule": "*/1 * * * * *",
                    "action": hook_with("/tick", json!({"on_success": {"path": "/tick-done", "method": "POST"}}))}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_until("both callbacks", Duration::from_secs(8), |r| {
        r.iter().any(|r| r.path == "/task-done") && r.iter().any(|r| r.path == "/tick-done")
    })
    .await;
    api.post("/timers/tick/deactivate", &json!({})).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let got = sink.received();
    let task_done = at("/task-done", &got);
    assert_eq!(task_done.len(), 1);
    let outcome = body(&task_done[0]);
    assert_eq!(
        (outcome["queue"].clone(), outcome["task"].clone()),
        (json!("q"), json!("t1"))
    );
    assert_eq!(outcome["plan"], "task");
    assert_eq!(outcome["outcome"], "success");
    // One callback per timer run.
    let ticks = at("/tick", &got).len();
    let tick_done = at("/tick-done", &got);
    assert_eq!(tick_done.len(), ticks, "a callback per run");
    assert_eq!(body(&tick_done[0])["timer"], "tick");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_is_checked_when_booked() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    for (callback, code) in [
        (
            json!({"path": "/x", "method": "POST", "body": {"a": 1}}),
            "invalid_action",
        ),
        (
            json!({"path": "/x", "method": "POST", "on_success": {"path": "/y", "method": "POST"}}),
            "invalid_action",
        ),
        (json!({"path": "x", "method": "POST"}), "invalid_action"),
        (json!({"plugin": "nope"}), "unknown_plugin"),
        (json!("later"), "invalid_action"),
    ] {
        let birth = hook_with("/work", json!({"on_failure": callback}));
        let (status, reply) = api
            .post("/schedules", &point("bad-cb", now_ms() + 60_000, birth))
            .await;
        assert_eq!(status, 400, "{callback} -> {reply}");
        assert_eq!(reply["error"]["code"], code, "{callback} -> {reply}");
    }
    let (status, _) = api.get("/schedules/bad-cb").await;
    assert_eq!(status, 404, "nothing was stored");
}
