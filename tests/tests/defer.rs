//! `/defer/{path}`: a request booked for later replays method, headers (minus hop-by-hop
//! and credentials) and body to the gateway at its time (SPEC section 2).

use std::time::Duration;

use axum::http::Method;
use kairos_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_requests_replay_method_headers_and_body() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--max-body-bytes", "2048")]));
    let api = Api::new(&host);

    let at = now_ms() + 1_500;
    let body = br#"{"order": 42, "note": "caf\u00e9"}"#.to_vec();
    let (status, reply) = api
        .raw(
            Method::POST,
            "/defer/api/v1/orders?dry_run=1&x=%20y",
            body.clone(),
            &[
                ("x-kairos-schedule-datetime", &rfc3339_ms(at)),
                ("x-custom", "kept"),
                ("authorization", "Bearer for-kairos-only"),
                ("connection", "keep-alive"),
            ],
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let posted = reply["life_uuid"].as_str().unwrap().to_string();
    assert_eq!(reply["birth_time_ms"], at);

    // The alternate header name, another method, no body.
    let (status, reply) = api
        .raw(
            Method::DELETE,
            "/defer/api/v1/orders/7",
            Vec::new(),
            &[("x-xaas-schedule-datetime", &rfc3339_ms(at + 200))],
        )
        .await;
    assert_eq!(status, 202, "{reply}");
    let deleted = reply["life_uuid"].as_str().unwrap().to_string();

    let got = sink.wait_count(2, Duration::from_secs(10)).await;
    let post = got
        .iter()
        .find(|r| r.header("x-kairos-life") == Some(&posted))
        .expect("the POST replayed");
    assert_eq!(post.method, "POST");
    assert_eq!(post.path, "/api/v1/orders");
    assert_eq!(post.query.as_deref(), Some("dry_run=1&x=%20y"));
    assert_eq!(
        post.body.as_ref(),
        body.as_slice(),
        "the body is replayed byte for byte"
    );
    assert_eq!(post.header("content-type"), Some("application/json"));
    assert_eq!(post.header("x-custom"), Some("kept"));
    assert_eq!(
        post.header("authorization"),
        None,
        "credentials for kairos are not forwarded"
    );
    assert_eq!(post.header("x-kairos-schedule-datetime"), None);
    assert_eq!(
        post.header("idempotency-key"),
        Some(format!("{posted}:birth").as_str())
    );
    assert!(post.at_ms >= at, "replayed {} ms early", at - post.at_ms);
    let del = got
        .iter()
        .find(|r| r.header("x-kairos-life") == Some(&deleted))
        .expect("the DELETE replayed");
    assert_eq!(
        (del.method.as_str(), del.path.as_str(), del.body.len()),
        ("DELETE", "/api/v1/orders/7", 0)
    );

    let life = api
        .wait_life(&posted, Duration::from_secs(5), |l| l["state"] == "Dead")
        .await;
    assert_eq!(life["schedule_type"], "point");
    assert_eq!(sink.received_for(&posted).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_requests_are_validated_like_bookings() {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let host = Host::start(&redis.url(), &flags(&sink, &[("--max-body-bytes", "2048")]));
    let api = Api::new(&host);
    let code = |r: &(u16, serde_json::Value)| {
        (r.0, r.1["error"]["code"].as_str().unwrap_or("").to_string())
    };

    let r = api.raw(Method::POST, "/defer/x", b"{}".to_vec(), &[]).await;
    assert_eq!(code(&r), (400, "missing_field".into()));
    let r = api
        .raw(
            Method::POST,
            "/defer/x",
            b"{}".to_vec(),
            &[("x-kairos-schedule-datetime", "soonish")],
        )
        .await;
    assert_eq!(code(&r), (400, "invalid_time".into()));
    let r = api
        .raw(
            Method::POST,
            "/defer/x",
            b"{}".to_vec(),
            &[("x-kairos-schedule-datetime", &rfc3339_ms(now_ms() + 100))],
        )
        .await;
    assert_eq!(code(&r), (406, "too_soon".into()));
    let r = api
        .raw(
            Method::POST,
            "/defer/x",
            vec![b'a'; 4096],
            &[("x-kairos-schedule-datetime", &rfc3339_ms(now_ms() + 60_000))],
        )
        .await;
    assert_eq!(code(&r), (413, "body_too_large".into()));
    let r = api
        .raw(
            Method::POST,
            "/defer/x",
            vec![0xff, 0xfe],
            &[("x-kairos-schedule-datetime", &rfc3339_ms(now_ms() + 60_000))],
        )
        .await;
    assert_eq!(code(&r), (400, "invalid_body".into()));
    // Nothing was booked by the refusals.
    let (_, page) = api.get("/schedules").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 0);

    // Without a gateway there is nowhere to replay to.
    let bare = Host::start(
        &redis.url(),
        &flags_with(fast_flags(), &[("--key-prefix", "nogw")]),
    );
    let r = Api::new(&bare)
        .raw(
            Method::POST,
            "/defer/x",
            Vec::new(),
            &[("x-kairos-schedule-datetime", &rfc3339_ms(now_ms() + 60_000))],
        )
        .await;
    assert_eq!(code(&r), (400, "no_gateway".into()));
}
