//! A push queue task added and not yet claimed is a compact record in a task bucket
//! (record format 4, docs/redis-layout.md): read, listed, changed and fired exactly as a
//! task with its own Plan hash, and turned into that hash when it is claimed or changed.

use std::time::Duration;

use kairos::store::inspect::{bucket_index, id_hash, tree_members};
use kairos_e2e::*;
use serde_json::{json, Value};

fn action(n: usize) -> Value {
    json!({"path": "/hook", "method": "POST", "body": {"tag": format!("t{n}"), "k": format!("key-{}", n % 3)}})
}

/// The records in the queue's shard's task buckets, and the members of its `task_due`.
async fn stored(redis: &RedisServer, queue: &str) -> (Vec<(String, String)>, Vec<String>) {
    let keyspace = redis.keyspace().await;
    let k = keyspace.queue(queue);
    let mut conn = redis.conn().await;
    let n: Option<u64> = redis::cmd("GET")
        .arg(k.task_record_count())
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut records = Vec::new();
    for b in 0..n.unwrap_or(1) {
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(k.task_records(b))
            .query_async(&mut conn)
            .await
            .unwrap();
        for (field, rec) in all {
            let h = id_hash(&field);
            assert_eq!(
                bucket_index(h, n.unwrap_or(1)),
                b,
                "{field} is in the wrong bucket"
            );
            records.push((field, rec));
        }
    }
    let due = tree_members(&mut conn, &k.task_due())
        .await
        .unwrap()
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    leaves_hold_their_bounds(&mut conn, &k.task_due()).await;
    (records, due)
}

/// The tree's shape (docs/redis-layout.md, Trees): each leaf holds at most 64 members,
/// every one at or past its leaf's bound and before the next leaf's.
async fn leaves_hold_their_bounds(conn: &mut redis::aio::MultiplexedConnection, tree: &str) {
    let index: Vec<String> = redis::cmd("ZRANGE")
        .arg(tree)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    let bound = |entry: &str| entry.rsplit_once('|').unwrap().0.to_string();
    for (i, entry) in index.iter().enumerate() {
        let leaf = format!("{tree}:{}", entry.rsplit_once('|').unwrap().1);
        let members: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(&leaf)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(conn)
            .await
            .unwrap();
        assert!(members.len() <= 64, "{leaf} holds {}", members.len());
        for (m, score) in &members {
            let at = format!("{score:013}:{m}");
            assert!(at >= bound(entry), "{at} is below {entry}");
            if let Some(next) = index.get(i + 1) {
                assert!(at < bound(next), "{at} is past {next}");
            }
        }
    }
}

async fn plan_hashes(redis: &RedisServer) -> usize {
    let mut conn = redis.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("kairos:{*}:plan:*:task")
        .query_async(&mut conn)
        .await
        .unwrap();
    keys.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_push_tasks_are_records_until_claimed() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let (status, reply) = api
        .put(
            "/queues/rec",
            &json!({"key": "/k", "max_concurrent_per_key": 2}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");

    // 150 tasks an hour ahead (past 48, their bucket splits), and one with expire_after.
    for range in [0..100, 100..150] {
        let tasks: Vec<Value> = range
            .map(|n| json!({"name": format!("t{n}"), "countdown": 3600, "action": action(n)}))
            .collect();
        let (status, reply) = api.post("/queues/rec/tasks", &Value::Array(tasks)).await;
        assert_eq!(status, 200, "{reply}");
    }
    let (status, reply) = api
        .post(
            "/queues/rec/tasks",
            &json!({"name": "x", "countdown": 3600, "expire_after": "10m", "action": action(1)}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");

    let (records, due) = stored(&redis, "rec").await;
    assert_eq!(records.len(), 151, "one record per task");
    assert_eq!(due.len(), 151, "each record waits in task_due");
    assert_eq!(plan_hashes(&redis).await, 0, "no task has a Plan hash yet");
    let seven = &records.iter().find(|(f, _)| f == "rec/t7").unwrap().1;
    let head: Value = serde_json::from_str(seven).unwrap();
    assert_eq!(head["k"], "key-1", "the task's key is kept: {seven}");
    assert_eq!(head["a"], action(7), "{seven}");
    let at = seven.find(",\"a\":").unwrap();
    let last: Value = serde_json::from_str(&seven[at + 5..seven.len() - 1]).unwrap();
    assert_eq!(last, action(7), "the action comes last: {seven}");

    // Read and listed as a Plan hash would be.
    let (status, t7) = api.get("/queues/rec/tasks/t7").await;
    assert_eq!(status, 200, "{t7}");
    assert_eq!(t7["state"], "Standby");
    assert_eq!(t7["attempts"], 0);
    assert_eq!(t7["action"], action(7));
    let eta = t7["eta_ms"].as_i64().unwrap();
    assert!((eta - now_ms() - 3_600_000).abs() < 60_000, "{t7}");
    assert!(t7["created_at"].is_string(), "{t7}");
    let (_, x) = api.get("/queues/rec/tasks/x").await;
    assert!(x["expires_at"].is_string(), "{x}");
    let (status, page) = api.get("/queues/rec/tasks?limit=500").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["total"], 151, "{page}");
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 151);
    assert!(items.iter().all(|t| t["action"].is_object()), "{page}");

    // A DELETE and a run asked for now take the record, and only theirs.
    let (status, reply) = api.delete("/queues/rec/tasks/t6").await;
    assert_eq!(status, 200, "{reply}");
    let (status, _) = api.get("/queues/rec/tasks/t6").await;
    assert_eq!(status, 404);
    let (status, _) = api
        .post(
            "/queues/rec/tasks",
            &json!({"name": "t6", "action": action(6)}),
        )
        .await;
    assert_eq!(status, 409, "a deleted task's name is tombstoned");
    let (status, reply) = api.post("/queues/rec/tasks/t5/run", &json!({})).await;
    assert_eq!(status, 200, "{reply}");
    let got = sink
        .wait_until("t5 run now", Duration::from_secs(10), |r| {
            r.iter().any(|r| r.header("x-kairos-task") == Some("t5"))
        })
        .await;
    assert_eq!(got.len(), 1, "only t5 ran");

    // A list due now (one ETA no other task has: one leaf, cut in pieces) is claimed
    // from its records, each task run once.
    let now: Vec<Value> = (200..300)
        .map(|n| json!({"name": format!("t{n}"), "action": action(n)}))
        .collect();
    let (status, reply) = api.post("/queues/rec/tasks", &Value::Array(now)).await;
    assert_eq!(status, 200, "{reply}");
    let got = sink
        .wait_until("100 tasks due now", Duration::from_secs(20), |r| {
            r.len() >= 101
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = if sink.received().len() > got.len() {
        sink.received()
    } else {
        got
    };
    let mut names: Vec<String> = got
        .iter()
        .map(|r| r.header("x-kairos-task").unwrap().to_string())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), got.len(), "a task ran twice");
    assert_eq!(got.len(), 101);
    for r in &got {
        assert_eq!(r.header("x-kairos-execution-count"), Some("1"));
    }

    let (records, due) = stored(&redis, "rec").await;
    assert_eq!(
        records.len(),
        149,
        "the run, deleted and done tasks' records are gone"
    );
    assert_eq!(due.len(), 149);
    assert!(!records.iter().any(|(f, _)| f == "rec/t5" || f == "rec/t6"));
    assert_eq!(plan_hashes(&redis).await, 0, "a done task leaves no hash");
    let (_, page) = api.get("/queues/rec/tasks?limit=500").await;
    assert_eq!(page["total"], 149, "{page}");
}
