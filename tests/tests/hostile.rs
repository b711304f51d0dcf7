//! Hostile or careless input, from the outside (a black-box probe's findings, each a
//! regression test): scopes that follow what a route does, headers a client must not be
//! able to forge toward targets, numbers and URLs refused at booking with the spec's
//! error body and nothing stored, framework refusals in the same body, and clients that
//! never finish their requests.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use axum::http::Method;
use kairos_e2e::*;
use serde_json::{json, Value};

fn code(reply: &Reply) -> (u16, &str) {
    (
        reply.0,
        reply.1["error"]["code"]
            .as_str()
            .unwrap_or("<no error body>"),
    )
}

async fn keys(redis: &RedisServer) -> Vec<String> {
    redis.booked_keys().await
}

/// Every `/defer` route books, whatever its method: a read token may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_cannot_book_through_defer() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(
        &redis.url(),
        &flags(&sink, &[("--api-tokens", "r3ad:read,b00k:book")]),
    );
    let reader = Api::new(&host).with_token("r3ad");
    let when = rfc3339_ms(now_ms() + 60_000);
    for method in [Method::GET, Method::HEAD, Method::POST] {
        let reply = reader
            .raw(
                method.clone(),
                "/defer/x",
                Vec::new(),
                &[("x-kairos-schedule-datetime", &when)],
            )
            .await;
        assert_eq!(
            reply.0, 403,
            "{method} /defer/x with a read token: {reply:?}"
        );
    }
    assert!(keys(&redis).await.is_empty(), "nothing was booked");
    let booker = Api::new(&host).with_token("b00k");
    let reply = booker
        .raw(
            Method::GET,
            "/defer/x",
            Vec::new(),
            &[("x-kairos-schedule-datetime", &when)],
        )
        .await;
    assert_eq!(reply.0, 202, "{reply:?}");
}

/// Targets trust `X-Kairos-*` and `Idempotency-Key` to come from the host: a copy in a
/// deferred request or in an action's headers is dropped, never forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_forge_the_hosts_headers() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let at = now_ms() + 1_500;
    let (status, reply) = api
        .raw(
            Method::POST,
            "/defer/forged",
            b"{}".to_vec(),
            &[
                ("x-kairos-schedule-datetime", &rfc3339_ms(at)),
                ("x-kairos-queue", "payments"),
                ("x-kairos-task", "refund-all"),
                ("x-kairos-signature", "t=1,v1=forged"),
                ("idempotency-key", "forged-key"),
                ("x-custom", "kept"),
            ],
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let deferred = reply["life_uuid"].as_str().unwrap().to_string();
    let mut body = point("forged-action", at, hook("forged"));
    body["birth"]["headers"] = json!({
        "X-Kairos-Queue": "payments",
        "X-Kairos-Task": "refund-all",
        "Idempotency-Key": "forged",
        "x-custom": "kept",
    });
    book(&api, &body).await;
    let got = sink.wait_count(2, Duration::from_secs(10)).await;
    for (life, r) in [
        (
            deferred.as_str(),
            got.iter()
                .find(|r| r.header("x-kairos-life") == Some(&deferred)),
        ),
        (
            "forged-action",
            got.iter()
                .find(|r| r.header("x-kairos-life") == Some("forged-action")),
        ),
    ] {
        let r = r.expect("called");
        assert_eq!(r.header("x-kairos-queue"), None, "{life}: {:?}", r.headers);
        assert_eq!(r.header("x-kairos-task"), None, "{life}");
        assert_eq!(r.header("x-kairos-signature"), None, "{life}");
        assert_eq!(
            r.header("idempotency-key"),
            Some(format!("{life}:birth").as_str()),
            "{life}: the host's own key"
        );
        assert_eq!(r.header("x-custom"), Some("kept"), "{life}");
    }
    // Not even stored.
    let (_, view) = api.get("/schedules/forged-action").await;
    assert!(!view.to_string().contains("refund-all"), "{view:#}");
}

/// Numbers and URLs that used to overflow, wrap or fail only when fired are refused at
/// booking with the spec's error body, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_numbers_and_urls_are_refused_at_booking() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    let later = rfc3339_ms(now_ms() + 3_600_000);
    let with_birth = |birth: Value| json!({"birth_time": later, "birth": birth});
    for (what, body, want) in [
        (
            "port 65536",
            with_birth(json!({"url": "http://example.com:65536/x", "method": "POST"})),
            "invalid_action",
        ),
        (
            "port 99999",
            with_birth(json!({"url": "http://example.com:99999/x", "method": "POST"})),
            "invalid_action",
        ),
        (
            "a path with a space",
            with_birth(json!({"path": "/a path", "method": "POST"})),
            "invalid_action",
        ),
        (
            "a literal address the policy refuses",
            with_birth(json!({"url": "http://127.0.0.1:1/x", "method": "POST"})),
            "blocked_target",
        ),
        (
            "an internal address in IPv6 clothing",
            with_birth(json!({"url": "http://[64:ff9b::7f00:1]/x", "method": "POST"})),
            "blocked_target",
        ),
        (
            "a typo'd top-level field",
            json!({"birth_time": later, "resource_idd": "conn-1", "birth": hook("x")}),
            "unknown_field",
        ),
        (
            "a typo'd field of the term",
            json!({"schedule_type": "term", "term": {"birth_time": later, "deth_time": later}, "birth": hook("x"), "death": hook("y")}),
            "unknown_field",
        ),
    ] {
        let reply = api.post("/schedules", &body).await;
        assert_eq!(code(&reply).1, want, "{what}: {:?}", reply);
        assert_eq!(reply.0, 400, "{what}");
        assert!(
            reply.1["error"]["message"].as_str().unwrap_or("").len() > 10,
            "{what}: a message a person can act on"
        );
    }
    let reply = api
        .post(
            "/schedules",
            &json!({"birth_time": later, "resource_idd": "x", "birth": hook("x")}),
        )
        .await;
    assert!(
        reply.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resource_idd"),
        "the message names the field: {:?}",
        reply
    );

    // Queues: backoffs and countdowns that overflowed into "now".
    for (what, path, body) in [
        (
            "a huge max_backoff",
            "/queues/q1",
            json!({"retry": {"max_backoff": 1e16}}),
        ),
        (
            "a huge min_backoff",
            "/queues/q2",
            json!({"retry": {"min_backoff": 1e16, "max_backoff": 1e16}}),
        ),
        (
            "a huge age_limit",
            "/queues/q3",
            json!({"retry": {"age_limit": 1e16}}),
        ),
        (
            "a typo'd queue field",
            "/queues/q4",
            json!({"max_concurent": 2}),
        ),
    ] {
        let reply = api.put(path, &body).await;
        assert_eq!(reply.0, 400, "{what}: {:?}", reply);
    }
    for countdown in [json!(1e16), json!(9.3e15), json!("300000000000s")] {
        let reply = api
            .post(
                "/queues/default/tasks",
                &json!({"countdown": countdown, "action": hook("t")}),
            )
            .await;
        assert_eq!(
            code(&reply),
            (400, "invalid_duration"),
            "{countdown}: {:?}",
            reply
        );
    }
    let reply = api
        .post(
            "/queues/default/tasks",
            &json!({"countdwn": 5, "action": hook("t")}),
        )
        .await;
    assert_eq!(code(&reply), (400, "unknown_field"), "{:?}", reply);
    let reply = api
        .post(
            "/timers",
            &json!({"name": "t", "schedule": "@daily", "action": hook("t"), "actve": true}),
        )
        .await;
    assert_eq!(code(&reply), (400, "unknown_field"), "{:?}", reply);
    assert!(
        keys(&redis).await.is_empty(),
        "refusals store nothing: {:?}",
        keys(&redis).await
    );
}

/// The framework's own refusals (a method a route does not take, a path that does not
/// decode) carry the spec's error body too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_has_the_error_body() {
    let redis = RedisServer::start();
    let host = Host::start(&redis.url(), &fast_flags());
    let api = Api::new(&host);
    let reply = api.raw(Method::PUT, "/schedules", Vec::new(), &[]).await;
    assert_eq!(code(&reply), (405, "method_not_allowed"), "{reply:?}");
    let reply = api
        .raw(Method::GET, "/schedules/%FF%FE", Vec::new(), &[])
        .await;
    assert_eq!(reply.0, 400, "{reply:?}");
    assert!(reply.1["error"]["code"].is_string(), "{reply:?}");
}

/// Clients that never finish their headers, or promise a huge body and send a byte, are
/// cut off, and meanwhile a normal booking is answered promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_do_not_hold_the_host() {
    raise_open_files_limit();
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[]));
    let api = Api::new(&host);
    // 413 from Content-Length alone, before any of the body arrives.
    let mut promise = TcpStream::connect(host.addr).unwrap();
    promise
        .write_all(
            b"POST /schedules HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 10000000000\r\n\r\n{",
        )
        .unwrap();
    promise
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = [0u8; 64];
    let n = std::io::Read::read(&mut promise, &mut answer).unwrap_or(0);
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 413"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );

    // A first booking opens the client's keep-alive connection.
    let (status, _) = api
        .post(
            "/schedules",
            &point("warm", now_ms() + 3_600_000, hook("p")),
        )
        .await;
    assert_eq!(status, 200);
    // 2,000 sockets: half never finish their headers, half promise a body they never send.
    let mut idle = Vec::new();
    for i in 0..2000 {
        let mut s = TcpStream::connect(host.addr).expect("connect");
        if i % 2 == 0 {
            s.write_all(b"POST /schedules HTTP/1.1\r\nhost: x\r\n")
                .unwrap();
        } else {
            s.write_all(
                b"POST /schedules HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{",
            )
            .unwrap();
        }
        idle.push(s);
    }
    let mut took = Vec::new();
    for i in 0..7 {
        let asked = Instant::now();
        let (status, reply) = api
            .post(
                "/schedules",
                &point(&format!("prompt-{i}"), now_ms() + 3_600_000, hook("p")),
            )
            .await;
        took.push(asked.elapsed());
        assert_eq!(status, 200, "{reply}");
    }
    took.sort();
    // The median: one booking may meet a scheduling hiccup on this 2-core machine.
    assert!(
        took[took.len() / 2] < Duration::from_millis(100),
        "bookings took {took:?} with 2,000 slow clients connected"
    );
    assert!(took[took.len() - 1] < Duration::from_secs(1), "{took:?}");
    drop(idle);
}

/// The test process itself holds 2,000 sockets.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
}
