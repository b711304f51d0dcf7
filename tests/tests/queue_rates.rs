//! Queue rates against the token bucket they promise (SPEC section 6): 30 tasks added at
//! once to queues of 2, 5, 20 and 50 tasks/s, with buckets of 1 and 10, with and
//! without `max_concurrent`, start as a first burst the size of the bucket and then at
//! the rate within ±10 %, on one host and on two. A queue with a bucket of 1 (the usual
//! way to say "steadily, N per second") once ran at a fraction of its rate: tasks short
//! of a token were picked up again only by the next look-ahead pass.
//!
//! The starts are timed where the limiter works, at the host (each run's `started_at`,
//! read back from the shards' `runs` streams), not at the sink, whose own handling of
//! four calls that arrive together would blur a 10 ms period.

use std::collections::HashMap;
use std::time::Duration;

use kairos_e2e::*;
use serde_json::{json, Value};

const TASKS: usize = 30;

struct Case {
    rate: f64,
    bucket: usize,
    max_concurrent: u32,
}

impl Case {
    fn name(&self) -> String {
        format!("r{}b{}c{}", self.rate, self.bucket, self.max_concurrent)
    }
}

fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    // 50/s at most: a debug build on a slow 2-core VM started one 100/s queue's tasks at
    // 74-78/s (the host's pace, not the limiter's), and its start stamps jitter by a few
    // ms, near half of a 10 ms period.
    for rate in [2.0, 5.0, 20.0, 50.0] {
        for bucket in [1, 10] {
            // A max_concurrent that still leaves room for the rate: at 50/s, two slots
            // would bind as soon as a call takes 40 ms.
            for max_concurrent in [0, if rate < 50.0 { 2 } else { 5 }] {
                all.push(Case {
                    rate,
                    bucket,
                    max_concurrent,
                });
            }
        }
    }
    all
}

/// Every case's queue gets 30 tasks at once (through each host's API in turn), one rate
/// at a time, and the starts seen by the sink are checked against its rate and bucket.
async fn rates_hold(hosts: usize) {
    let redis = RedisServer::start();
    let sink = Sink::start().await;
    let hosts: Vec<Host> = (0..hosts)
        .map(|_| {
            Host::start(
                &redis.url(),
                &flags(&sink, &[("--runs-stream-max-len", "100000")]),
            )
        })
        .collect();
    let apis: Vec<Api> = hosts.iter().map(Api::new).collect();
    let cases = cases();
    for case in &cases {
        let (status, reply) = apis[0]
            .put(
                &format!("/queues/{}", case.name()),
                &json!({"rate": case.rate, "bucket_size": case.bucket,
                        "max_concurrent": case.max_concurrent}),
            )
            .await;
        assert_eq!(status, 200, "{reply}");
    }
    // Let every host take its shards before the clock starts.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut report = Vec::new();
    let mut wrong = Vec::new();
    // The slow rates side by side; 50/s one queue at a time (four at once are 200
    // starts a second, more than a debug build on a loaded 2-core machine keeps on time).
    let groups: Vec<Vec<&Case>> = [2.0, 5.0, 20.0]
        .iter()
        .map(|&rate| cases.iter().filter(|c| c.rate == rate).collect())
        .chain(cases.iter().filter(|c| c.rate == 50.0).map(|c| vec![c]))
        .collect();
    for group in groups {
        let before = sink.received().len();
        for (i, case) in group.iter().enumerate() {
            // The tasks of one queue in one call: they become due together.
            let tasks: Vec<Value> = (0..TASKS)
                .map(|n| json!({"name": format!("t{n}"), "action": hook(&case.name())}))
                .collect();
            let (status, reply) = apis[i % apis.len()]
                .post(
                    &format!("/queues/{}/tasks", case.name()),
                    &Value::Array(tasks),
                )
                .await;
            assert_eq!(status, 200, "{reply}");
        }
        // 29 tokens after the first, and room for a slow machine.
        let within = Duration::from_secs_f64(2.0 * TASKS as f64 / group[0].rate + 10.0);
        sink.wait_until("every task", within, |got| {
            got.len() >= before + group.len() * TASKS
        })
        .await;
        let mut starts = task_starts(&redis).await;
        for case in group {
            let mut at = starts.remove(&case.name()).unwrap_or_default();
            at.sort();
            assert_eq!(at.len(), TASKS, "{}: every task once", case.name());
            let period_ms = 1000.0 / case.rate;
            // The first burst: the tasks started within half a period of the first.
            let burst = at
                .iter()
                .filter(|&&t| ((t - at[0]) as f64) < period_ms / 2.0)
                .count();
            // The steady rate: the tasks after the first burst came one a period, so the
            // last started (n - bucket) periods after the first. (Measured over the whole
            // run: a bucket that refilled while a slow start waited may start a few at
            // once, as a token bucket allows.)
            let span_s = (at[TASKS - 1] - at[0]) as f64 / 1000.0;
            let measured = (TASKS - case.bucket) as f64 / span_s;
            report.push(format!(
                "{}: burst {burst}, steady {measured:.1}/s",
                case.name()
            ));
            // Under max_concurrent the first burst is the free slots, not the bucket.
            let burst_ok = if case.max_concurrent == 0 {
                burst == case.bucket
            } else {
                burst <= case.bucket
            };
            if !burst_ok || (measured - case.rate).abs() > case.rate * 0.10 {
                wrong.push(format!(
                    "{}: burst {burst}, steady {measured:.2}/s (want {} ±10 %), starts {:?}",
                    case.name(),
                    case.rate,
                    at.iter().map(|t| t - at[0]).collect::<Vec<_>>()
                ));
            }
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// When each task's run started, by queue, from every shard's `runs` stream.
async fn task_starts(redis: &RedisServer) -> HashMap<String, Vec<i64>> {
    let mut conn = redis.conn().await;
    let streams: Vec<String> = redis::cmd("KEYS")
        .arg("kairos:*:runs")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut starts: HashMap<String, Vec<i64>> = HashMap::new();
    for stream in streams {
        let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        for (_, fields) in entries {
            let Some(queue) = fields.get("queue") else {
                continue;
            };
            let record: Value = serde_json::from_str(&fields["record"]).unwrap();
            starts
                .entry(queue.clone())
                .or_default()
                .push(record["started_at"].as_i64().unwrap());
        }
    }
    starts
}

/// One host, then two: one test, so that the two never run at once (each is timing
/// 100 starts a second on a 2-core machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_run_at_their_rate_after_a_burst_of_their_bucket_on_one_host_and_on_two() {
    rates_hold(1).await;
    rates_hold(2).await;
}
