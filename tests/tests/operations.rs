//! Operating a host (SPEC sections 3, 4 and 7), end to end against a real redis-server,
//! real `kairos serve` processes and a real HTTP sink: the retention sweep, webhook
//! signatures, back-pressure that never drops work, and PATCH / DELETE of Plans a host
//! already holds in memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use kairos_e2e::*;
use serde_json::{json, Value};
use sha2::Sha256;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

async fn zscore(redis: &RedisServer, key: &str, member: &str) -> Option<String> {
    let mut conn = redis.conn().await;
    redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query_async(&mut conn)
        .await
        .expect("ZSCORE answers")
}

async fn keys_matching(redis: &RedisServer, pattern: &str) -> Vec<String> {
    let mut conn = redis.conn().await;
    redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut conn)
        .await
        .expect("KEYS answers")
}

/// The shard a Life lives in (its resource's, else its id's).
async fn shard_of(
    redis: &RedisServer,
    id: &str,
    resource: Option<&str>,
) -> kairos::store::ShardKeys {
    let ks = redis.keyspace().await;
    match resource {
        Some(rid) => ks.resource(rid).clone(),
        None => ks.life(id).clone(),
    }
}

/// Every Redis trace of one Life, as (what, present?) pairs.
async fn traces(
    redis: &RedisServer,
    id: &str,
    birth_ms: i64,
    resource: Option<&str>,
) -> Vec<(String, bool)> {
    let k = shard_of(redis, id, resource).await;
    let mut out = vec![
        (
            format!("{id}'s record"),
            redis.life_record(&k, id).await.is_some(),
        ),
        (
            format!("{id}'s birth Plan"),
            redis.plan_exists(&k, &format!("{id}:birth")).await,
        ),
        (
            format!("lives member {id} at {birth_ms}"),
            redis.tree_score(&k.lives(), id).await == Some(birth_ms),
        ),
        (
            format!("finished member {id}"),
            redis.finished_at(&k, id).await.is_some(),
        ),
    ];
    if let Some(rid) = resource {
        out.push((
            format!("resource:{rid} member {id}"),
            zscore(redis, &k.resource(rid), id).await.is_some(),
        ));
    }
    out
}

/// Entries of the shards' `runs` streams that name Life `id`.
async fn runs_of(redis: &RedisServer, id: &str) -> usize {
    let mut conn = redis.conn().await;
    let mut entries: Vec<(String, Vec<String>)> = Vec::new();
    for key in redis.keyspace().await.every("runs") {
        let part: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .expect("XRANGE answers");
        entries.extend(part);
    }
    entries
        .iter()
        .filter(|(_, fields)| {
            fields
                .chunks(2)
                .any(|kv| kv.len() == 2 && kv[0] == "life" && kv[1] == id)
        })
        .count()
}

/// Polls GET /schedules/{id} until it answers 404; returns when it did (epoch ms).
async fn wait_gone(api: &Api, id: &str, within: Duration, host: &Host) -> i64 {
    let deadline = Instant::now() + within;
    loop {
        let (status, life) = api.get(&format!("/schedules/{id}")).await;
        if status == 404 {
            return now_ms();
        }
        assert_eq!(status, 200, "GET /schedules/{id}: {life:#}");
        assert!(
            Instant::now() < deadline,
            "Life {id} was not swept within {within:?}: {life:#}\nlog:\n{}",
            host.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

type HmacSha256 = Hmac<Sha256>;

/// Splits `t={secs},v1={hex}`.
fn parse_signature(header: &str) -> (i64, String) {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", v)) => t = v.parse::<i64>().ok(),
            Some(("v1", v)) => v1 = Some(v.to_string()),
            _ => panic!("unexpected part `{part}` in signature `{header}`"),
        }
    }
    (
        t.unwrap_or_else(|| panic!("no t= in signature `{header}`")),
        v1.unwrap_or_else(|| panic!("no v1= in signature `{header}`")),
    )
}

/// Whether `v1` is the HMAC-SHA256 of `"{t}.{body}"` under `key`.
fn signature_valid(key: &[u8], t: i64, body: &[u8], v1: &str) -> bool {
    let Ok(expected) = hex::decode(v1) else {
        return false;
    };
    let mut mac = HmacSha256::new_from_slice(key).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.verify_slice(&expected).is_ok()
}

// ---------------------------------------------------------------------------------------
// 1. Retention: finished Lives are swept with every key they had; pending ones are not
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_lives_are_swept_after_retention_with_all_their_keys() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // 0.00003 days = 2592 ms of retention; the supervisor sweeps every second.
    let retention_ms = 2592;
    let host = Host::start(
        &redis.url(),
        &flags(
            &sink,
            &[
                ("--schedule-history-duration-days", "0.00003"),
                // The runs stream is off by default; kept here to see it trimmed.
                ("--runs-stream-max-len", "1000"),
            ],
        ),
    );
    let api = Api::new(&host);

    let pt = "sweep-point";
    let tm = "sweep-term";
    let keep = "keep-2030";
    let pt_ms = now_ms() + 1000;
    let tm_birth = pt_ms;
    let tm_death = tm_birth + 1200;
    let keep_ms = chrono::DateTime::parse_from_rfc3339("2030-06-01T12:00:00Z")
        .unwrap()
        .timestamp_millis();

    let mut body = point(pt, pt_ms, hook(pt));
    body["resource_id"] = json!("res-point");
    book(&api, &body).await;
    let mut body = term(tm, tm_birth, tm_death, hook("tm-on"), hook("tm-off"));
    body["resource_id"] = json!("res-term");
    book(&api, &body).await;
    let mut body = point(keep, keep_ms, hook(keep));
    body["resource_id"] = json!("res-keep");
    book(&api, &body).await;
    // Cancelled before birth: a Stillbirth, finished now, swept like the others.
    let gone = "sweep-cancelled";
    let gone_ms = keep_ms + 86_400_000;
    let mut body = point(gone, gone_ms, hook(gone));
    body["resource_id"] = json!("res-cancelled");
    book(&api, &body).await;
    let (status, reply) = api.delete(&format!("/schedules/{gone}")).await;
    assert_eq!(status, 200, "{reply:#}");
    assert_eq!(reply["state"], "Stillbirth", "{reply:#}");
    let cancelled_at = now_ms();
    for (what, present) in traces(&redis, gone, gone_ms, Some("res-cancelled")).await {
        assert!(present, "{what} must exist while the Life is retained");
    }

    // The point Life runs and dies; every key of it is there until retention passes.
    let dead = api
        .wait_life(pt, Duration::from_secs(5), |l| {
            state(l) == "Dead" && !history(l).is_empty()
        })
        .await;
    assert_eq!(history(&dead)[0]["outcome"], "success", "{dead:#}");
    let pt_finished = dead["finished_at_ms"]
        .as_i64()
        .unwrap_or_else(|| panic!("a Dead Life shows finished_at_ms: {dead:#}"));
    for (what, present) in traces(&redis, pt, pt_ms, Some("res-point")).await {
        assert!(present, "{what} must exist while the Life is retained");
    }

    let dead = api
        .wait_life(tm, Duration::from_secs(6), |l| {
            state(l) == "Dead" && history(l).len() >= 2
        })
        .await;
    let tm_finished = dead["finished_at_ms"]
        .as_i64()
        .unwrap_or_else(|| panic!("a Dead Life shows finished_at_ms: {dead:#}"));
    assert_eq!(plan(&dead, "birth")["state"], "Done");
    assert_eq!(plan(&dead, "death")["state"], "Done");
    for (what, present) in traces(&redis, tm, tm_birth, Some("res-term")).await {
        assert!(present, "{what} must exist while the Life is retained");
    }
    let tm_shard = shard_of(&redis, tm, Some("res-term")).await;
    assert!(redis.plan_exists(&tm_shard, &format!("{tm}:death")).await);
    assert_eq!(
        sink.received().len(),
        3,
        "birth of the point, birth and death of the term"
    );

    // The operators' stream has the runs.
    let mut conn = redis.conn().await;
    let mut xlen = 0i64;
    for key in redis.keyspace().await.every("runs") {
        let n: i64 = redis::cmd("XLEN")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        xlen += n;
    }
    assert!(
        xlen >= 3,
        "the runs streams hold {xlen} entries, expected >= 3"
    );
    assert!(
        runs_of(&redis, pt).await >= 1,
        "no run of {pt} in its shard's runs stream"
    );
    assert!(
        runs_of(&redis, tm).await >= 2,
        "runs of {tm} missing in its shard's runs stream"
    );

    // Both go, not before their retention, and within retention + a sweep period + slack.
    let pt_gone = wait_gone(&api, pt, Duration::from_secs(8), &host).await;
    let tm_gone = wait_gone(&api, tm, Duration::from_secs(8), &host).await;
    assert!(
        pt_gone - pt_finished >= retention_ms - 100,
        "{pt} swept {} ms after it finished, retention is {retention_ms} ms",
        pt_gone - pt_finished
    );
    assert!(
        tm_gone - tm_finished >= retention_ms - 100,
        "{tm} swept {} ms after it finished, retention is {retention_ms} ms",
        tm_gone - tm_finished
    );

    let gone_gone = wait_gone(&api, gone, Duration::from_secs(8), &host).await;
    assert!(
        gone_gone - cancelled_at >= retention_ms - 100,
        "{gone} swept {} ms after it was cancelled, retention is {retention_ms} ms",
        gone_gone - cancelled_at
    );

    for (id, birth, rid) in [
        (pt, pt_ms, "res-point"),
        (tm, tm_birth, "res-term"),
        (gone, gone_ms, "res-cancelled"),
    ] {
        for (what, present) in traces(&redis, id, birth, Some(rid)).await {
            assert!(!present, "{what} is left after the sweep");
        }
        let k = shard_of(&redis, id, Some(rid)).await;
        assert!(!redis.plan_exists(&k, &format!("{id}:death")).await);
        assert!(redis
            .tree_score(&k.due(), &format!("{id}:birth"))
            .await
            .is_none());
        assert!(redis
            .tree_score(&k.due(), &format!("{id}:death"))
            .await
            .is_none());
        let left = keys_matching(&redis, &format!("kairos:*{id}*")).await;
        assert!(left.is_empty(), "keys of swept Life {id} remain: {left:?}");
    }
    assert_eq!(
        keys_matching(&redis, "kairos:*order:*").await,
        [shard_of(&redis, keep, Some("res-keep"))
            .await
            .order("res-keep")],
        "no resource order set outlives the Plans in it; the pending Life's stays"
    );

    // The pending Life is untouched.
    let (status, kept) = api.get(&format!("/schedules/{keep}")).await;
    assert_eq!(status, 200, "a pending Life must not be swept: {kept:#}");
    assert_eq!(state(&kept), "Inexistent");
    assert_eq!(plan(&kept, "birth")["state"], "Standby");
    for (what, present) in traces(&redis, keep, keep_ms, Some("res-keep")).await {
        let in_finished = what.starts_with("finished");
        assert_eq!(
            present, !in_finished,
            "{what}: present = {present} for a pending Life"
        );
    }
    assert_eq!(
        redis
            .tree_score(
                &shard_of(&redis, keep, Some("res-keep")).await.due(),
                &format!("{keep}:birth")
            )
            .await,
        Some(keep_ms),
        "the pending Plan is still due"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Webhook signature (SPEC section 7)
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_with_the_configured_key() {
    let key = "s3cret";
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--signing-key", key)]));
    let api = Api::new(&host);

    // And a host without a key, on its own Redis and sink.
    let redis_plain = RedisServer::start();
    let sink_plain = Sink::start().await;
    let host_plain = Host::start(&redis_plain.url(), &flags(&sink_plain, &[]));
    let api_plain = Api::new(&host_plain);

    let at = now_ms() + 1000;
    let json_body = json!({"id": "a0", "method": "activate", "n": [1, 2.5, null], "s": "é\"x"});
    let text_body = "plain text, not JSON: {é} \"quoted\"\n";
    book(
        &api,
        &point(
            "sig-json",
            at,
            json!({"path": "/signed", "method": "POST", "body": json_body}),
        ),
    )
    .await;
    book(
        &api,
        &point(
            "sig-text",
            at,
            json!({"path": "/signed", "method": "PUT", "body": text_body}),
        ),
    )
    .await;
    book(
        &api_plain,
        &point(
            "unsigned",
            at,
            json!({"path": "/plain", "method": "POST", "body": json_body}),
        ),
    )
    .await;

    let got = sink.wait_count(2, Duration::from_secs(6)).await;
    let plain = sink_plain.wait_count(1, Duration::from_secs(6)).await;
    let now_s = chrono::Utc::now().timestamp();

    let find = |id: &str| {
        got.iter()
            .find(|r| r.header("x-kairos-life") == Some(id))
            .unwrap_or_else(|| panic!("no call for {id}: {got:?}"))
            .clone()
    };
    for id in ["sig-json", "sig-text"] {
        let r = find(id);
        let header = r
            .header("x-kairos-signature")
            .unwrap_or_else(|| panic!("{id}: no X-Kairos-Signature header: {r:?}"));
        let (t, v1) = parse_signature(header);
        assert!(
            (t - now_s).abs() <= 60,
            "{id}: signature time {t} is not within 60 s of now ({now_s})"
        );
        assert!(
            t >= at / 1000 - 1,
            "{id}: signature time {t} is before the Plan fired ({at} ms)"
        );
        assert_eq!(v1.len(), 64, "{id}: v1 is 32 bytes of hex: {header}");
        assert!(
            signature_valid(key.as_bytes(), t, &r.body, &v1),
            "{id}: signature {header} does not verify over the body received ({:?})",
            String::from_utf8_lossy(&r.body)
        );
        assert!(
            !signature_valid(b"another key", t, &r.body, &v1),
            "{id}: a different key must not verify"
        );
        assert!(
            !signature_valid(key.as_bytes(), t + 1, &r.body, &v1),
            "{id}: the timestamp is part of what is signed"
        );
    }

    let r = find("sig-json");
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/signed");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let sent: Value = serde_json::from_slice(&r.body).expect("the JSON body arrives as JSON");
    assert_eq!(sent, json_body);

    let r = find("sig-text");
    assert_eq!(r.method, "PUT");
    assert_eq!(
        std::str::from_utf8(&r.body).expect("UTF-8 body"),
        text_body,
        "a string body is sent verbatim"
    );
    assert_ne!(
        r.header("content-type"),
        Some("application/json"),
        "a string body is not labelled JSON"
    );

    assert_eq!(plain.len(), 1);
    let r = &plain[0];
    assert_eq!(r.header("x-kairos-life"), Some("unsigned"));
    assert_eq!(
        r.header("x-kairos-signature"),
        None,
        "a host without a signing key sends no signature"
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    let sent: Value = serde_json::from_slice(&r.body).expect("JSON body");
    assert_eq!(sent, json_body);
}

// ---------------------------------------------------------------------------------------
// 3. Back-pressure stops claiming, never drops work
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_pressure_bounds_claims_and_drops_nothing() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    sink.set_delay(Duration::from_millis(150));
    let host = Host::start(
        &redis.url(),
        &flags(
            &sink,
            &[
                ("--max-claimed", "3"),
                ("--workers", "1"),
                ("--timedout-queue-max-size", "1"),
            ],
        ),
    );
    let api = Api::new(&host);
    let ks = redis.keyspace().await;
    let inflight_keys: Vec<String> = ks.shards().iter().map(|k| k.inflight()).collect();
    let due_keys = ks.every("due");

    // Sample the held sets and the due sets from before the first booking to the end.
    let stop = Arc::new(AtomicBool::new(false));
    let max_held = Arc::new(AtomicI64::new(0));
    let max_due = Arc::new(AtomicI64::new(0));
    let samples = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (stop, max_held, max_due, samples) = (
            stop.clone(),
            max_held.clone(),
            max_due.clone(),
            samples.clone(),
        );
        let url = redis.url();
        let (inflight_keys, due_keys) = (inflight_keys.clone(), due_keys.clone());
        tokio::spawn(async move {
            let mut conn = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            while !stop.load(Ordering::Acquire) {
                // Lives' Plans held are in the shards' `inflight` hashes; those waiting,
                // in the `due` trees.
                let mut pipe = redis::pipe();
                for key in &inflight_keys {
                    pipe.cmd("HLEN").arg(key);
                }
                let counts: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
                let held: i64 = counts.iter().sum();
                let mut due = 0;
                for key in &due_keys {
                    due += kairos::store::inspect::tree_members(&mut conn, key)
                        .await
                        .unwrap()
                        .len() as i64;
                }
                max_held.fetch_max(held, Ordering::AcqRel);
                max_due.fetch_max(due, Ordering::AcqRel);
                samples.fetch_add(1, Ordering::AcqRel);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let at = now_ms() + 1000;
    let mut booked = HashMap::new();
    for i in 0..12 {
        let id = format!("bp{i:02}");
        book(&api, &point(&id, at, hook(&id))).await;
        booked.insert(id, at);
    }

    // 12 calls of 150 ms through one worker: about 1.8 s after the fire time.
    let got = sink.wait_count(12, Duration::from_secs(12)).await;
    let ids: Vec<String> = booked.keys().cloned().collect();
    for id in &ids {
        let left = Duration::from_secs(5);
        api.wait_life(id, left, |l| state(l) == "Dead").await;
    }
    // A moment more, for any duplicate to show up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Release);
    sampler.await.unwrap();

    let got_after = sink.received();
    assert_eq!(
        got_after.len(),
        12,
        "12 Plans, 12 calls: {:?}",
        got_after
            .iter()
            .map(|r| r.header("x-kairos-life"))
            .collect::<Vec<_>>()
    );
    let mut per_life: HashMap<String, usize> = HashMap::new();
    for r in &got {
        *per_life
            .entry(r.header("x-kairos-life").unwrap_or("<none>").to_string())
            .or_default() += 1;
        assert!(r.at_ms >= at, "a Plan fired {} ms early", at - r.at_ms);
        assert_eq!(r.header("x-kairos-execution-count"), Some("1"), "{r:?}");
    }
    for id in &ids {
        assert_eq!(per_life.get(id), Some(&1), "Life {id} calls: {per_life:?}");
    }

    let max_held = max_held.load(Ordering::Acquire);
    let max_due = max_due.load(Ordering::Acquire);
    let samples = samples.load(Ordering::Acquire);
    eprintln!("back-pressure: {samples} samples, held at most {max_held}, due at most {max_due}");
    assert!(samples >= 20, "only {samples} samples taken");
    assert!(
        max_held <= 3,
        "the host held {max_held} Plans at once with --max-claimed 3\nlog:\n{}",
        host.log_text()
    );
    assert!(max_held >= 1, "the sampler never saw a claimed Plan");
    assert!(
        max_due >= 9,
        "with at most 3 claimed, at least 9 of 12 wait in the due set (saw {max_due})"
    );
    assert_eq!(sink.max_concurrent(""), 1, "one worker: one call at a time");
    assert_eq!(redis.count_all("held").await, 0, "nothing held at the end");
    assert_eq!(redis.count_all("due").await, 0, "nothing due at the end");
}

// ---------------------------------------------------------------------------------------
// 4. PATCH and DELETE of a Plan already claimed into a host's memory
// ---------------------------------------------------------------------------------------

/// Books a point Life due in `in_ms` and waits until a host holds its Plan (Preset).
async fn book_and_wait_preset(api: &Api, id: &str, in_ms: i64) -> i64 {
    let at = now_ms() + in_ms;
    book(api, &point(id, at, hook(id))).await;
    let life = api
        .wait_life(id, Duration::from_millis(in_ms as u64 / 2), |l| {
            plan(l, "birth")["state"] == "Preset"
        })
        .await;
    assert!(
        now_ms() < at,
        "the Plan must be seen Preset before it fires"
    );
    assert!(
        plan(&life, "birth")["held_by"].is_string(),
        "a Preset Plan shows its holder: {life:#}"
    );
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_moves_a_claimed_plan_to_its_new_time() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    // Default look-ahead (5 min): the Plan is claimed into memory as soon as it is booked.
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let id = "moved";
    let old_ms = book_and_wait_preset(&api, id, 2000).await;
    assert_eq!(redis.held_by(&host.host_id).await, 1);

    let new_ms = now_ms() + 4000;
    let (status, reply) = api
        .patch(
            &format!("/schedules/{id}"),
            &json!({"birth_time": rfc3339_ms(new_ms)}),
        )
        .await;
    assert_eq!(status, 200, "PATCH of a Preset Plan: {reply:#}");
    assert_eq!(reply["birth_time_ms"], new_ms, "{reply:#}");
    let p = plan(&reply, "birth");
    assert_eq!(p["fire_at_ms"], new_ms, "{reply:#}");
    let s = p["state"].as_str().unwrap_or("");
    assert!(
        s == "Standby" || s == "Preset",
        "moved Plan is pending: {reply:#}"
    );

    // Nothing at the old time (wait a good while past it).
    while now_ms() < old_ms + 1000 {
        assert!(
            sink.received().is_empty(),
            "the moved Plan fired at its old time: {:?}",
            sink.received()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Claimed again for its new time.
    let life = api
        .wait_life(id, Duration::from_secs(2), |l| {
            plan(l, "birth")["state"] == "Preset"
        })
        .await;
    assert_eq!(plan(&life, "birth")["fire_at_ms"], new_ms);
    assert_eq!(state(&life), "Inexistent");

    let got = sink.wait_count(1, Duration::from_secs(6)).await;
    let r = &got[0];
    assert!(
        r.at_ms >= new_ms,
        "fired {} ms before its new time",
        new_ms - r.at_ms
    );
    assert!(
        r.at_ms < new_ms + 1000,
        "fired {} ms after its new time",
        r.at_ms - new_ms
    );
    assert_eq!(r.header("x-kairos-eta"), Some(new_ms.to_string().as_str()));
    assert_eq!(r.header("x-kairos-execution-count"), Some("1"));

    let dead = api
        .wait_life(id, Duration::from_secs(3), |l| state(l) == "Dead")
        .await;
    let runs = history(&dead);
    assert_eq!(runs.len(), 1, "one run in history: {dead:#}");
    assert_eq!(runs[0]["should_run_at_ms"], new_ms);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        sink.received().len(),
        1,
        "exactly one call: {:?}",
        sink.received()
    );
    assert_eq!(redis.count_all("held").await, 0, "nothing left held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_claimed_plan_never_fires() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let shard = redis.keyspace().await.life("dropped").clone();

    let id = "dropped";
    let at = book_and_wait_preset(&api, id, 2000).await;
    // A neighbour at the same time shows the host was firing meanwhile.
    book(&api, &point("neighbour", at, hook("neighbour"))).await;

    let (status, reply) = api.delete(&format!("/schedules/{id}")).await;
    assert_eq!(status, 200, "DELETE of a Preset Plan: {reply:#}");
    assert_eq!(reply["state"], "Stillbirth", "{reply:#}");
    assert!(
        redis
            .plan_field(&shard, &format!("{id}:birth"), "claims")
            .await
            .is_none(),
        "a cancelled Plan is no longer held"
    );

    sink.wait_until("the neighbour fired", Duration::from_secs(5), |got| {
        got.iter()
            .any(|r| r.header("x-kairos-life") == Some("neighbour"))
    })
    .await;
    while now_ms() < at + 1000 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mine = sink.received_for(id);
    assert!(mine.is_empty(), "the deleted Plan fired: {mine:?}");
    assert_eq!(
        sink.received().len(),
        1,
        "only the neighbour: {:?}",
        sink.received()
    );

    let (status, life) = api.get(&format!("/schedules/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(state(&life), "Stillbirth");
    assert_eq!(plan(&life, "birth")["state"], "Cancelled", "{life:#}");
    assert!(history(&life).is_empty(), "nothing ran: {life:#}");
    api.wait_life("neighbour", Duration::from_secs(3), |l| state(l) == "Dead")
        .await;
    assert_eq!(redis.count_all("held").await, 0, "nothing left held");
}

/// `kairos export-runs` prints every run the shards' `runs` streams hold as JSON lines
/// (the Life, its Plan, the outcome and the run's record), and with `--follow` goes on
/// printing runs recorded after it started; it refuses a Redis with no keyspace and
/// creates none there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_runs_prints_recorded_runs_as_json_lines_and_follows_new_ones() {
    use std::io::{BufRead, BufReader};
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--runs-stream-max-len", "1000")]),
    );
    let api = Api::new(&host);
    let ids = ["export-a", "export-b", "export-c"];
    let at = now_ms() + 1_000;
    for id in ids {
        book(&api, &point(id, at, hook(id))).await;
    }
    for id in ids {
        api.wait_life(id, Duration::from_secs(10), |l| state(l) == "Dead")
            .await;
    }

    let (code, out, err) = kairos_command(&["export-runs", "--redis-url", &redis.url()]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 3, "{out}");
    let mut lives: Vec<&str> = lines.iter().map(|l| l["life"].as_str().unwrap()).collect();
    lives.sort();
    assert_eq!(lives, ids);
    for l in &lines {
        assert_eq!(l["plan"], "birth", "{l}");
        assert_eq!(l["outcome"], "success", "{l}");
        assert_eq!(l["record"]["status"], 200, "{l}");
        assert!(l["record"]["started_at"].as_i64().unwrap() >= at, "{l}");
        assert!(l["id"].as_str().unwrap().contains('-'), "{l}");
    }

    // --follow: what is there, then a run recorded later.
    let mut child = std::process::Command::new(kairos_bin())
        .args(["export-runs", "--follow", "--redis-url", &redis.url()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = |within: Duration| -> Value {
        let line = rx
            .recv_timeout(within)
            .expect("export-runs --follow printed nothing in time");
        serde_json::from_str(&line).unwrap()
    };
    for _ in 0..3 {
        next(Duration::from_secs(10));
    }
    book(
        &api,
        &point("export-later", now_ms() + 1_000, hook("later")),
    )
    .await;
    let later = next(Duration::from_secs(15));
    assert_eq!(later["life"], "export-later", "{later}");
    assert_eq!(later["outcome"], "success", "{later}");
    let _ = child.kill();
    let _ = child.wait();

    // No keyspace: refused, and nothing written there.
    let empty = RedisServer::start();
    let (code, _, err) = kairos_command(&["export-runs", "--redis-url", &empty.url()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no kairos keyspace here"), "{err}");
    let keys = empty.cli(&["dbsize"]);
    assert_eq!(keys.trim().trim_start_matches("(integer) "), "0", "{keys}");
}

/// `kairos slowlog` prints Redis's slow log with kairos's script calls named by script
/// (not by SHA-1) and the logged time added up by what ran; it reads only: the entries
/// are still there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowlog_names_the_scripts_redis_logged() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let mut conn = redis.conn().await;
    // Every call logged, and enough of them kept: claims come every few ms.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .arg("slowlog-max-len")
        .arg(100_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    book(&api, &point("slow-a", now_ms() + 1_000, hook("slow-a"))).await;
    api.wait_life("slow-a", Duration::from_secs(10), |l| state(l) == "Dead")
        .await;

    let (code, out, err) =
        kairos_command(&["slowlog", "--redis-url", &redis.url(), "--count", "100000"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("slowlog-log-slower-than 0 µs"), "{out}");
    let by = out
        .split("# by what ran")
        .nth(1)
        .unwrap_or_else(|| panic!("no totals: {out}"));
    for script in ["book", "claim", "start_run", "finish_life"] {
        assert!(
            by.lines()
                .any(|l| l.split_whitespace().nth(3) == Some(script)),
            "{script} not in the totals: {out}"
        );
    }
    assert!(!out.contains("not a script of this build"), "{out}");
    let left: i64 = redis::cmd("SLOWLOG")
        .arg("LEN")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(left > 0, "the log was left as it was");
}
