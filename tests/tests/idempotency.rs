//! `Idempotency-Key` on booking calls (SPEC section 11): the same key with the same
//! request gets the first answer again and writes nothing; with another request, 422.
//! Checked on `POST /schedules`, `/defer`, `POST /queues/{q}/tasks` and `POST /timers`,
//! against a real redis-server, including the window a crash leaves open: an answer that
//! was never recorded.

use std::time::Duration;

use hyper::Method;
use kairos_e2e::*;
use serde_json::{json, Value};

/// Posts `body` to `path` with an `Idempotency-Key` of `key`: status, whether the answer
/// says it is a replay, body.
async fn post_keyed(api: &Api, path: &str, key: &str, body: &Value) -> (u16, bool, Value) {
    let (status, headers, reply) = api
        .call(
            Method::POST,
            path,
            serde_json::to_vec(body).unwrap(),
            &[("idempotency-key", key)],
        )
        .await;
    let replayed = headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (status, replayed, reply)
}

/// Lives on `resource` (GET /schedules?resource_id=).
async fn lives_on(api: &Api, resource: &str) -> Vec<Value> {
    let (status, list) = api.get(&format!("/schedules?resource_id={resource}")).await;
    assert_eq!(status, 200, "{list}");
    list["items"].as_array().unwrap().clone()
}

/// The record of `key` (`kairos:{s…}:idem:{key}`), found without knowing its shard.
fn record_key(redis: &RedisServer, key: &str) -> String {
    let found = redis.cli(&["--scan", "--pattern", &format!("kairos:*:idem:{key}")]);
    let keys: Vec<&str> = found.lines().map(|k| k.trim_matches('"')).collect();
    assert_eq!(keys.len(), 1, "one record for {key}: {found}");
    keys[0].to_string()
}

/// The `tag` of a call to `hook(tag)`.
fn tag(r: &Received) -> String {
    serde_json::from_slice::<Value>(&r.body).unwrap_or_default()["tag"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn hook_at(tag: &str, at_ms: i64) -> Value {
    json!({"resource_id": tag, "birth_time": rfc3339_ms(at_ms), "birth": hook(tag)})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_call_books_once_and_gets_the_first_answer() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let later = now_ms() + 3_600_000;

    // POST /schedules without a life_uuid: the second call books nothing and answers
    // the first call's body, marked as a replay.
    let body = hook_at("res-a", later);
    let (s1, r1, first) = post_keyed(&api, "/schedules", "key-a", &body).await;
    assert_eq!((s1, r1), (200, false), "{first}");
    let (s2, r2, second) = post_keyed(&api, "/schedules", "key-a", &body).await;
    assert_eq!((s2, r2), (200, true), "{second}");
    assert_eq!(first, second);
    let lives = lives_on(&api, "res-a").await;
    assert_eq!(lives.len(), 1, "{lives:?}");
    assert_eq!(lives[0]["life_uuid"], first["life_uuid"]);

    // The same key for another request is refused and books nothing; so is the same key
    // on another route.
    let other = hook_at("res-a", later + 60_000);
    let (status, _, reply) = post_keyed(&api, "/schedules", "key-a", &other).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{reply}"
    );
    let (status, _, reply) = post_keyed(&api, "/queues/default/tasks", "key-a", &body).await;
    assert_eq!(status, 422, "{reply}");
    assert_eq!(lives_on(&api, "res-a").await.len(), 1);

    // The answer is kept for idempotency_ttl (24 h by default).
    let pttl: i64 = redis
        .cli(&["PTTL", &record_key(&redis, "key-a")])
        .trim()
        .trim_start_matches("(integer) ")
        .parse()
        .unwrap();
    assert!(
        (23 * 3_600_000..=24 * 3_600_000).contains(&pttl),
        "PTTL {pttl}"
    );

    // A refusal is an answer too: replayed, not re-judged.
    let too_soon = hook_at("res-b", now_ms() + 100);
    let (status, replayed, _) = post_keyed(&api, "/schedules", "key-b", &too_soon).await;
    assert_eq!((status, replayed), (406, false));
    let (status, replayed, reply) = post_keyed(&api, "/schedules", "key-b", &too_soon).await;
    assert_eq!((status, replayed), (406, true), "{reply}");
    assert_eq!(reply["error"]["code"], "too_soon");

    // A key that is not a key is refused, and nothing is booked.
    let (status, _, reply) = post_keyed(&api, "/schedules", "a b", &hook_at("res-c", later)).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (400, Some("invalid_idempotency_key")),
        "{reply}"
    );
    assert!(lives_on(&api, "res-c").await.is_empty());

    // /defer: one Life for two calls, both 202.
    let defer = |key: &'static str| {
        let api = api.clone();
        async move {
            api.call(
                Method::POST,
                "/defer/replayed",
                br#"{"n": 1}"#.to_vec(),
                &[
                    ("idempotency-key", key),
                    ("x-kairos-schedule-datetime", &rfc3339_ms(later)),
                ],
            )
            .await
        }
    };
    let (s1, _, d1) = defer("key-d").await;
    let (s2, h2, d2) = defer("key-d").await;
    assert_eq!((s1, s2), (202, 202), "{d1} {d2}");
    assert_eq!(d1, d2);
    assert_eq!(h2.get("idempotent-replayed").unwrap(), "true");
    let (status, _) = api
        .get(&format!("/schedules/{}", d1["life_uuid"].as_str().unwrap()))
        .await;
    assert_eq!(status, 200);

    // Queue tasks without names: the repeat adds none.
    let tasks = json!([{"countdown": 3600, "action": hook("t1")}, {"countdown": 3600, "action": hook("t2")}]);
    let (s1, _, t1) = post_keyed(&api, "/queues/default/tasks", "key-t", &tasks).await;
    let (s2, r2, t2) = post_keyed(&api, "/queues/default/tasks", "key-t", &tasks).await;
    assert_eq!((s1, s2, r2), (200, 200, true), "{t1} {t2}");
    assert_eq!(t1, t2);
    let (_, listed) = api.get("/queues/default/tasks").await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 2, "{listed}");

    // Timers: the repeat is answered as the first call was; another key for the same
    // request is another call, refused as a duplicate name.
    let timer = json!({"name": "nightly", "schedule": "0 3 * * *", "action": hook("timer")});
    let (s1, _, v1) = post_keyed(&api, "/timers", "key-n", &timer).await;
    let (s2, r2, v2) = post_keyed(&api, "/timers", "key-n", &timer).await;
    assert_eq!((s1, s2, r2), (200, 200, true), "{v1} {v2}");
    assert_eq!(v1, v2);
    let (status, _, reply) = post_keyed(&api, "/timers", "key-m", &timer).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("duplicate_timer")),
        "{reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_of_a_call_whose_answer_was_lost_meets_what_it_booked() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let later = now_ms() + 3_600_000;

    // A host that died after booking but before recording its answer leaves the record
    // pending: staged here by turning a recorded answer back into that.
    let lose_answer = |key: &str, at_ms: &str| {
        let record = record_key(&redis, key);
        redis.cli(&["HDEL", &record, "status", "body"]);
        redis.cli(&["HSET", &record, "state", "pending", "at_ms", at_ms]);
    };

    let body = hook_at("res-l", later);
    let (status, _, first) = post_keyed(&api, "/schedules", "key-l", &body).await;
    assert_eq!(status, 200, "{first}");

    // While the first call may still be under way, a repeat is told to wait.
    let redis_now: Vec<String> = redis
        .cli(&["TIME"])
        .lines()
        .map(|l| l.split('"').nth(1).unwrap_or("").to_string())
        .collect();
    let now_ms_redis = redis_now[0].parse::<i64>().unwrap() * 1000;
    lose_answer("key-l", &now_ms_redis.to_string());
    let (status, _, reply) = post_keyed(&api, "/schedules", "key-l", &body).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("idempotency_key_in_progress")),
        "{reply}"
    );

    // Once that call is long gone, the repeat books again: its id comes from the key,
    // so it meets the first call's Life and answers as the first call did.
    lose_answer("key-l", "0");
    let (status, replayed, again) = post_keyed(&api, "/schedules", "key-l", &body).await;
    assert_eq!((status, replayed), (200, false), "{again}");
    assert_eq!(again, first);
    assert_eq!(lives_on(&api, "res-l").await.len(), 1);
    // And its answer is recorded now.
    let (status, replayed, _) = post_keyed(&api, "/schedules", "key-l", &body).await;
    assert_eq!((status, replayed), (200, true));

    // A Life that only shares the id is not the call's own: a call that finds another
    // Life under the id it books answers 409, key or not.
    let given = json!({"life_uuid": "given-1", "resource_id": "res-g", "birth_time": rfc3339_ms(later), "birth": hook("g")});
    let (status, _, _) = post_keyed(&api, "/schedules", "key-g", &given).await;
    assert_eq!(status, 200);
    redis.cli(&["DEL", &record_key(&redis, "key-g")]);
    let mut moved = given.clone();
    moved["birth_time"] = json!(rfc3339_ms(later + 60_000));
    let (status, _, reply) = post_keyed(&api, "/schedules", "key-g", &moved).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("duplicate_life_uuid")),
        "{reply}"
    );

    // The same for a timer: the timer the first try made is the repeat's own.
    let timer = json!({"name": "hourly", "schedule": "@hourly", "action": hook("timer")});
    let (status, _, made) = post_keyed(&api, "/timers", "key-h", &timer).await;
    assert_eq!(status, 200, "{made}");
    lose_answer("key-h", "0");
    let (status, replayed, again) = post_keyed(&api, "/timers", "key-h", &timer).await;
    assert_eq!((status, replayed), (200, false), "{again}");
    assert_eq!(again["name"], "hourly");

    // Nothing booked twice fires twice: the Life booked through two calls fires once.
    let soon = json!({"resource_id": "res-f", "birth_time": rfc3339_ms(now_ms() + 1_500), "birth": hook("once")});
    let (status, _, _) = post_keyed(&api, "/schedules", "key-f", &soon).await;
    assert_eq!(status, 200);
    lose_answer("key-f", "0");
    let (status, _, _) = post_keyed(&api, "/schedules", "key-f", &soon).await;
    assert_eq!(status, 200);
    sink.wait_until("the booked birth", Duration::from_secs(8), |got| {
        got.iter().any(|r| tag(r) == "once")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let calls = sink.received().iter().filter(|r| tag(r) == "once").count();
    assert_eq!(calls, 1);
}

/// Every command Redis ran, with its arguments, since the slow log was set to log every
/// command (`slowlog-log-slower-than 0`); commands run by scripts are there too.
fn commands_run(redis: &RedisServer) -> String {
    redis.cli(&["SLOWLOG", "GET", "100000"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_keyed_booking_is_booked_and_recorded_in_one_script() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let keys = Keyspace::new(32);
    redis.cli(&["CONFIG", "SET", "slowlog-max-len", "100000"]);
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    let body = json!({"birth_time": rfc3339_ms(now_ms() + 3_600_000), "birth": hook("p")});

    let (status, replayed, first) = post_keyed(&api, "/schedules", "key-p", &body).await;
    assert_eq!((status, replayed), (200, false), "{first}");
    // One script wrote the Life and the key's record, done at once: the two-step way
    // would have marked it `pending` first. The id derived from the key has the record's
    // shard as its home.
    let log = commands_run(&redis);
    assert!(log.contains("idem:key-p"), "{log}");
    assert!(!log.contains("pending"), "{log}");
    let uuid = first["life_uuid"].as_str().unwrap().to_string();
    let record = record_key(&redis, "key-p");
    assert!(
        record.starts_with(&keys.life(&uuid).prefix),
        "{record} vs {uuid}"
    );
    assert_eq!(redis.cli(&["HGET", &record, "state"]).trim(), "\"done\"");

    // Repeats get the first answer and book nothing more; another body is refused.
    let (status, replayed, again) = post_keyed(&api, "/schedules", "key-p", &body).await;
    assert_eq!((status, replayed), (200, true), "{again}");
    assert_eq!(again, first);
    let other = json!({"birth_time": rfc3339_ms(now_ms() + 7_200_000), "birth": hook("p")});
    let (status, _, reply) = post_keyed(&api, "/schedules", "key-p", &other).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    let (status, list) = api.get("/schedules?limit=10").await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");

    // A record left pending by a call under way answers 409; one left long ago by a call
    // that died is retaken, and the retake meets the Life that call booked.
    redis.cli(&["HDEL", &record, "status", "body"]);
    redis.cli(&[
        "HSET",
        &record,
        "state",
        "pending",
        "at_ms",
        "99999999999999",
    ]);
    let (status, _, reply) = post_keyed(&api, "/schedules", "key-p", &body).await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (409, Some("idempotency_key_in_progress"))
    );
    redis.cli(&["HSET", &record, "at_ms", "0"]);
    let (status, replayed, retaken) = post_keyed(&api, "/schedules", "key-p", &body).await;
    assert_eq!((status, replayed), (200, false), "{retaken}");
    assert_eq!(retaken, first);
    let (_, list) = api.get("/schedules?limit=10").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");

    // A refusal in the one step records nothing there; the general way records it, and a
    // repeat gets the refusal again: here the key's derived id is taken by a Life booked
    // without a key.
    let taken = derived_plain_id(&keys, "key-q");
    let mine = json!({"life_uuid": taken, "birth_time": rfc3339_ms(now_ms() + 3_600_000), "birth": hook("q")});
    let (status, _) = api.post("/schedules", &mine).await;
    assert_eq!(status, 200);
    let (status, replayed, refused) = post_keyed(&api, "/schedules", "key-q", &body).await;
    assert_eq!((status, replayed), (409, false), "{refused}");
    assert_eq!(refused["error"]["code"], "duplicate_life_uuid");
    let (status, replayed, _) = post_keyed(&api, "/schedules", "key-q", &body).await;
    assert_eq!((status, replayed), (409, true));
}

/// The Life id a plain booking made under `key` derives (`derived_life_id`).
fn derived_plain_id(keys: &Keyspace, key: &str) -> String {
    kairos::bookings::idempotency::derived_life_id(key, keys.placement, None)
}
