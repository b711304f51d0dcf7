//! Queues (SPEC section 6) end to end: rate and max_concurrent across two hosts, the
//! retry block's backoff, the failed list, pause/resume/purge and task names.

use std::time::Duration;

use kairos_e2e::*;
use serde_json::{json, Value};

fn task(name: &str, tag: &str) -> Value {
    json!({"name": name, "action": hook(tag)})
}

fn of_queue(sink: &Sink, queue: &str) -> Vec<Received> {
    sink.received()
        .into_iter()
        .filter(|r| r.header("x-kairos-queue") == Some(queue))
        .collect()
}

async fn add(api: &Api, queue: &str, tasks: Vec<Value>) {
    let (status, reply) = api
        .post(&format!("/queues/{queue}/tasks"), &Value::Array(tasks))
        .await;
    assert_eq!(status, 200, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_holds_across_two_hosts() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);
    let (status, reply) = api
        .put(
            "/queues/slow",
            &json!({"rate": 5, "bucket_size": 1, "max_concurrent": 0}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["rate"], 5.0);

    // Half the tasks through each host's API: both hosts claim and run them.
    for (i, api) in [Api::new(&a), Api::new(&b)].iter().enumerate() {
        let tasks = (0..40)
            .map(|n| task(&format!("h{i}-{n}"), "rate"))
            .collect();
        add(api, "slow", tasks).await;
    }
    let first = sink
        .wait_until("a first task", Duration::from_secs(5), |r| !r.is_empty())
        .await[0]
        .at_ms;
    let from = first + 1_000;
    let to = from + 10_000;
    tokio::time::sleep(Duration::from_millis((to - now_ms()).max(0) as u64 + 200)).await;
    let got = of_queue(&sink, "slow");
    let in_window = got
        .iter()
        .filter(|r| r.at_ms >= from && r.at_ms < to)
        .count();
    assert!(
        (40..=60).contains(&in_window),
        "5/s ±20% over 10 s is 40 to 60 tasks; got {in_window}"
    );
    for r in &got {
        assert_eq!(r.header("x-kairos-execution-count"), Some("1"));
        assert_eq!(r.header("x-kairos-retry-count"), Some("0"));
        assert!(r.header("x-kairos-task").unwrap().starts_with('h'));
    }
    let (_, queue) = api.get("/queues/slow").await;
    assert!(queue["tasks"]["pending"].as_i64().unwrap() > 0, "{queue:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_is_never_exceeded_across_two_hosts() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(300));
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let (status, _) = Api::new(&a)
        .put("/queues/two", &json!({"rate": 0, "max_concurrent": 2}))
        .await;
    assert_eq!(status, 200);
    add(
        &Api::new(&a),
        "two",
        (0..8).map(|n| task(&format!("a{n}"), "c")).collect(),
    )
    .await;
    add(
        &Api::new(&b),
        "two",
        (0..8).map(|n| task(&format!("b{n}"), "c")).collect(),
    )
    .await;
    let got = sink.wait_count(16, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 16);
    assert_eq!(
        sink.max_concurrent(""),
        2,
        "max_concurrent 2: never more, and the queue did use both"
    );
    // Every run left the queue's running set when it was recorded.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, queue) = Api::new(&b).get("/queues/two").await;
        if queue["tasks"]["running"] == 0 && queue["tasks"]["pending"] == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{queue:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_follows_the_retry_block_and_failed_tasks_can_run_again() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // One attempt and four retries fail; the re-run after that succeeds.
    sink.answer(&[500, 503, 404, 500, 500]);
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, reply) = api
        .put(
            "/queues/rb",
            &json!({"rate": 0, "retry": {"limit": 4, "min_backoff": 0.2, "max_backoff": "1s", "max_doublings": 1}}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    add(&api, "rb", vec![task("t1", "retry")]).await;
    let got = sink.wait_count(5, Duration::from_secs(10)).await;
    // 200 ms, doubled once to 400, then linear steps of 400 (800), capped at 1000.
    let expected = [200, 400, 800, 1000];
    for (i, want) in expected.iter().enumerate() {
        let gap = got[i + 1].at_ms - got[i].at_ms;
        assert!(
            gap >= want - 20 && gap <= want + 300,
            "retry {} came after {gap} ms, expected {want}",
            i + 1
        );
    }
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.header("x-kairos-task"), Some("t1"));
        assert_eq!(
            r.header("x-kairos-retry-count"),
            Some(i.to_string().as_str())
        );
        assert_eq!(
            r.header("x-kairos-execution-count"),
            Some((i + 1).to_string().as_str())
        );
    }
    // No sixth call: the task is in the failed list.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(sink.received().len(), 5);
    let (status, failed) = api.get("/queues/rb/failed").await;
    assert_eq!(status, 200);
    let items = failed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{failed:#}");
    assert_eq!(items[0]["name"], "t1");
    assert_eq!(items[0]["state"], "Failed");
    assert_eq!(items[0]["attempts"], 5);
    assert_eq!(items[0]["last_status"], 500);
    // The task keeps its attempts, newest first, each with its status.
    let (status, shown) = api.get("/queues/rb/tasks/t1").await;
    assert_eq!(status, 200, "{shown}");
    let runs = shown["runs"].as_array().unwrap();
    let summary: Vec<(i64, i64, &str)> = runs
        .iter()
        .map(|r| {
            (
                r["attempt"].as_i64().unwrap(),
                r["status"].as_i64().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (5, 500, "failed"),
            (4, 500, "retry"),
            (3, 404, "retry"),
            (2, 503, "retry"),
            (1, 500, "retry")
        ],
        "{shown:#}"
    );
    assert!(runs
        .iter()
        .all(|r| r["started_at"].is_string() && r["started_at_ms"].is_i64()));
    assert_eq!(runs[0], shown["last_run"]);
    // A list does not carry the history.
    assert!(items[0].get("runs").is_none(), "{failed:#}");

    let (status, reply) = api.post("/queues/rb/tasks/t1/run", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    let got = sink.wait_count(6, Duration::from_secs(5)).await;
    assert_eq!(got[5].header("x-kairos-execution-count"), Some("1"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, failed) = api.get("/queues/rb/failed").await;
    assert_eq!(status, 200, "{failed:#}");
    assert!(failed["items"].as_array().unwrap().is_empty(), "{failed:#}");
    let (status, _) = api.get("/queues/rb/tasks/t1").await;
    assert_eq!(status, 404, "a task that succeeded is deleted");

    let out = std::process::Command::new("curl")
        .args(["-s", &host.url("/metrics")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for (outcome, n) in [("retry", 4), ("failed", 1), ("success", 1)] {
        let line =
            format!("kairos_runs_total{{plan=\"task\",queue=\"rb\",outcome=\"{outcome}\"}} {n}\n");
        assert!(text.contains(&line), "no `{line}` in:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_purge_delete_and_task_names() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);

    let (status, list) = api.get("/queues").await;
    assert_eq!(status, 200);
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["name"] == "default"),
        "{list:#}"
    );
    let (status, reply) = api.delete("/queues/default").await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("default_queue"))
    );
    let (status, _) = api.post("/queues/nope/tasks", &task("x", "x")).await;
    assert_eq!(status, 404);

    // Pause holds tasks back; resume delivers them.
    let (status, reply) = api.post("/queues/default/pause", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["state"], "paused");
    add(
        &api,
        "default",
        (0..5).map(|n| task(&format!("p{n}"), "p")).collect(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(sink.received().is_empty(), "a paused queue delivered");
    // Parked: in no due set and in no host's memory, until resume.
    assert_eq!(redis.count_all("due_tasks").await, 0);
    assert_eq!(redis.count_all("task_due").await, 0);
    assert_eq!(redis.count_all("held").await, 0);
    let (_, queue) = api.get("/queues/default").await;
    assert_eq!(queue["tasks"]["pending"], 5, "{queue:#}");
    let (status, reply) = api.post("/queues/default/resume", &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(reply["state"], "running");
    sink.wait_count(5, Duration::from_secs(5)).await;

    // Purge empties the queue: nothing is delivered after resume.
    api.post("/queues/default/pause", &json!({})).await;
    add(
        &api,
        "default",
        (0..5).map(|n| task(&format!("q{n}"), "q")).collect(),
    )
    .await;
    let (status, reply) = api.post("/queues/default/purge", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["tasks_removed"], 5);
    api.post("/queues/default/resume", &json!({})).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(sink.received().len(), 5, "a purged task ran");
    let (_, queue) = api.get("/queues/default").await;
    assert_eq!(queue["tasks"]["pending"], 0, "{queue:#}");

    // Names: delivered, purged and deleted tasks keep theirs; a list naming one twice
    // is refused whole.
    for reused in ["p0", "q0"] {
        let (status, reply) = api
            .post("/queues/default/tasks", &task(reused, "again"))
            .await;
        assert_eq!(
            (status, reply["error"]["code"].as_str()),
            (409, Some("duplicate_task")),
            "{reused}"
        );
    }
    let (status, reply) = api
        .post(
            "/queues/default/tasks",
            &json!({"name": "later", "countdown": 60, "action": hook("later")}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    assert!(reply["eta_ms"].as_i64().unwrap() > now_ms() + 50_000);
    let (status, view) = api.get("/queues/default/tasks/later").await;
    assert_eq!(status, 200);
    assert!(
        matches!(view["state"].as_str(), Some("Standby") | Some("Preset")),
        "{view:#}"
    );
    let (status, _) = api.delete("/queues/default/tasks/later").await;
    assert_eq!(status, 200);
    let (status, _) = api.get("/queues/default/tasks/later").await;
    assert_eq!(status, 404);
    let (status, _) = api.post("/queues/default/tasks", &task("later", "x")).await;
    assert_eq!(status, 409);
    let (status, _) = api
        .post(
            "/queues/default/tasks",
            &json!([task("dup", "x"), task("dup", "x")]),
        )
        .await;
    assert_eq!(status, 409);
    let (status, _) = api.get("/queues/default/tasks/dup").await;
    assert_eq!(status, 404, "a refused list adds nothing");
    let too_many: Vec<Value> = (0..101).map(|n| task(&format!("m{n}"), "x")).collect();
    let (status, _) = api
        .post("/queues/default/tasks", &Value::Array(too_many))
        .await;
    assert_eq!(status, 400);

    // A queue can be deleted once empty of running tasks.
    let (status, _) = api.put("/queues/gone", &json!({})).await;
    assert_eq!(status, 200);
    add(
        &api,
        "gone",
        vec![json!({"name": "g", "countdown": 60, "action": hook("g")})],
    )
    .await;
    let (status, reply) = api.delete("/queues/gone").await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["tasks_removed"], 1);
    let (status, _) = api.get("/queues/gone").await;
    assert_eq!(status, 404);
    assert_eq!(
        redis.count_all("due_tasks").await + redis.count_all("task_due").await,
        0,
        "a deleted queue's task stayed due"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_a_crashed_host_runs_again_and_frees_its_concurrency() {
    a_crashed_run_frees_its_slot(json!({"rate": 0, "max_concurrent": 1})).await;
}

/// The same with the slot of a key: the crashed run leaves its key's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_a_crashed_host_frees_its_keys_slot() {
    a_crashed_run_frees_its_slot(
        json!({"rate": 0, "max_concurrent": 0, "key": "/tag", "max_concurrent_per_key": 1}),
    )
    .await;
}

/// Two tasks (of one key: `hook("c")` has body `{"tag": "c"}`) on a queue that runs one
/// at a time; the host running the first is killed.
async fn a_crashed_run_frees_its_slot(settings: Value) {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_secs(4));
    let mut a = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);
    let (status, reply) = api.put("/queues/one", &settings).await;
    assert_eq!(status, 200, "{reply}");
    add(
        &api,
        "one",
        vec![
            task("t1", "c"),
            json!({"name": "t2", "countdown": 0.5, "action": hook("c")}),
        ],
    )
    .await;
    sink.wait_count(1, Duration::from_secs(5)).await;
    a.kill9();
    sink.set_delay(Duration::from_millis(50));

    // Another host takes A's Plans over when its 2 s lease expires: t1 runs again, and
    // t2 is admitted only if the crashed run left the queue's running set (or its key's
    // count).
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let got = sink
        .wait_until("t1 again and t2", Duration::from_secs(15), |r| {
            r.iter()
                .filter(|r| r.header("x-kairos-task") == Some("t1"))
                .count()
                == 2
                && r.iter().any(|r| r.header("x-kairos-task") == Some("t2"))
        })
        .await;
    let again = got
        .iter()
        .filter(|r| r.header("x-kairos-task") == Some("t1"))
        .nth(1)
        .unwrap();
    assert_eq!(again.header("x-kairos-execution-count"), Some("2"));
    assert_eq!(again.header("idempotency-key"), Some("one/t1:task"));
    let (_, queue) = Api::new(&b).get("/queues/one").await;
    assert!(
        queue["tasks"]["running"].as_i64().unwrap() <= 1,
        "{queue:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_need_the_book_scope_and_queue_changes_admin() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--api-tokens", "root:admin,ops:book,peek:read")]),
    );
    let (root, ops, peek) = (
        Api::new(&host).with_token("root"),
        Api::new(&host).with_token("ops"),
        Api::new(&host).with_token("peek"),
    );
    let later = json!({"name": "later", "countdown": 60, "action": hook("x")});
    for (api, status) in [(&peek, 403), (&ops, 200)] {
        let (got, reply) = api.post("/queues/default/tasks", &later).await;
        assert_eq!(got, status, "{reply}");
    }
    for (method_path, api) in [
        ("PUT /queues/q", &ops),
        ("POST /queues/default/pause", &ops),
    ] {
        let (got, reply) = match method_path.split_once(' ').unwrap() {
            ("PUT", path) => api.put(path, &json!({})).await,
            (_, path) => api.post(path, &json!({})).await,
        };
        assert_eq!(
            (got, reply["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{method_path}"
        );
    }
    let (status, _) = peek.get("/queues/default/tasks/later").await;
    assert_eq!(status, 200, "reading needs only read");
    let (status, _) = ops
        .post("/queues/default/tasks/later/run", &json!({}))
        .await;
    assert_eq!(status, 200);
    let (status, _) = root.put("/queues/q", &json!({"rate": 1})).await;
    assert_eq!(status, 200);
    let (status, _) = ops
        .post(
            "/timers",
            &json!({"name": "t", "schedule": "00:00", "action": hook("t")}),
        )
        .await;
    assert_eq!(status, 403, "timers are defined with admin");
    sink.wait_count(1, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_behind_a_low_rate_waits_in_redis_not_in_memory() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, _) = api
        .put("/queues/trickle", &json!({"rate": 2, "bucket_size": 1}))
        .await;
    assert_eq!(status, 200);
    add(
        &api,
        "trickle",
        (0..100).map(|n| task(&format!("b{n}"), "b")).collect(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2_000)).await;

    let out = std::process::Command::new("curl")
        .args(["-s", &host.url("/metrics")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let claimed: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix("kairos_claimed_plans "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(claimed <= 5, "{claimed} tasks held in the host's memory");
    let waiting = redis.count_all("due_tasks").await + redis.count_all("task_due").await;
    assert!(waiting >= 85, "only {waiting} tasks wait in Redis");
    let delivered = sink.received().len();
    assert!((3..=7).contains(&delivered), "2/s for 2 s, got {delivered}");
}

/// `expire_after` (Trigger.dev's `ttl`, Hatchet's `schedule_timeout`): a task whose first
/// attempt cannot start within it after its ETA is dropped, with its reason, and never
/// runs late; behind a paused queue as behind a slow rate. A person may still run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_not_started_within_expire_after_is_dropped_never_run_late() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    // One task a second: of ten tasks due now with 2.5 s to start, about three start.
    let (status, reply) = api
        .put("/queues/ttl", &json!({"rate": 1, "bucket_size": 1}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let tasks: Vec<Value> = (0..10)
        .map(|n| json!({"name": format!("t{n}"), "expire_after": "2500ms", "action": hook("ttl")}))
        .collect();
    let (status, reply) = api.post("/queues/ttl/tasks", &Value::Array(tasks)).await;
    assert_eq!(status, 200, "{reply}");
    let expires_at = reply["tasks"][0]["expires_at"]
        .as_str()
        .unwrap()
        .to_string();
    let expires_ms = chrono::DateTime::parse_from_rfc3339(&expires_at)
        .unwrap()
        .timestamp_millis();
    let deadline = Duration::from_secs(10);
    let failed = wait_for_failed(&api, "ttl", 10 - 4, deadline).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ran = of_queue(&sink, "ttl");
    assert!(
        (2..=4).contains(&ran.len()),
        "1/s for 2.5 s starts 2 to 4 tasks; {} ran",
        ran.len()
    );
    for r in &ran {
        assert!(
            r.at_ms <= expires_ms + 100,
            "a task ran {} ms after it expired",
            r.at_ms - expires_ms
        );
    }
    let (_, failed_now) = api.get("/queues/ttl/failed").await;
    let items = failed_now["items"].as_array().unwrap();
    assert_eq!(
        items.len() + ran.len(),
        10,
        "each task ran or expired: {failed_now:#}"
    );
    assert!(failed.len() >= 6);
    for item in items {
        assert_eq!(item["state"], "Expired", "{item:#}");
        assert_eq!(item["attempts"], 0, "never started: {item:#}");
        assert_eq!(item["expires_at"], expires_at.as_str());
        assert!(
            item["last_error"]
                .as_str()
                .unwrap()
                .contains("expire_after"),
            "{item:#}"
        );
        assert_eq!(item["last_run"]["outcome"], "expired", "{item:#}");
        assert!(item["failed_at"].is_string(), "{item:#}");
    }
    let (_, queue) = api.get("/queues/ttl").await;
    assert_eq!(queue["tasks"]["pending"], 0, "{queue:#}");

    // Behind a paused queue: expired at its resume, never run.
    let (status, _) = api.post("/queues/held/pause", &json!({})).await;
    assert_eq!(status, 404, "no such queue yet");
    api.put("/queues/held", &json!({"rate": 0})).await;
    api.post("/queues/held/pause", &json!({})).await;
    let (status, reply) = api
        .post(
            "/queues/held/tasks",
            &json!([{"name": "late", "expire_after": 1, "action": hook("held")},
                    {"name": "patient", "action": hook("held")}]),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (status, _) = api.post("/queues/held/resume", &json!({})).await;
    assert_eq!(status, 200);
    let got = sink
        .wait_until("the patient task", Duration::from_secs(5), |r| {
            r.iter()
                .any(|r| r.header("x-kairos-task") == Some("patient"))
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !got.iter()
            .chain(sink.received().iter())
            .any(|r| r.header("x-kairos-task") == Some("late")),
        "the expired task ran"
    );
    let (_, late) = api.get("/queues/held/tasks/late").await;
    assert_eq!(late["state"], "Expired", "{late:#}");

    // A person's `run` is no longer bound by expire_after.
    let (status, reply) = api.post("/queues/held/tasks/late/run", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_until("the late task, run by hand", Duration::from_secs(5), |r| {
        r.iter().any(|r| r.header("x-kairos-task") == Some("late"))
    })
    .await;

    let out = std::process::Command::new("curl")
        .args(["-s", &host.url("/metrics")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for (queue, n) in [("ttl", items.len()), ("held", 1)] {
        let line = format!(
            "kairos_runs_total{{plan=\"task\",queue=\"{queue}\",outcome=\"expired\"}} {n}\n"
        );
        assert!(text.contains(&line), "no `{line}` in:\n{text}");
    }
}

/// Polls a queue's failed list until it holds at least `n` tasks.
async fn wait_for_failed(api: &Api, queue: &str, n: usize, within: Duration) -> Vec<Value> {
    let start = std::time::Instant::now();
    loop {
        let (_, failed) = api.get(&format!("/queues/{queue}/failed")).await;
        let items = failed["items"].as_array().cloned().unwrap_or_default();
        if items.len() >= n || start.elapsed() > within {
            return items;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Arrival times at the sink of each key's tasks, by the key found with `key_of`.
fn arrivals_by_key(
    got: &[Received],
    key_of: impl Fn(&Received) -> String,
) -> std::collections::BTreeMap<String, Vec<i64>> {
    let mut by_key = std::collections::BTreeMap::<String, Vec<i64>>::new();
    for r in got {
        by_key.entry(key_of(r)).or_default().push(r.at_ms);
    }
    for times in by_key.values_mut() {
        times.sort_unstable();
    }
    by_key
}

/// `max_concurrent_per_key`: one customer's tasks run one at a time, and a customer with
/// a long backlog holds back none of the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hot_key_runs_alone_and_holds_back_no_other_key() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(400));
    let a = Host::start(&redis.url(), &flags(&sink, &[]));
    let b = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&a);
    let (status, view) = api
        .put(
            "/queues/per",
            &json!({"rate": 0, "max_concurrent": 0, "key": "/customer/id",
                    "max_concurrent_per_key": 1}),
        )
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["key"], "/customer/id");
    assert_eq!(view["max_concurrent_per_key"], 1);
    let customer_task = |customer: &str, n: usize| {
        json!({"name": format!("{customer}-{n}"),
               "action": {"path": "/hook", "method": "POST",
                          "body": {"customer": {"id": customer}, "n": n}}})
    };
    // The hot customer's backlog first, then three others; a task without the key is
    // limited by the queue alone.
    add(
        &api,
        "per",
        (0..10).map(|n| customer_task("hot", n)).collect(),
    )
    .await;
    let others: Vec<Value> = ["a", "b", "c"]
        .iter()
        .flat_map(|c| (0..2).map(move |n| customer_task(c, n)))
        .chain([json!({"name": "keyless", "action": hook("keyless")})])
        .collect();
    add(&Api::new(&b), "per", others).await;

    let got = sink.wait_count(17, Duration::from_secs(20)).await;
    let started = got.iter().map(|r| r.at_ms).min().unwrap();
    let by_key = arrivals_by_key(&got, |r| {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        body["customer"]["id"].as_str().unwrap_or("-").to_string()
    });
    assert_eq!(by_key["hot"].len(), 10, "{by_key:?}");
    for (key, times) in &by_key {
        if key == "-" {
            continue;
        }
        for w in times.windows(2) {
            assert!(
                w[1] - w[0] >= 350,
                "two tasks of `{key}` ran at once (400 ms each): {times:?}"
            );
        }
    }
    for key in ["a", "b", "c", "-"] {
        let first = by_key[key][0];
        assert!(
            first - started < 1_500,
            "`{key}` waited {} ms behind the hot key",
            first - started
        );
    }
    // Nothing is left counted or waiting once all ran.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, queue) = api.get("/queues/per").await;
        if queue["tasks"]["running"] == 0 && queue["tasks"]["pending"] == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{queue:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let keys_left = redis.cli(&["--scan", "--pattern", "*queue:per:k*"]);
    assert!(
        keys_left.trim().is_empty(),
        "per-key counts and waiting sets are gone: {keys_left}"
    );
}

/// `rate_per_key` with the key in a header: each key's tasks start at most 2 a second,
/// and two keys run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_per_key_spaces_each_key_and_not_the_queue() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, view) = api
        .put(
            "/queues/paced",
            &json!({"rate": 0, "key": "header:X-Customer", "rate_per_key": 2}),
        )
        .await;
    assert_eq!(status, 200, "{view}");
    let tasks: Vec<Value> = (0..6)
        .flat_map(|n| {
            ["k1", "k2"].map(|k| {
                json!({"name": format!("{k}-{n}"),
                       "action": {"path": "/hook", "method": "POST",
                                  "headers": {"x-customer": k}}})
            })
        })
        .collect();
    add(&api, "paced", tasks).await;
    let got = sink.wait_count(12, Duration::from_secs(15)).await;
    let by_key = arrivals_by_key(&got, |r| r.header("x-customer").unwrap_or("-").to_string());
    for (key, times) in &by_key {
        assert_eq!(times.len(), 6, "{by_key:?}");
        for w in times.windows(2) {
            assert!(w[1] - w[0] >= 420, "`{key}` faster than 2/s: {times:?}");
        }
        let span = times[5] - times[0];
        assert!(span < 4_000, "`{key}` far slower than 2/s: {times:?}");
    }
    assert!(
        (by_key["k1"][0] - by_key["k2"][0]).abs() < 400,
        "the keys ran side by side: {by_key:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_settings_are_checked() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    for body in [
        json!({"max_concurrent_per_key": 2}),
        json!({"rate_per_key": 1}),
        json!({"key": "customer", "max_concurrent_per_key": 1}),
        json!({"key": "header:bad header", "max_concurrent_per_key": 1}),
        json!({"key": "/c", "rate_per_key": -1}),
        json!({"mode": "pull", "key": "/c"}),
    ] {
        let (status, reply) = api.put("/queues/q", &body).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_queue", "{reply}");
    }
    let (status, _) = api.get("/queues/q").await;
    assert_eq!(status, 404, "nothing was stored");
}

/// Found by the API fuzzer (`scripts/api_fuzz.py`): `?limit=abc` and `?state=bogus` on a
/// queue's task lists were ignored; they are a 400 `invalid_query`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_list_queries_that_do_not_parse_are_400() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, reply) = api
        .post(
            "/queues/default/tasks",
            &json!({"name": "later", "countdown": 3600, "action": hook("later")}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    for path in [
        "/queues/default/tasks?limit=abc",
        "/queues/default/tasks?state=bogus",
        "/queues/default/tasks?sort=eta",
        "/queues/default/failed?limit=1.5",
    ] {
        let (status, reply) = api.get(path).await;
        assert_eq!(status, 400, "{path}: {reply}");
        assert_eq!(reply["error"]["code"], "invalid_query", "{path}: {reply}");
    }
    let (status, reply) = api.get("/queues/default/tasks?limit=1").await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["items"][0]["name"], "later", "{reply}");
    let (status, reply) = api.get("/queues/default/tasks?state=failed").await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["items"], json!([]));
}

/// A queue's lists page either way with a cursor, give their total, and the failed list
/// newest first reads as the failures came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_lists_page_either_way_with_totals() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.answer_paths(&[("/fail", 400)]);
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, reply) = api
        .put("/queues/pg", &json!({"rate": 0, "retry": {"limit": 0}}))
        .await;
    assert_eq!(status, 200, "{reply}");
    // Seven tasks fail one after another; twelve wait, five of them at one ETA.
    for i in 0..7 {
        add(
            &api,
            "pg",
            vec![json!({"name": format!("f{i}"), "action": {"path": "/fail", "method": "POST"}})],
        )
        .await;
        wait_for_failed(&api, "pg", i + 1, Duration::from_secs(10)).await;
    }
    let later = now_ms() + 3_600_000;
    let waiting: Vec<Value> = (0..12)
        .map(|i| {
            json!({"name": format!("w{i:02}"), "eta": rfc3339_ms(later + if i < 5 { 0 } else { i * 1000 }),
                   "action": {"path": "/hook", "method": "POST"}})
        })
        .collect();
    add(&api, "pg", waiting).await;

    async fn walk(api: &Api, path: &str, limit: usize) -> (Vec<String>, Value) {
        let mut names = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..100 {
            let sep = if path.contains('?') { '&' } else { '?' };
            let mut url = format!("{path}{sep}limit={limit}");
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={}", kairos::cli::percent_encode(c)));
            }
            let (status, page) = api.get(&url).await;
            assert_eq!(status, 200, "{url}: {page}");
            let total = page["total"].clone();
            names.extend(
                page["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].as_str().unwrap().to_string()),
            );
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return (names, total),
            }
        }
        panic!("{path}: the list never ended")
    }
    let failed_first: Vec<String> = (0..7).map(|i| format!("f{i}")).collect();
    let newest_first: Vec<String> = failed_first.iter().rev().cloned().collect();
    assert_eq!(
        walk(&api, "/queues/pg/failed?order=desc", 3).await,
        (newest_first, json!(7))
    );
    assert_eq!(
        walk(&api, "/queues/pg/failed", 2).await,
        (failed_first, json!(7))
    );
    let by_eta: Vec<String> = (0..12).map(|i| format!("w{i:02}")).collect();
    assert_eq!(
        walk(&api, "/queues/pg/tasks", 2).await,
        (by_eta.clone(), json!(12))
    );
    let (desc, _) = walk(&api, "/queues/pg/tasks?order=desc", 4).await;
    assert_eq!(desc, by_eta.iter().rev().cloned().collect::<Vec<_>>());
    // A page goes on from its last task even when that task is gone meanwhile.
    let (_, first) = api.get("/queues/pg/tasks?limit=3").await;
    let cursor = first["next_cursor"].as_str().unwrap().to_string();
    assert_eq!(api.delete("/queues/pg/tasks/w02").await.0, 200);
    let (_, next) = api
        .get(&format!(
            "/queues/pg/tasks?limit=3&cursor={}",
            kairos::cli::percent_encode(&cursor)
        ))
        .await;
    let names: Vec<&str> = next["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["w03", "w04", "w05"], "{next}");
    for bad in [
        "/queues/pg/failed?cursor=nope",
        "/queues/pg/failed?cursor=NaN:f1",
        "/queues/pg/tasks?cursor=inf:w01",
        "/queues/pg/tasks?order=up",
    ] {
        let (status, reply) = api.get(bad).await;
        assert_eq!(status, 400, "{bad}: {reply}");
    }
}
