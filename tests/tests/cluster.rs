//! kairos on a real local Redis Cluster (3 masters, 3 replicas, started here on free
//! ports with `--cluster-enabled yes` and `redis-cli --cluster create`), named by
//! `--redis-url redis+cluster://...`:
//! - the booking, firing, timer, queue, plugin and defer behaviours work across its
//!   masters, every script on one slot;
//! - a master killed mid-run is replaced by its replica, and with `--min-replicas-ack 1`
//!   no acknowledged booking is lost;
//! - three hosts, one killed -9 and one frozen (SIGSTOP) past its lease then resumed,
//!   fire every Plan, and no Plan ever has two calls under way at once;
//! - `kairos migrate` folds a keyspace of the earlier layout on it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kairos_e2e::*;
use serde_json::{json, Value};

fn cluster_flags(sink: &Sink, extra: &[(&str, &str)]) -> Vec<String> {
    flags(sink, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookings_timers_queues_and_plugins_work_on_a_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let sink = Sink::start().await;
    let host = Host::start(&cluster.url(), &cluster_flags(&sink, &[]));
    let api = Api::new(&host);

    // Points and terms, with and without resources, all over the shards. Booked 5 s
    // ahead: on 2 busy cores the first bookings (each master loading the scripts) and
    // the checks below can take a few seconds, and every time must stay in the future.
    let base = now_ms() + 5_000;
    let mut ids = Vec::new();
    for i in 0..40i64 {
        let id = format!("c{i:02}");
        let mut body = point(&id, base + i * 25, hook(&id));
        if i % 4 == 0 {
            body["resource_id"] = json!(format!("res-{i}"));
        }
        book(&api, &body).await;
        ids.push(id);
    }
    let mut t = term(
        "ct",
        base + 200,
        base + 1_500,
        hook("ct-on"),
        hook("ct-off"),
    );
    t["resource_id"] = json!("conn-c");
    book(&api, &t).await;
    // The guard and duplicates hold across shards.
    let mut clash = term("clash", base + 300, base + 1_400, hook("x"), hook("y"));
    clash["resource_id"] = json!("conn-c");
    let (status, reply) = api.post("/schedules", &clash).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("resource_conflict")),
        "{reply}"
    );
    let (status, reply) = api
        .post("/schedules", &point("c04", base + 9_000, hook("again")))
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("duplicate_life_uuid")),
        "{reply}"
    );
    // Listing merges the shards in birth order.
    let mut listed = Vec::new();
    let mut cursor = String::new();
    for _ in 0..20 {
        let (status, page) = api.get(&format!("/schedules?limit=9{cursor}")).await;
        assert_eq!(status, 200, "{page}");
        listed.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["life_uuid"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    // ct's birth is at c08's time: the id breaks the tie.
    let mut want = ids.clone();
    want.insert(9, "ct".into());
    assert_eq!(listed, want);
    // A moved and a cancelled Plan.
    let (status, _) = api
        .patch(
            "/schedules/c01",
            &json!({"birth_time": rfc3339_ms(base + 1_900)}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = api.delete("/schedules/c02").await;
    assert_eq!(status, 200);

    // A timer every second, a queue with a rate, a plugin, a deferred request.
    let (status, reply) = api
        .post(
            "/timers",
            &json!({"name": "tick", "schedule": "* * * * * *", "action": hook("tick")}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = api
        .put("/queues/mail", &json!({"rate": 20, "max_concurrent": 2}))
        .await;
    assert!(status == 200 || status == 201, "{reply}");
    let tasks: Vec<Value> = (0..10)
        .map(|i| json!({"name": format!("m{i}"), "action": hook(&format!("m{i}"))}))
        .collect();
    let (status, reply) = api.post("/queues/mail/tasks", &json!(tasks)).await;
    assert!(status == 200 || status == 201, "{reply}");
    upload_plugin(&api, "noop", "noop", "").await;
    book(
        &api,
        &json!({"life_uuid": "cp", "birth_time": rfc3339_ms(base + 600), "birth": {"plugin": "noop", "input": {}}}),
    )
    .await;
    let (status, reply) = api
        .raw(
            axum::http::Method::POST,
            "/defer/hook",
            b"{\"deferred\":true}".to_vec(),
            &[
                ("content-type", "application/json"),
                ("x-kairos-schedule-datetime", &rfc3339_ms(base + 800)),
            ],
        )
        .await;
    assert_eq!(status, 202, "{reply}");

    // 39 points, the term's two calls, 10 tasks, the deferred call and timer ticks.
    sink.wait_until("everything fired", Duration::from_secs(20), |got| {
        let lives: BTreeSet<&str> = got
            .iter()
            .filter_map(|r| r.header("x-kairos-life"))
            .collect();
        let tasks = got
            .iter()
            .filter(|r| r.header("x-kairos-queue") == Some("mail"))
            .count();
        let ticks = got
            .iter()
            .filter(|r| r.header("x-kairos-timer") == Some("tick"))
            .count();
        let term = got
            .iter()
            .filter(|r| r.header("x-kairos-life") == Some("ct"))
            .count();
        let deferred = got
            .iter()
            .any(|r| r.body.as_ref() == b"{\"deferred\":true}");
        ids.iter()
            .filter(|id| *id != "c02")
            .all(|id| lives.contains(id.as_str()))
            && term == 2
            && deferred
            && tasks == 10
            && ticks >= 2
    })
    .await;
    let got = sink.received();
    for id in ids.iter().filter(|id| *id != "c02") {
        assert_eq!(sink.received_for(id).len(), 1, "{id}");
    }
    assert!(
        sink.received_for("c02").is_empty(),
        "a cancelled Plan fired"
    );
    let c01 = &sink.received_for("c01")[0];
    assert!(c01.at_ms >= base + 1_900, "c01 fired before its new time");
    assert_eq!(sink.received_for("ct").len(), 2);
    assert!(got
        .iter()
        .any(|r| r.path == "/hook" && r.body.as_ref() == b"{\"deferred\":true}"));
    let cp = api
        .wait_life("cp", Duration::from_secs(5), |l| state(l) == "Dead")
        .await;
    assert_eq!(history(&cp)[0]["outcome"], "success", "{cp:#}");
    let (status, runs) = api.get("/timers/tick/runs").await;
    assert_eq!(status, 200);
    assert!(runs["items"].as_array().unwrap().len() >= 2, "{runs}");
    // The keyspace's keys spread over every master.
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    for port in masters {
        let keys = cluster.cli(port, &["DBSIZE"]);
        let n: u64 = keys.trim().parse().unwrap_or(0);
        assert!(n > 10, "master {port} holds {n} keys");
    }
    let (status, metrics) = api.text("/metrics").await;
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("kairos_shards_owned 32"), "{metrics}");
}

/// Books from 4 clients while a master is killed: with --min-replicas-ack 1 an answer of
/// 200 means a replica has the booking, so the replica that takes over has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_mid_run_loses_no_acknowledged_booking() {
    let mut cluster = RedisCluster::start(3, 1);
    let sink = Sink::start().await;
    let host = Host::start(
        &cluster.url(),
        &cluster_flags(&sink, &[("--min-replicas-ack", "1")]),
    );
    let api = Api::new(&host);
    let fire_at = now_ms() + 25_000;
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let refused = Arc::new(Mutex::new(HashMap::<u16, usize>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (api, acked, refused, stop) =
            (api.clone(), acked.clone(), refused.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            for i in 0..100_000 {
                if stop.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                let id = format!("f{c}-{i}");
                let (status, _) = api
                    .post(
                        "/schedules",
                        &point(&id, fire_at + (i % 50) * 10, hook(&id)),
                    )
                    .await;
                if status == 200 {
                    acked.lock().unwrap().push(id);
                } else {
                    *refused.lock().unwrap().entry(status).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let victim = cluster.masters()[0];
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| cluster.kill(victim));
    tokio::task::block_in_place(|| cluster.wait_failover(victim, 3, Duration::from_secs(30)));
    let failover = killed_at.elapsed();
    // Go on booking on the promoted replica for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    for c in clients {
        c.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let refused = refused.lock().unwrap().clone();
    eprintln!(
        "failover took {failover:?}; {} bookings acknowledged, refused by status: {refused:?}",
        acked.len()
    );
    assert!(acked.len() > 100, "only {} acknowledged", acked.len());
    assert!(
        refused.keys().all(|s| *s == 503),
        "a refusal other than 503 during failover: {refused:?}"
    );
    // Every acknowledged booking is there, and fires. Just after a failover a read may
    // still answer 503 ("try again", as the spec allows); only a 404 is a loss.
    let reads_until = Instant::now() + Duration::from_secs(30);
    let mut retried_reads = 0;
    for id in &acked {
        loop {
            let (status, view) = api.get(&format!("/schedules/{id}")).await;
            if status == 503 && Instant::now() < reads_until {
                retried_reads += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            assert_eq!(status, 200, "acknowledged booking {id} lost: {view}");
            break;
        }
    }
    eprintln!("reads answered 503 and retried after the failover: {retried_reads}");
    let wait = (fire_at - now_ms()).max(0) as u64 + 15_000;
    sink.wait_until(
        "every acknowledged booking fired",
        Duration::from_millis(wait),
        |got| {
            let fired: BTreeSet<&str> = got
                .iter()
                .filter_map(|r| r.header("x-kairos-life"))
                .collect();
            acked.iter().all(|id| fired.contains(id.as_str()))
        },
    )
    .await;
}

/// Three hosts share the shards; one is killed -9 and one frozen past its lease, then
/// resumed. Every Plan fires, and none has two calls under way at once (the frozen host's
/// shards were taken over, so on waking it must not call what it had started).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_one_killed_one_frozen_fire_every_plan_never_twice_at_once() {
    let cluster = RedisCluster::start(3, 1);
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(800));
    let args = cluster_flags(&sink, &[]);
    let mut hosts: Vec<Host> = (0..3).map(|_| Host::start(&cluster.url(), &args)).collect();
    let api = Api::new(&hosts[0]);
    // Every host owns some shards before the work starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut owned = Vec::new();
        for h in &hosts {
            owned.push(Api::new(h).shards_owned().await);
        }
        if owned.iter().all(|n| *n > 0) && owned.iter().sum::<i64>() == 32 {
            break;
        }
        assert!(Instant::now() < deadline, "shards not split: {owned:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let base = now_ms() + 2_000;
    let mut ids = Vec::new();
    for i in 0..240i64 {
        let id = format!("h{i:03}");
        book(&api, &point(&id, base + i * 40, hook(&id))).await;
        ids.push(id);
    }
    tokio::time::sleep(Duration::from_millis(
        (base - now_ms()).max(0) as u64 + 1_500,
    ))
    .await;
    // Frozen mid-run, for longer than its 2 s lease; then another host dies.
    assert!(hosts[1].signal("STOP"));
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut dead = hosts.remove(2);
    dead.kill9();
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    assert!(hosts[1].signal("CONT"));

    sink.wait_until("every Plan fired", Duration::from_secs(30), |got| {
        let fired: BTreeSet<&str> = got
            .iter()
            .filter_map(|r| r.header("x-kairos-life"))
            .collect();
        ids.iter().all(|id| fired.contains(id.as_str()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        sink.overlapping_runs(),
        Vec::<String>::new(),
        "Plans with two calls under way at once"
    );
    // The resumed host works again: the shards split between the two live hosts.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let a = Api::new(&hosts[0]).shards_owned().await;
        let b = Api::new(&hosts[1]).shards_owned().await;
        if a + b == 32 && a > 0 && b > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "shards after the faults: {a} + {b}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kairos migrate` folds a keyspace of layout 3 (a hash per Life) into records on a
/// cluster: each Life's call goes to its shard's master. The keyspace is the fixture
/// that build wrote (`tests/fixtures/layout3`), copied key by key (DUMP, RESTORE) from a
/// redis-server loaded with it into the cluster's masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_with_a_hash_per_life_is_folded_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let sink = Sink::start().await;
    let port = cluster.ports[0];
    let fixture = RedisServer::start_from_rdb(&fixtures_dir().join("layout3/dump.rdb"));
    let mut from = fixture.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut from)
        .await
        .unwrap();
    let nodes: Vec<String> = cluster
        .ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let mut to = redis::cluster::ClusterClient::new(nodes)
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    for key in &keys {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(key)
            .query_async(&mut from)
            .await
            .unwrap();
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut from)
            .await
            .unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(ttl.max(0))
            .arg(dump)
            .query_async(&mut to)
            .await
            .unwrap();
    }
    drop(fixture);
    let lives: Vec<Value> = fixture_of_layout3("lives.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();

    let (code, _, err) = kairos_command(&[
        "serve",
        "--redis-url",
        &cluster.url(),
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("layout 3"), "{err}");
    let (code, out, err) = kairos_command(&["migrate", "--redis-url", &cluster.url()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "folded {} Lives into compact records (32 shards, layout 4)",
            lives.len()
        )),
        "{out}"
    );
    let ks = Keyspace::new(32);
    for old in &lives {
        let id = old["life"].as_str().unwrap();
        let k = match old["view"]["resource_id"].as_str() {
            Some(rid) => ks.resource(rid),
            None => ks.life(id),
        };
        let key = k.key_of(&format!("life:{id}"));
        assert_eq!(cluster.cli(port, &["EXISTS", &key]).trim(), "0", "{key}");
    }

    let host = Host::start(&cluster.url(), &cluster_flags(&sink, &[]));
    let api = Api::new(&host);
    for old in &lives {
        let id = old["life"].as_str().unwrap();
        let (status, view) = api.get(&format!("/schedules/{id}")).await;
        assert_eq!(status, 200, "{id}: {view}");
        assert_eq!(
            as_before_outcomes(&view),
            old["view"],
            "{id} reads back otherwise"
        );
    }
    // A pending point moved to now fires from its folded record.
    let (status, reply) = api
        .patch(
            "/schedules/pend-res",
            &json!({"birth_time": rfc3339_ms(now_ms() + 1_500)}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_until("pend-res's birth", Duration::from_secs(10), |got| {
        got.iter()
            .any(|r| r.header("x-kairos-life") == Some("pend-res"))
    })
    .await;
    drop(host);
}

fn fixture_of_layout3(name: &str) -> String {
    std::fs::read_to_string(fixtures_dir().join("layout3").join(name)).unwrap()
}
