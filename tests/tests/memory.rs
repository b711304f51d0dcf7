//! Redis memory: kairos never runs on a Redis that may evict its keys, and a Redis that
//! fills up sheds history first, then refuses new bookings with 507, and loses nothing
//! already booked.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kairos_e2e::{
    fast_flags, flags, flags_with, free_port, kairos_bin, rfc3339_ms, Api, Host, RedisServer, Sink,
};
use redis::AsyncCommands;
use serde_json::json;

/// Runs `kairos serve` expecting it to refuse to start; its exit code and log.
fn serve_expecting_refusal(redis: &RedisServer, extra: &[&str]) -> (Option<i32>, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(kairos_bin())
        .args(["serve", "--redis-url", &redis.url(), "--listen", &listen])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kairos runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (code, log)
}

async fn info_memory(redis: &RedisServer, field: &str) -> u64 {
    let info = redis.cli(&["INFO", "memory"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("INFO memory has no {field}: {info}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_is_refused_at_start_unless_allowed() {
    let redis = RedisServer::start();
    for policy in ["allkeys-lru", "volatile-ttl"] {
        assert_eq!(
            redis
                .cli(&["CONFIG", "SET", "maxmemory-policy", policy])
                .trim(),
            "OK"
        );
        let (code, log) = serve_expecting_refusal(&redis, &[]);
        assert_eq!(code, Some(1), "kairos started on {policy}: {log}");
        assert!(
            log.contains(&format!("maxmemory-policy is {policy}"))
                && log.contains("noeviction")
                && log.contains("--allow-eviction"),
            "{log}"
        );
    }
    // Told that eviction is acceptable, it starts, books, and says what it risks.
    let mut args = flags_with(fast_flags(), &[("--gateway-url", "http://127.0.0.1:9")]);
    args.push("--allow-eviction".into());
    let host = Host::start(&redis.url(), &args);
    let (status, body) = Api::new(&host)
        .post(
            "/schedules",
            &json!({"life_uuid": "evictable", "birth_time": "2030-01-01 00:00:00",
                    "birth": {"path": "/hook", "method": "POST"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(host.log_text().contains("may evict"), "{}", host.log_text());
    // A Redis at the default hash-max-listpack-value (64) gets a word about the memory a
    // Life takes there.
    assert!(
        host.log_text()
            .contains("hash-max-listpack-value is 64: a Life whose action or run record is longer"),
        "{}",
        host.log_text()
    );
    // With noeviction (and 1024) it starts without a word about either.
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "hash-max-listpack-value", "1024"]);
    let host = Host::start(&redis.url(), &fast_flags());
    assert!(!host.log_text().contains("may evict"));
    assert!(!host.log_text().contains("hash-max-listpack-value"));
}

/// Fills a Redis with a small `maxmemory` with bookings: the finished Lives kept as
/// history go first, then bookings are answered 507 before Redis itself refuses writes,
/// and every acknowledged booking still fires once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_sheds_history_then_refuses_bookings_and_loses_nothing() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--shards", "4")]));
    let api = Api::new(&host);
    let hook = json!({"path": "/hook", "method": "POST"});

    // History: 200 Lives that fire at once and are kept for the default day.
    for i in 0..200 {
        // Each 2 s ahead of its own booking: on a busy machine 200 bookings take a while.
        let soon = kairos_e2e::at_ms_from_now(2_000);
        let (status, body) = api
            .post(
                "/schedules",
                &json!({"life_uuid": format!("old-{i}"), "birth_time": soon, "birth": hook}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    sink.wait_until("the history fired", Duration::from_secs(30), |got| {
        got.len() >= 200
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while redis.count_all("finished").await < 200 {
        assert!(
            Instant::now() < deadline,
            "the history Lives never finished"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Room for about 2,500 more bookings of 1 KiB bodies (about 2.3 KB each in Redis):
    // few enough to fill in seconds on a busy 2-core machine.
    let used = info_memory(&redis, "used_memory").await;
    let max = used + 6 * 1024 * 1024;
    redis.cli(&["CONFIG", "SET", "maxmemory", &max.to_string()]);

    let fire_at_ms = kairos_e2e::now_ms() + 40_000;
    let fire_at = kairos_e2e::at_ms_from_now(40_000);
    let payload = "x".repeat(1024);
    let mut acked: Vec<String> = Vec::new();
    let mut refusal = None;
    let fill_deadline = Instant::now() + Duration::from_secs(35);
    for i in 0..20_000 {
        assert!(Instant::now() < fill_deadline, "no 507 after {i} bookings");
        let id = format!("pending-{i}");
        let (status, body) = api
            .post(
                "/schedules",
                &json!({"life_uuid": id, "birth_time": fire_at,
                        "birth": {"path": "/hook", "method": "POST", "body": {"data": payload}}}),
            )
            .await;
        match status {
            200 => acked.push(id),
            507 => {
                refusal = Some(body);
                break;
            }
            other => panic!("booking {i} answered {other}: {body}"),
        }
    }
    let refusal = refusal.expect("bookings were refused once Redis was nearly full");
    assert_eq!(refusal["error"]["code"], "storage_full", "{refusal}");
    // kairos refused before Redis had to: its own message, not Redis's OOM.
    assert!(
        refusal["error"]["message"]
            .as_str()
            .unwrap()
            .contains("% full"),
        "{refusal}"
    );
    assert!(
        !redis.cli(&["INFO", "errorstats"]).contains("errorstat_OOM"),
        "Redis itself refused a write: {}",
        redis.cli(&["INFO", "errorstats"])
    );
    eprintln!(
        "{} bookings fitted; used {} of maxmemory {max}",
        acked.len(),
        info_memory(&redis, "used_memory").await
    );
    assert!(acked.len() > 1000, "only {} bookings fitted", acked.len());
    // The history went first: by the first refusal it had been shed.
    assert!(
        redis.count_all("finished").await < 200,
        "no history shed before refusing"
    );
    assert!(host.log_text().contains("shed"), "{}", host.log_text());
    let (_, metrics) = api.text("/metrics").await;
    assert!(
        metrics.contains(&format!("kairos_redis_maxmemory_bytes {max}")),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(
            |l| l.starts_with("kairos_bookings_refused_storage_full_total ") && !l.ends_with(" 0")
        ),
        "{metrics}"
    );

    // Nothing acknowledged was lost: every pending booking fires, once.
    let wait = Duration::from_millis((fire_at_ms - kairos_e2e::now_ms()).max(0) as u64)
        + Duration::from_secs(60);
    let want: HashSet<String> = acked.iter().cloned().collect();
    let got = sink
        .wait_until("every acknowledged booking fired", wait, |got| {
            let fired: HashSet<&str> = got
                .iter()
                .filter_map(|r| r.header("x-kairos-life"))
                .filter(|id| id.starts_with("pending-"))
                .collect();
            fired.len() >= want.len()
        })
        .await;
    let mut fired: Vec<&str> = got
        .iter()
        .filter_map(|r| r.header("x-kairos-life"))
        .filter(|id| id.starts_with("pending-"))
        .collect();
    fired.sort_unstable();
    let before = fired.len();
    fired.dedup();
    assert_eq!(before, fired.len(), "a booking fired twice");
    assert_eq!(
        fired.iter().map(|s| s.to_string()).collect::<HashSet<_>>(),
        want
    );

    // And kairos keeps serving: once runs have finished and history is shed, bookings
    // are taken again.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = api
            .post(
                "/schedules",
                &json!({"life_uuid": "after", "birth_time": "2030-01-01 00:00:00", "birth": hook}),
            )
            .await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 507, "{body}");
        assert!(Instant::now() < deadline, "bookings still refused: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `--history-max-lives` bounds the history by count besides its age: the oldest
/// finished Lives go first, the newest stay readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_bounded_by_count_oldest_first() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--shards", "2"), ("--history-max-lives", "6")]),
    );
    let api = Api::new(&host);
    // Twelve Lives, a fifth of a second apart, so that they finish in order.
    let first = kairos_e2e::now_ms() + 2_000;
    let ids: Vec<String> = (0..12).map(|i| format!("kept-{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let (status, body) = api
            .post(
                "/schedules",
                &json!({"life_uuid": id, "birth_time": kairos_e2e::rfc3339_ms(first + i as i64 * 200),
                        "birth": {"path": "/hook", "method": "POST"}}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    sink.wait_until("all fired", Duration::from_secs(20), |got| got.len() >= 12)
        .await;
    // Each of the 2 shards keeps at most 3: in each, the oldest of its own go.
    let placement = redis.keyspace().await.placement;
    let mut want_gone = Vec::new();
    for shard in 0..2 {
        let mine: Vec<&String> = ids
            .iter()
            .filter(|id| placement.home(id) == shard)
            .collect();
        let over = mine.len().saturating_sub(3);
        want_gone.extend(mine[..over].iter().map(|id| id.to_string()));
    }
    want_gone.sort();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut gone = Vec::new();
        for id in &ids {
            if api.get(&format!("/schedules/{id}")).await.0 == 404 {
                gone.push(id.clone());
            }
        }
        if gone == want_gone {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "gone {gone:?}, expected {want_gone:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(redis.count_all("finished").await <= 6);
    assert!(!want_gone.is_empty());
}

/// `--history-max-bytes` bounds the history by its size in Redis: once the finished
/// Lives take more than the bound (estimated from a sample), the oldest go first until
/// they fit, and the newest stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_bounded_by_bytes_oldest_first() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let budget: u64 = 24 * 1024;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--shards", "1"), ("--history-max-bytes", "24kb")]),
    );
    let api = Api::new(&host);
    // A hundred Lives of about 430 B each, 50 ms apart: some 43 KB of history, far enough
    // over 24 KiB that the sampled estimate cannot err to the other side of it.
    const LIVES: usize = 100;
    let first = kairos_e2e::now_ms() + 3_000;
    let ids: Vec<String> = (0..LIVES).map(|i| format!("sized-{i:03}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let (status, body) = api
            .post(
                "/schedules",
                &json!({"life_uuid": id, "birth_time": kairos_e2e::rfc3339_ms(first + i as i64 * 50),
                        "birth": {"path": "/hook", "method": "POST", "body": {"n": i}}}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    sink.wait_until("all fired", Duration::from_secs(30), |got| {
        got.len() >= LIVES
    })
    .await;
    let shard = redis.keyspace().await.shard(0).clone();
    let mut conn = redis.conn().await;
    // The `finished` list in finishing order, oldest first, as first read: the host sizes
    // the history every 10 s, so this is usually all of it; what is kept later must be
    // its newest end.
    let mut finished_order: Option<Vec<String>> = None;
    // The history's size as Redis counts it: every record bucket (all its Lives have
    // finished), the `finished` list and the `lives` tree, leaves and all.
    let deadline = Instant::now() + Duration::from_secs(30);
    let kept = loop {
        let kept: Vec<String> = conn
            .lrange::<_, Vec<String>>(shard.finished(), 0, -1)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.split_once(':').unwrap().1.to_string())
            .collect();
        finished_order.get_or_insert_with(|| kept.clone());
        let mut keys: Vec<String> = conn.keys(format!("{}r:*", shard.prefix)).await.unwrap();
        keys.push(shard.finished());
        let tree = shard.lives();
        keys.push(tree.clone());
        keys.extend(
            conn.keys::<_, Vec<String>>(format!("{tree}:*"))
                .await
                .unwrap(),
        );
        let mut bytes = 0u64;
        for key in &keys {
            let used: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await
                .unwrap();
            bytes += used.unwrap_or(0);
        }
        if kept.len() < LIVES && bytes <= budget + budget / 4 {
            break kept;
        }
        assert!(
            Instant::now() < deadline,
            "history of {} Lives in {bytes} B, over the bound of {budget} B",
            kept.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // What is left is the newest: a tail of the finishing order, and not a tiny one.
    assert!(kept.len() >= 5, "only {} kept", kept.len());
    let order = finished_order.unwrap();
    assert!(kept.len() <= order.len());
    assert_eq!(kept, order[order.len() - kept.len()..].to_vec());
    assert_eq!(
        api.get(&format!("/schedules/{}", kept[kept.len() - 1]))
            .await
            .0,
        200
    );
    let dropped: Vec<&String> = ids.iter().filter(|id| !kept.contains(id)).collect();
    assert!(dropped.len() >= LIVES - kept.len());
    for id in dropped.iter().take(5) {
        assert_eq!(api.get(&format!("/schedules/{id}")).await.0, 404, "{id}");
    }
}

/// A booking checks its record bucket's and tree leaves' sizes on a sample only (a quarter
/// of bookings, common.lua's `booking_checks`), yet every bucket and leaf stays within
/// Redis's compact listpack encoding: thousands of bookings into two shards split the
/// buckets and leaves many times over, and none outgrows 128 entries or its encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_and_leaves_stay_compact_when_bookings_check_on_a_sample() {
    let redis = RedisServer::start();
    for key in ["hash-max-listpack-value", "zset-max-listpack-value"] {
        redis.cli(&["CONFIG", "SET", key, "1024"]);
    }
    let host = Host::start(
        &redis.url(),
        &flags_with(
            fast_flags(),
            &[("--shards", "2"), ("--gateway-url", "http://127.0.0.1:9")],
        ),
    );
    let api = Api::new(&host);
    let far = 1_900_000_000_000i64;
    let per_call = 500;
    for call in 0..12 {
        let bookings: Vec<_> = (0..per_call)
            .map(|i| {
                let n = call * per_call + i;
                json!({"birth_time": rfc3339_ms(far + (n * 7919 % 6000) * 1000),
                       "birth": {"path": "/hook", "method": "POST"}})
            })
            .collect();
        let (status, reply) = api
            .post("/schedules/batch", &json!({"bookings": bookings}))
            .await;
        assert_eq!(
            (status, reply["booked"].as_u64()),
            (200, Some(500)),
            "{}",
            reply["items"][0]
        );
    }
    let mut conn = redis.conn().await;
    let keys: Vec<String> = conn.keys("kairos:{s*").await.unwrap();
    let (mut leaves, mut buckets) = (0, 0);
    for key in &keys {
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let len: usize = match kind.as_str() {
            "zset" => conn.zcard(key).await.unwrap(),
            "hash" => conn.hlen(key).await.unwrap(),
            _ => continue,
        };
        let leaf = key.contains(":due:") || key.contains(":lives:");
        let bucket = key.contains(":r:");
        if leaf || bucket {
            assert!(len <= 128, "{key}: {len} entries");
            assert_eq!(encoding, "listpack", "{key} ({len} entries)");
            if leaf {
                leaves += 1;
            } else {
                buckets += 1;
            }
        }
    }
    // 6,000 Lives in two shards: each tree of each shard split into dozens of leaves,
    // each shard's records into dozens of buckets.
    assert!(leaves >= 2 * 2 * 30, "{leaves} leaves");
    assert!(buckets >= 2 * 50, "{buckets} buckets");
}
