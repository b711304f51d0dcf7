//! kairos on a real local Redis Cluster (3 masters, 3 replicas, started here on free
//! ports with `--cluster-enabled yes` and `redis-cli --cluster create`), named by
//! `--redis-url redis+cluster://...`:
//! - the booking, firing, timer, queue, plugin and defer behaviours work across its
//!   masters, every script on one slot;
//! - a master killed mid-run is replaced by its replica, and with `--min-replicas-ack 1`
//!   no acknowledged booking is lost;
//! - three hosts, one killed -9 and one frozen (SIGSTOP) past its lease then resumed,
//!   fire every Plan, and no Plan ever has two calls under way at once.

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

/// `kairos migrate` folds a keyspace of layout 2 (a hash per Plan) on a cluster: each
/// Life's call goes to its shard's master. The layout-2 keys are written back from Lives
/// booked by this build (each `b.`/`d.` field into a Plan hash of its own, as the build
/// before wrote them), so the test needs no earlier build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_with_a_hash_per_plan_is_folded_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let sink = Sink::start().await;
    let port = cluster.ports[0];
    let far = now_ms() + 3_600_000;
    let mut lives: Vec<(String, Option<String>)> = Vec::new();
    let mut host = Host::start(&cluster.url(), &cluster_flags(&sink, &[]));
    let api = Api::new(&host);
    for i in 0..12i64 {
        let id = format!("f{i:02}");
        let rid = (i % 3 == 0).then(|| format!("conn-{i}"));
        let mut body = if i % 2 == 0 {
            term(
                &id,
                far + i * 60_000,
                far + i * 60_000 + 30_000,
                hook("on"),
                hook("off"),
            )
        } else {
            point(&id, far + i * 60_000, hook(&id))
        };
        if let Some(rid) = &rid {
            body["resource_id"] = json!(rid);
        }
        book(&api, &body).await;
        lives.push((id, rid));
    }
    let mut before = Vec::new();
    for (id, _) in &lives {
        before.push(api.get(&format!("/schedules/{id}")).await.1);
    }
    assert!(host.terminate(Duration::from_secs(10)), "the host stops");

    let ks = Keyspace::new(32);
    let mut plans = 0;
    for (id, rid) in &lives {
        let k = match rid {
            Some(rid) => ks.resource(rid),
            None => ks.life(id),
        };
        let life = k.life(id);
        let out = cluster.cli(port, &["HGETALL", &life]);
        let lines: Vec<&str> = out.lines().collect();
        let resource = lines
            .chunks(2)
            .find(|p| p[0] == "resource_id")
            .map(|p| p[1].to_string());
        for (prefix, kind) in [("b.", "birth"), ("d.", "death")] {
            let mut fields: Vec<String> = Vec::new();
            for pair in lines.chunks(2) {
                if let Some(name) = pair[0].strip_prefix(prefix) {
                    fields.extend([name.to_string(), pair[1].to_string()]);
                    cluster.cli(port, &["HDEL", &life, pair[0]]);
                }
            }
            if fields.is_empty() {
                continue;
            }
            if let Some(rid) = &resource {
                fields.extend(["resource_id".to_string(), rid.clone()]);
            }
            let key = k.key_of(&format!("plan:{id}:{kind}"));
            let mut args = vec!["HSET", key.as_str()];
            args.extend(fields.iter().map(String::as_str));
            cluster.cli(port, &args);
            plans += 1;
        }
    }
    assert_eq!(
        plans, 18,
        "12 births and 6 deaths written as layout 2 had them"
    );
    cluster.cli(port, &["HSET", "kairos:meta", "layout", "2"]);

    let (code, _, err) = kairos_command(&[
        "serve",
        "--redis-url",
        &cluster.url(),
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("layout 2"), "{err}");
    let (code, out, err) = kairos_command(&["migrate", "--redis-url", &cluster.url()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("folded the Plans of 12 Lives into their Lives' hashes (32 shards, layout 3)"),
        "{out}"
    );
    for (id, rid) in &lives {
        let k = match rid {
            Some(rid) => ks.resource(rid),
            None => ks.life(id),
        };
        for kind in ["birth", "death"] {
            let key = k.key_of(&format!("plan:{id}:{kind}"));
            assert_eq!(cluster.cli(port, &["EXISTS", &key]).trim(), "0", "{key}");
        }
    }

    host = Host::start(&cluster.url(), &cluster_flags(&sink, &[]));
    let api = Api::new(&host);
    for ((id, _), old) in lives.iter().zip(&before) {
        let (status, view) = api.get(&format!("/schedules/{id}")).await;
        assert_eq!(status, 200, "{id}: {view}");
        assert_eq!(&view, old, "{id} reads back otherwise");
    }
    drop(host);
}
