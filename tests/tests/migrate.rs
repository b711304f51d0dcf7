//! `kairos migrate` on keyspaces written by earlier builds, each kept under
//! `tests/fixtures/` as its RDB and what that build's API answered for each object:
//! `preshard` (layout 1, before shards), `layout2` (sharded, a hash per Plan, written by
//! 6afb7f3 with `layout2/capture.sh`) and `layout3` (a hash per Life, written by 8adc173
//! with `layout3/capture.sh`). A host of this build refuses the old keyspace with a clear
//! message; after the migration every object reads back as before, nothing of the old
//! layout is left, a second run changes nothing, and the migrated Plans fire.

use std::time::Duration;

use kairos_e2e::*;
use serde_json::{json, Value};

/// Starts `kairos serve` on `redis`, which must refuse to start: its stderr.
fn serve_refused(redis: &RedisServer) -> String {
    let (code, _, err) = kairos_command(&[
        "serve",
        "--redis-url",
        &redis.url(),
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
    ]);
    assert_ne!(code, 0, "kairos serve started: {err}");
    err
}

fn fixture(name: &str) -> String {
    fixture_of("preshard", name)
}

fn fixture_of(dir: &str, name: &str) -> String {
    std::fs::read_to_string(fixtures_dir().join(dir).join(name)).unwrap()
}

/// A timer's fields that do not move with time (next_run does once its slot passes).
fn timer_fields(t: &Value) -> Value {
    json!({
        "name": t["name"], "schedule": t["schedule"], "timezone": t["timezone"],
        "action": t["action"], "priority": t["priority"], "active": t["active"],
        "created_at": t["created_at"], "version": t["version"], "retries": t["retries"],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_written_before_shards_is_migrated_whole() {
    let redis = RedisServer::start_from_rdb(&fixtures_dir().join("preshard/dump.rdb"));
    let sink = Sink::start().await;

    // A host of this build will not work on the old layout, and says what to do.
    let err = serve_refused(&redis);
    assert!(err.contains("kairos migrate"), "{err}");

    let out = migrate(&redis);
    assert!(
        out.contains("moved into 32 shards: 7 Lives, 2 timers, 2 queues with 3 tasks"),
        "{out}"
    );
    // Nothing of the old layout is left: every key is in a shard, the registry's slot,
    // or one of the keyspace's own.
    let keys = redis.cli(&["--scan", "--pattern", "kairos:*"]);
    let stray: Vec<&str> = keys
        .lines()
        .map(|k| k.trim_matches('"'))
        .filter(|k| !k.starts_with("kairos:{") && *k != "kairos:meta")
        .collect();
    assert!(stray.is_empty(), "keys of the old layout remain: {stray:?}");
    let again = migrate(&redis);
    assert!(again.contains("nothing to do"), "{again}");

    // Retention far out: the fixture's finished Lives must still be there to compare.
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--schedule-history-duration-days", "36500")]),
    );
    let api = Api::new(&host);
    for line in fixture("lives.jsonl").lines() {
        let old: Value = serde_json::from_str(line).unwrap();
        let id = old["life"].as_str().unwrap();
        let (status, view) = api.get(&format!("/schedules/{id}")).await;
        assert_eq!(status, 200, "{id}: {view}");
        assert_eq!(
            as_before_outcomes(&view),
            old["view"],
            "{id} reads back otherwise"
        );
    }
    let (_, timers) = api.get("/timers").await;
    let old: Value = serde_json::from_str(&fixture("timers.json")).unwrap();
    let fields = |v: &Value| -> Vec<Value> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(timer_fields)
            .collect()
    };
    assert_eq!(fields(&timers), fields(&old));
    for (path, file) in [
        ("/queues", "queues.json"),
        ("/queues/mail/tasks", "mail-tasks.json"),
        ("/queues/mail/failed", "mail-failed.json"),
        ("/plugins", "plugins.json"),
    ] {
        let (status, now) = api.get(path).await;
        assert_eq!(status, 200, "{path}: {now}");
        let before: Value = serde_json::from_str(&fixture(file)).unwrap();
        // Fields added to the API since the fixture was written may appear; every field
        // it had must read back the same.
        assert!(
            includes(&now, &before),
            "{path} reads back otherwise:\nnow {now:#}\nbefore {before:#}"
        );
    }

    // The plugin is still in use by a Life and a timer, counted across the shards.
    let (status, reply) = api.delete("/plugins/noop").await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("plugin_in_use")),
        "{reply}"
    );
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("2 "),
        "{reply}"
    );

    // Migrated Plans are live: one moved to now fires; the resource guard still holds.
    let soon = now_ms() + 1_500;
    let (status, reply) = api
        .patch(
            "/schedules/pend-res",
            &json!({"birth_time": rfc3339_ms(soon)}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    // Wait for that Life's call, not for the sink's first: the fixture's timer `nightly`
    // was due at 2026-11-24T02:30Z, so from that day on it is overdue and fires at once too.
    sink.wait_until("pend-res's birth", Duration::from_secs(8), |got| {
        got.iter()
            .any(|r| r.header("x-kairos-life") == Some("pend-res"))
    })
    .await;
    let (status, reply) = api
        .post(
            "/schedules",
            &json!({"life_uuid": "clash", "schedule_type": "term", "resource_id": "conn-2",
                    "birth_time": "2030-06-01 10:30:00", "death_time": "2030-06-01 11:00:00",
                    "birth": {"path": "/x", "method": "POST"}, "death": {"path": "/y", "method": "POST"}}),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("resource_conflict")),
        "{reply}"
    );
    // A booked id of the old keyspace is still taken, wherever its Life now lives.
    let (status, reply) = api
        .post("/schedules", &json!({"life_uuid": "pend-term", "birth_time": "2031-01-01 00:00:00", "birth": {"path": "/x", "method": "POST"}}))
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("duplicate_life_uuid")),
        "{reply}"
    );
}

/// Whether `now` holds everything `before` does: the same scalars, arrays of the same
/// length whose items include the old ones, objects with every old key included. A time
/// the fixture's build answered in epoch ms (a run record's `should_run_at`,
/// `started_at`) is answered since the API contract (issue 29) as RFC 3339 with the
/// same ms beside it in `<name>_ms`: that counts as the same value.
fn includes(now: &Value, before: &Value) -> bool {
    match (now, before) {
        (Value::Object(n), Value::Object(b)) => b.iter().all(|(k, v)| {
            n.get(k).is_some_and(|nv| includes(nv, v))
                || (v.is_i64()
                    && n.get(k).is_some_and(Value::is_string)
                    && n.get(&format!("{k}_ms")) == Some(v))
        }),
        (Value::Array(n), Value::Array(b)) => {
            n.len() == b.len() && n.iter().zip(b).all(|(nv, bv)| includes(nv, bv))
        }
        _ => now == before,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_with_a_hash_per_plan_is_folded_into_records() {
    let redis = RedisServer::start_from_rdb(&fixtures_dir().join("layout2/dump.rdb"));
    let sink = Sink::start().await;
    let plan_keys = |redis: &RedisServer| -> Vec<String> {
        redis
            .cli(&["--scan", "--pattern", "kairos:{*}:plan:*"])
            .lines()
            .map(|k| k.trim_matches('"').to_string())
            .filter(|k| k.ends_with(":birth") || k.ends_with(":death"))
            .collect()
    };
    // The fixture is what that build wrote: a hash for each of the 9 Plans of 7 Lives.
    assert_eq!(plan_keys(&redis).len(), 9);

    let err = serve_refused(&redis);
    assert!(
        err.contains("layout 2") && err.contains("kairos migrate"),
        "{err}"
    );

    let out = migrate(&redis);
    assert!(
        out.contains("folded the Plans of 7 Lives into their Lives' hashes (layout 3)")
            && out.contains("folded 7 Lives into compact records (32 shards, layout 4)"),
        "{out}"
    );
    assert_eq!(plan_keys(&redis), Vec::<String>::new());
    assert_eq!(
        redis.cli(&["HGET", "kairos:meta", "layout"]).trim(),
        "\"4\""
    );
    let again = migrate(&redis);
    assert!(again.contains("nothing to do"), "{again}");

    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--schedule-history-duration-days", "36500")]),
    );
    let api = Api::new(&host);
    // Every Life reads back exactly as that build showed it: fields, Plans, history.
    for line in fixture_of("layout2", "lives.jsonl").lines() {
        let old: Value = serde_json::from_str(line).unwrap();
        let id = old["life"].as_str().unwrap();
        let (status, view) = api.get(&format!("/schedules/{id}")).await;
        assert_eq!(status, 200, "{id}: {view}");
        assert_eq!(
            as_before_outcomes(&view),
            old["view"],
            "{id} reads back otherwise"
        );
    }
    let (_, list) = api.get("/schedules?limit=100").await;
    let old_list: Value = serde_json::from_str(&fixture_of("layout2", "list.json")).unwrap();
    assert_eq!(as_before_outcomes(&list), old_list);
    // A timer's and a task's Plans keep their own hashes, untouched.
    for (path, file) in [
        ("/timers", "timers.json"),
        ("/queues/mail/tasks", "mail-tasks.json"),
    ] {
        let (status, now) = api.get(path).await;
        assert_eq!(status, 200, "{path}: {now}");
        let before: Value = serde_json::from_str(&fixture_of("layout2", file)).unwrap();
        assert!(
            includes(&now, &before),
            "{path} reads back otherwise:\nnow {now:#}\nbefore {before:#}"
        );
    }

    // The folded Plans are live. A pending point moved to now fires once.
    let soon = now_ms() + 1_500;
    let (status, reply) = api
        .patch(
            "/schedules/pend-res",
            &json!({"birth_time": rfc3339_ms(soon)}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    // An Alive term cancelled: its death runs now, to the path booked for it.
    let (status, reply) = api.delete("/schedules/alive-term").await;
    assert_eq!(status, 200, "{reply}");
    let got = sink
        .wait_until(
            "pend-res's birth and alive-term's death",
            Duration::from_secs(10),
            |got| {
                got.iter()
                    .any(|r| r.header("x-kairos-life") == Some("pend-res"))
                    && got
                        .iter()
                        .any(|r| r.header("x-kairos-life") == Some("alive-term"))
            },
        )
        .await;
    let off: Vec<_> = got
        .iter()
        .filter(|r| r.header("x-kairos-life") == Some("alive-term"))
        .collect();
    assert_eq!(off.len(), 1);
    assert_eq!(off[0].path, "/off");
    let dead = api
        .wait_life("alive-term", Duration::from_secs(5), |l| {
            l["state"] == "Dead"
        })
        .await;
    assert_eq!(dead["plans"][1]["state"], "Done", "{dead:#}");
    // The resource guard reads the folded Lives: pend-term still holds conn-2.
    let (status, reply) = api
        .post(
            "/schedules",
            &json!({"life_uuid": "clash", "schedule_type": "term", "resource_id": "conn-2",
                    "birth_time": "2030-06-01 10:30:00", "death_time": "2030-06-01 11:00:00",
                    "birth": {"path": "/x", "method": "POST"}, "death": {"path": "/y", "method": "POST"}}),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("resource_conflict")),
        "{reply}"
    );
}

/// Keys of the shards that layout 3 had and layout 4 has not: Life hashes, the plain
/// sorted sets set aside while folding, the fold's own markers.
fn layout3_keys(redis: &RedisServer) -> Vec<String> {
    redis
        .cli(&["--scan", "--pattern", "kairos:{*}:*"])
        .lines()
        .map(|k| k.trim_matches('"').to_string())
        .filter(|k| {
            let rest = k.split_once("}:").map_or("", |(_, r)| r);
            rest.starts_with("life:") || ["due3", "lives3", "finished3", "fold4"].contains(&rest)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_with_a_hash_per_life_is_folded_into_records() {
    let redis = RedisServer::start_from_rdb(&fixtures_dir().join("layout3/dump.rdb"));
    let sink = Sink::start().await;
    let lives: Vec<Value> = fixture_of("layout3", "lives.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lives.len(), 10, "the fixture's Lives");
    let hashes = layout3_keys(&redis);
    assert_eq!(hashes.len(), 10, "a hash per Life: {hashes:?}");

    let err = serve_refused(&redis);
    assert!(
        err.contains("layout 3") && err.contains("kairos migrate"),
        "{err}"
    );

    let out = migrate(&redis);
    assert!(
        out.contains("folded 10 Lives into compact records (32 shards, layout 4)"),
        "{out}"
    );
    assert_eq!(layout3_keys(&redis), Vec::<String>::new());
    let records = redis.cli(&["--scan", "--pattern", "kairos:{*}:r:*"]);
    assert!(!records.trim().is_empty(), "no record buckets");
    assert_eq!(
        redis.cli(&["HGET", "kairos:meta", "layout"]).trim(),
        "\"4\""
    );
    let again = migrate(&redis);
    assert!(again.contains("nothing to do"), "{again}");

    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--schedule-history-duration-days", "36500")]),
    );
    let api = Api::new(&host);
    // Every Life reads back exactly as that build showed it: fields, Plans, history
    // (a retried run, a callback's Life, a debounced Life among them).
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
    let (_, list) = api.get("/schedules?limit=100").await;
    let old_list: Value = serde_json::from_str(&fixture_of("layout3", "list.json")).unwrap();
    assert_eq!(as_before_outcomes(&list), old_list);
    // The migrated failures are indexed: GET /failures lists each Life whose birth failed.
    let mut failed: Vec<String> = lives
        .iter()
        .filter(|old| {
            old["view"]["plans"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["state"] == "Failed"))
        })
        .map(|old| old["life"].as_str().unwrap().to_string())
        .collect();
    failed.sort();
    assert!(!failed.is_empty(), "the fixture has failed Lives");
    let (_, failures) = api.get("/failures").await;
    let mut listed: Vec<String> = failures["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["life_uuid"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, failed, "{failures:#}");
    for (path, file) in [
        ("/timers", "timers.json"),
        ("/queues/mail/tasks", "mail-tasks.json"),
    ] {
        let (status, now) = api.get(path).await;
        assert_eq!(status, 200, "{path}: {now}");
        let before: Value = serde_json::from_str(&fixture_of("layout3", file)).unwrap();
        assert!(
            includes(&now, &before),
            "{path} reads back otherwise:\nnow {now:#}\nbefore {before:#}"
        );
    }

    // The debounce key's folded Life takes a third booking while its window is open (30
    // days from the capture); once it has passed, that Life fires and a booking opens a
    // new window.
    let window = lives
        .iter()
        .find(|l| l["view"]["debounce"]["key"] == "sync-42")
        .expect("the fixture's debounced Life");
    let open = window["view"]["birth_time_ms"].as_i64().unwrap() > now_ms() + 10_000;
    let (status, reply) = api
        .post(
            "/schedules",
            &json!({"birth": {"path": "/sync", "method": "POST", "body": {"n": 3}},
                    "debounce": {"key": "sync-42", "period": "1h", "max_wait": "2h"}}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["debounced"].as_bool().unwrap_or(false),
        open,
        "window open: {open}; {reply}"
    );
    assert_eq!(reply["life_uuid"] == window["life"], open, "{reply}");
    // The folded Plans are live: a pending point moved to now fires once; an Alive term
    // cancelled runs its death now, to the path booked for it.
    let soon = now_ms() + 1_500;
    let (status, reply) = api
        .patch(
            "/schedules/pend-res",
            &json!({"birth_time": rfc3339_ms(soon)}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = api.delete("/schedules/alive-term").await;
    assert_eq!(status, 200, "{reply}");
    sink.wait_until(
        "pend-res's birth and alive-term's death",
        Duration::from_secs(10),
        |got| {
            ["pend-res", "alive-term"]
                .iter()
                .all(|id| got.iter().any(|r| r.header("x-kairos-life") == Some(id)))
        },
    )
    .await;
    let dead = api
        .wait_life("alive-term", Duration::from_secs(5), |l| {
            l["state"] == "Dead"
        })
        .await;
    assert_eq!(dead["plans"][1]["state"], "Done", "{dead:#}");
    assert_eq!(history(&dead).len(), 2, "{dead:#}");
    let (status, reply) = api
        .post(
            "/schedules",
            &json!({"life_uuid": "clash", "schedule_type": "term", "resource_id": "conn-2",
                    "birth_time": "2030-06-01 10:30:00", "death_time": "2030-06-01 11:00:00",
                    "birth": {"path": "/x", "method": "POST"}, "death": {"path": "/y", "method": "POST"}}),
        )
        .await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("resource_conflict")),
        "{reply}"
    );
}

/// A migration from layout 3 killed half-way (kill -9) is finished by running it again:
/// every Life is there once, as a record, and reads back as it was. The keyspace is the
/// layout-3 fixture with 20,000 copies of its pending point `pend-point`, each written
/// as that build wrote a Life (its hash, its `due` and `lives` entries, its census count)
/// in its id's home shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_killed_half_way_is_finished_by_running_it_again() {
    let redis = RedisServer::start_from_rdb(&fixtures_dir().join("layout3/dump.rdb"));
    let sink = Sink::start().await;
    let ks = redis.keyspace().await;
    let mut conn = redis.conn().await;
    let template: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(ks.life("pend-point").key_of("life:pend-point"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(template["state"], "Inexistent", "{template:?}");
    let birth: i64 = template["birth_at_ms"].parse().unwrap();
    const COPIES: usize = 20_000;
    for chunk in (0..COPIES).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            let id = format!("copy-{i:05}");
            let k = ks.life(&id);
            let fields: Vec<(&String, &String)> = template.iter().collect();
            pipe.cmd("HSET")
                .arg(k.key_of(&format!("life:{id}")))
                .arg(fields)
                .ignore();
            pipe.cmd("ZADD")
                .arg(k.due())
                .arg(birth)
                .arg(format!("{id}:birth"))
                .ignore();
            pipe.cmd("ZADD")
                .arg(k.lives())
                .arg(0)
                .arg(format!("{birth:013}:{id}"))
                .ignore();
            pipe.cmd("HINCRBY")
                .arg(k.census())
                .arg("Inexistent")
                .arg(1)
                .ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();
    }

    let mut first = std::process::Command::new(kairos_bin())
        .args(["migrate", "--redis-url", &redis.url()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once it has folded some Lives, and well before it is done.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(std::time::Instant::now() < deadline, "the fold never began");
        assert!(
            first.try_wait().unwrap().is_none(),
            "the fold ended before the kill"
        );
        let left = layout3_keys(&redis).len();
        if left < COPIES * 3 / 4 {
            assert!(left > 0, "the fold ended before the kill");
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(
        redis.cli(&["HGET", "kairos:meta", "layout"]).trim(),
        "\"3\"",
        "cut off before the end"
    );

    let out = migrate(&redis);
    assert!(
        out.contains("compact records (32 shards, layout 4)"),
        "{out}"
    );
    assert_eq!(layout3_keys(&redis), Vec::<String>::new());
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--schedule-history-duration-days", "36500")]),
    );
    let api = Api::new(&host);
    assert_eq!(
        redis.count_all("lives").await,
        (COPIES + 10) as i64,
        "every Life once"
    );
    assert_eq!(
        redis.count_all("due").await,
        // The copies, and the fixture's three pending births, its debounced one, its
        // Alive term's death and its timer.
        (COPIES + 6) as i64
    );
    let (_, metrics) = api.text("/metrics").await;
    let inexistent = metrics
        .lines()
        .find(|l| l.starts_with("kairos_lives{state=\"Inexistent\"}"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(
        inexistent.ends_with(&format!(" {}", COPIES + 4)),
        "{inexistent}"
    );
    let (_, template_view) = api.get("/schedules/pend-point").await;
    for i in [0, 7_777, COPIES - 1] {
        let id = format!("copy-{i:05}");
        let (status, mut view) = api.get(&format!("/schedules/{id}")).await;
        assert_eq!(status, 200, "{id}: {view}");
        view["life_uuid"] = template_view["life_uuid"].clone();
        assert_eq!(view, template_view, "{id} reads back otherwise");
    }
}

/// A host that creates the keyspace marks each shard's census exact. A host records the
/// format of the records it writes in `kairos:meta` (`records`),
/// raising an older one, and will not open a keyspace of a later format: it could not
/// read those records, so it says to run the later build instead of misreading them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_keyspace_is_marked_and_a_later_record_format_refused() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &[]);
    let format = kairos::store::record::RECORD_FORMAT.to_string();
    let records = |redis: &RedisServer| {
        redis
            .cli(&["HGET", "kairos:meta", "records"])
            .trim()
            .trim_matches('"')
            .to_string()
    };
    assert_eq!(records(&redis), format);
    // A keyspace created now has every shard's census marked exact (`v`), so that no
    // listing ever counts a shard's Lives afresh in one long script.
    for k in redis.keyspace().await.shards() {
        assert_eq!(
            redis
                .cli(&["HGET", &k.census(), "v"])
                .trim()
                .trim_matches('"'),
            "1",
            "{}",
            k.census()
        );
    }
    drop(host);

    // A keyspace written before the field, or by an older format: raised on open.
    redis.cli(&["HSET", "kairos:meta", "records", "1"]);
    let host = Host::start(&redis.url(), &[]);
    assert_eq!(records(&redis), format);
    drop(host);

    // A later format: refused, and the keyspace left as it is.
    let later = (kairos::store::record::RECORD_FORMAT + 1).to_string();
    redis.cli(&["HSET", "kairos:meta", "records", &later]);
    let err = serve_refused(&redis);
    assert!(
        err.contains(&format!("records of format {later}")) && err.contains("later kairos"),
        "{err}"
    );
    assert_eq!(records(&redis), later);
}
