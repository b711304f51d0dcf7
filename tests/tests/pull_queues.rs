//! Pull queues (`"mode": "pull"`, the GAE task queue's pull mode) end to end: tasks with a
//! payload that no host runs, leased by outside workers, acknowledged, extended, given
//! back, leased again when a lease runs out, and failed after the retry limit.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use kairos_e2e::*;
use serde_json::{json, Value};

async fn lease(api: &Api, queue: &str, body: Value) -> Vec<Value> {
    let (status, reply) = api.post(&format!("/queues/{queue}/lease"), &body).await;
    assert_eq!(status, 200, "{reply}");
    reply["tasks"].as_array().cloned().unwrap_or_default()
}

fn names(tasks: &[Value]) -> Vec<&str> {
    let mut n: Vec<&str> = tasks.iter().map(|t| t["name"].as_str().unwrap()).collect();
    n.sort();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_lease_ack_extend_and_give_back_pull_tasks() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, q) = api
        .put(
            "/queues/pq",
            &json!({"mode": "pull", "retry": {"limit": 1}}),
        )
        .await;
    assert_eq!(status, 200, "{q}");
    assert_eq!(q["mode"], "pull");
    assert!(q.get("rate").is_none(), "{q}");
    // The mode is fixed; a pull queue has no rate.
    let (status, reply) = api.put("/queues/pq", &json!({"mode": "push"})).await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (409, json!("queue_mode_fixed"))
    );
    let (status, reply) = api
        .put("/queues/pr", &json!({"mode": "pull", "rate": 5}))
        .await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (400, json!("invalid_queue"))
    );
    // Tasks fit their queue's mode.
    let (status, reply) = api
        .post(
            "/queues/pq/tasks",
            &json!({"name": "x", "action": hook("x")}),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (400, json!("invalid_body")),
        "{reply}"
    );
    let (status, reply) = api
        .post(
            "/queues/default/tasks",
            &json!({"name": "x", "payload": {"n": 0}}),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (400, json!("invalid_body")),
        "{reply}"
    );
    let (status, reply) = api.post("/queues/default/lease", &json!({})).await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (400, json!("push_queue")),
        "{reply}"
    );
    let (status, _) = api.post("/queues/nope/lease", &json!({})).await;
    assert_eq!(status, 404);

    let (status, reply) = api
        .post(
            "/queues/pq/tasks",
            &json!([{"name": "a", "payload": {"n": 1}, "tag": "red"},
                    {"name": "b", "payload": {"n": 2}, "tag": "blue"},
                    {"name": "c", "payload": {"n": 3}, "countdown": 60}]),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    assert!(lease(&api, "pq", json!({"tag": "green", "count": 10}))
        .await
        .is_empty());
    let got = lease(&api, "pq", json!({"count": 10, "lease_seconds": 1})).await;
    assert_eq!(names(&got), ["a", "b"], "c is not due: {got:#?}");
    let by_name: HashMap<&str, &Value> = got
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t))
        .collect();
    assert_eq!(by_name["a"]["payload"], json!({"n": 1}));
    assert_eq!(by_name["a"]["tag"], "red");
    assert_eq!(by_name["a"]["attempts"], 1);
    assert!(
        lease(&api, "pq", json!({"count": 10})).await.is_empty(),
        "both are leased"
    );
    let (_, queue) = api.get("/queues/pq").await;
    assert_eq!(
        queue["tasks"],
        json!({"pending": 3, "leased": 2, "failed": 0}),
        "{queue:#}"
    );

    // ack: done, its name kept.
    let a_lease = by_name["a"]["lease_id"].clone();
    let (status, reply) = api
        .post("/queues/pq/tasks/a/ack", &json!({"lease_id": a_lease}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, _) = api
        .post("/queues/pq/tasks/a/ack", &json!({"lease_id": a_lease}))
        .await;
    assert_eq!(status, 404);
    let (status, _) = api
        .post("/queues/pq/tasks", &json!({"name": "a", "payload": {}}))
        .await;
    assert_eq!(status, 409, "an acked task's name stays taken");

    // A lease that runs out makes the task due again, under a new lease id.
    let old_b = by_name["b"]["lease_id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let again = lease(&api, "pq", json!({"tag": "blue"})).await;
    assert_eq!(names(&again), ["b"]);
    assert_eq!(again[0]["attempts"], 2);
    let new_b = again[0]["lease_id"].as_str().unwrap().to_string();
    assert_ne!(new_b, old_b);
    let (status, reply) = api
        .post("/queues/pq/tasks/b/ack", &json!({"lease_id": old_b}))
        .await;
    assert_eq!(
        (status, reply["error"]["code"].clone()),
        (409, json!("lease_lost")),
        "{reply}"
    );
    // extend: the lease ends lease_seconds from now.
    let before = now_ms();
    let (status, reply) = api
        .post(
            "/queues/pq/tasks/b/extend",
            &json!({"lease_id": new_b, "lease_seconds": 30}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let end = reply["lease_expires_ms"].as_i64().unwrap();
    assert!(
        (before + 29_000..=now_ms() + 30_000).contains(&end),
        "{reply}"
    );
    let (_, shown) = api.get("/queues/pq/tasks/b").await;
    assert_eq!(shown["state"], "Leased", "{shown:#}");
    assert_eq!(shown["payload"], json!({"n": 2}));
    assert!(shown["lease_expires_at"].is_string(), "{shown:#}");
    // nack: given back, due at once; its two leases reached the retry limit (1 retry),
    // so the next lease fails it instead of handing it out a third time.
    let (status, reply) = api
        .post("/queues/pq/tasks/b/nack", &json!({"lease_id": new_b}))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert!(lease(&api, "pq", json!({"count": 10})).await.is_empty());
    let (_, failed) = api.get("/queues/pq/failed").await;
    let items = failed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{failed:#}");
    assert_eq!(items[0]["name"], "b");
    assert_eq!(items[0]["state"], "Failed");
    assert!(
        items[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("leased 2 times"),
        "{failed:#}"
    );
    // A person's run makes it due again, attempts reset.
    let (status, _) = api.post("/queues/pq/tasks/b/run", &json!({})).await;
    assert_eq!(status, 200);
    let b = lease(&api, "pq", json!({})).await;
    assert_eq!(names(&b), ["b"]);
    assert_eq!(b[0]["attempts"], 1);

    // Paused: nothing is leased.
    api.post("/queues/pq/tasks/c/run", &json!({})).await;
    api.post("/queues/pq/pause", &json!({})).await;
    assert!(lease(&api, "pq", json!({"count": 10})).await.is_empty());
    api.post("/queues/pq/resume", &json!({})).await;
    assert_eq!(names(&lease(&api, "pq", json!({"count": 10})).await), ["c"]);

    // Bad lease calls are 400s.
    for body in [
        json!({"count": 0}),
        json!({"count": 1001}),
        json!({"lease_seconds": 0}),
        json!({"lease_seconds": "9d"}),
        json!({"tag": "no spaces"}),
        json!({"cuont": 1}),
    ] {
        let (status, reply) = api.post("/queues/pq/lease", &body).await;
        assert_eq!(status, 400, "{body} -> {reply}");
    }
    // No host ever called anything: pull tasks are never pushed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sink.received().is_empty());
}

/// Five workers lease, work and ack 60 tasks together: each task is acked once, and no
/// task is under two workers' leases at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_workers_share_a_pull_queue_without_overlap() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);
    api.put("/queues/work", &json!({"mode": "pull"})).await;
    let tasks: Vec<Value> = (0..60)
        .map(|n| json!({"name": format!("t{n}"), "payload": {"n": n}}))
        .collect();
    for chunk in tasks.chunks(30) {
        let (status, reply) = api
            .post("/queues/work/tasks", &Value::Array(chunk.to_vec()))
            .await;
        assert_eq!(status, 200, "{reply}");
    }
    let mut workers = Vec::new();
    for w in 0..5 {
        // Workers talk to either host.
        let api = Api::new(if w % 2 == 0 { &a } else { &b });
        workers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(20) {
                let got = lease(&api, "work", json!({"count": 3, "lease_seconds": 30})).await;
                if got.is_empty() {
                    break;
                }
                for t in got {
                    let name = t["name"].as_str().unwrap().to_string();
                    let (status, reply) = api
                        .post(
                            &format!("/queues/work/tasks/{name}/ack"),
                            &json!({"lease_id": t["lease_id"]}),
                        )
                        .await;
                    assert_eq!(status, 200, "{reply}");
                    acked.push(name);
                }
            }
            acked
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), 60, "each task acked once");
    assert_eq!(unique.len(), 60);
    let (_, queue) = api.get("/queues/work").await;
    assert_eq!(
        queue["tasks"],
        json!({"pending": 0, "leased": 0, "failed": 0}),
        "{queue:#}"
    );
    assert!(sink.received().is_empty());
}
