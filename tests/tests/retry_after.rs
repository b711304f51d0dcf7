//! Rate-limited targets (issue #14 item 8, RFC 9110 section 10.2.3): `429 Too Many
//! Requests` is retried by default, and a target's `Retry-After` on a retryable answer
//! sets when the next attempt comes, for Lives, timers and queue tasks alike, within
//! their retry limits and capped (a queue task's by its queue's `max_backoff`), and is
//! recorded in the run's history.

use std::time::Duration;

use kairos_e2e::*;
use serde_json::{json, Value};

/// Milliseconds between the calls that reached the sink for `life`.
fn gaps(calls: &[Received]) -> Vec<i64> {
    calls.windows(2).map(|p| p[1].at_ms - p[0].at_ms).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lives_retry_waits_as_long_as_the_target_asks() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let action =
        json!({"path": "/hook", "method": "POST", "retry_count": 2, "retry_interval": 0.2});

    // 429 with Retry-After: 2 (seconds), then 200: the retry comes 2 s later, not after
    // the action's 200 ms.
    sink.set_retry_after(Some("2"));
    sink.answer(&[429]);
    book(&api, &point("slow-down", now_ms() + 1000, action.clone())).await;
    let life = api
        .wait_life("slow-down", Duration::from_secs(8), |l| {
            state(l) != "Inexistent"
        })
        .await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let calls = sink.received_for("slow-down");
    assert_eq!(calls.len(), 2, "{calls:?}");
    let gap = gaps(&calls)[0];
    assert!((1_950..3_500).contains(&gap), "retry came {gap} ms later");
    let h = history(&life);
    let first = &h[h.len() - 1];
    assert_eq!(
        (first["outcome"].as_str(), first["status"].as_i64()),
        (Some("retry"), Some(429)),
        "{first}"
    );
    assert_eq!(first["retry_after_ms"], 2000, "{first}");

    // An HTTP-date works as well.
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(4));
    sink.set_retry_after(Some(&date));
    sink.answer(&[503]);
    book(&api, &point("by-date", now_ms() + 1000, action.clone())).await;
    api.wait_life("by-date", Duration::from_secs(10), |l| state(l) == "Dead")
        .await;
    let gap = gaps(&sink.received_for("by-date"))[0];
    assert!((1_500..5_500).contains(&gap), "retry came {gap} ms later");

    // A 429 without Retry-After is retried after retry_interval: 429 is a default
    // retry code.
    sink.set_retry_after(None);
    sink.answer(&[429]);
    book(&api, &point("plain-429", now_ms() + 1000, action.clone())).await;
    let life = api
        .wait_life("plain-429", Duration::from_secs(6), |l| {
            state(l) != "Inexistent"
        })
        .await;
    assert_eq!(state(&life), "Dead", "{life:#}");
    let gap = gaps(&sink.received_for("plain-429"))[0];
    assert!((150..1_500).contains(&gap), "retry came {gap} ms later");
    assert_eq!(history(&life)[1].get("retry_after_ms"), None);

    // A Retry-After on an answer that is not retried changes nothing: it fails for good.
    sink.set_retry_after(Some("1"));
    sink.answer(&[400]);
    book(&api, &point("not-retried", now_ms() + 1000, action)).await;
    let life = api
        .wait_life("not-retried", Duration::from_secs(6), |l| {
            state(l) != "Inexistent"
        })
        .await;
    assert_eq!(state(&life), "Stillbirth", "{life:#}");
    assert_eq!(sink.received_for("not-retried").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_and_tasks_honour_retry_after_within_their_limits() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    sink.set_retry_after(Some("2"));

    // A timer run now, answered 429 once: its retry waits the 2 s asked for (a timer's
    // retries are 1 s apart otherwise).
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "limited", "schedule": "0 3 * * *", "action": {"path": "/timer", "method": "POST"}}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    sink.answer(&[429]);
    let (status, reply) = api.post("/timers/limited/run", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    let calls = sink
        .wait_until("the timer's retry", Duration::from_secs(8), |got| {
            got.iter().filter(|r| r.path == "/timer").count() >= 2
        })
        .await;
    let timer_calls: Vec<Received> = calls.into_iter().filter(|r| r.path == "/timer").collect();
    let gap = gaps(&timer_calls)[0];
    assert!(
        (1_950..3_500).contains(&gap),
        "timer retry came {gap} ms later"
    );
    let runs = {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (_, runs) = api.get("/timers/limited/runs").await;
            let items = runs["items"].as_array().cloned().unwrap_or_default();
            if items.iter().any(|r| r["outcome"] == "success")
                || std::time::Instant::now() > deadline
            {
                break items;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let retried: Vec<&Value> = runs.iter().filter(|r| r["outcome"] == "retry").collect();
    assert_eq!(retried.len(), 1, "{runs:?}");
    assert_eq!(retried[0]["retry_after_ms"], 2000);

    // A queue task: Retry-After 30 s is capped by the queue's max_backoff of 1 s (its
    // min_backoff is 100 ms).
    sink.set_retry_after(Some("30"));
    let (status, reply) = api
        .put(
            "/queues/capped",
            &json!({"retry": {"limit": 3, "min_backoff": 0.1, "max_backoff": 1}}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    sink.answer(&[503]);
    let (status, reply) = api
        .post(
            "/queues/capped/tasks",
            &json!({"name": "t", "action": {"path": "/task", "method": "POST"}}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let calls = sink
        .wait_until("the task's retry", Duration::from_secs(8), |got| {
            got.iter().filter(|r| r.path == "/task").count() >= 2
        })
        .await;
    let task_calls: Vec<Received> = calls.into_iter().filter(|r| r.path == "/task").collect();
    let gap = gaps(&task_calls)[0];
    assert!(
        (900..2_500).contains(&gap),
        "task retry came {gap} ms later"
    );
}
