//! kairos benchmarks, run in one go on this machine next to the storage ceiling
//! (redis-benchmark against the same redis-server). Prints a markdown report.
//!
//! `scripts/bench` builds a release kairos and runs this in release mode. Sections:
//! `booking` (throughput over keep-alive with 64 clients, Redis memory per booking),
//! `durability` (the same with `appendfsync always`, what `--durability always` costs) and
//! `firing` (lateness at 1,000 fires/s, highest sustained rate with p99 < 50 ms, 100,000
//! Plans due within one second) and `queue` (tasks added in lists of 100, then delivered
//! by a queue with no rate or concurrency limit) and `cpu` (Redis CPU per fire: claim,
//! start and finish of 100,000 Plans, booking excluded, from `INFO cpu`, `SLOWLOG` (by script) and
//! `INFO commandstats`) and `idempotency` (plain bookings, with an `Idempotency-Key`, and
//! debounced, alternated) and `memory` (Redis bytes per pending item and per finished
//! Life, then `memory-shapes`: what other key shapes would cost, on their own too;
//! `memory-finished` is its last row alone). Pass
//! section names to run only some; `KAIROS_BIN` picks the
//! kairos binary (to measure another build against the same client).

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use kairos_e2e::{
    fast_flags, flags_with, now_ms, plugin_wasm, rfc3339_ms, upload_component, upload_plugin, Api,
    Host, RedisServer, TempDir,
};
use serde_json::json;

/// Arrivals at the bench sink: (ETA the host sent, receive time), both epoch ms.
#[derive(Default)]
struct SinkLog {
    arrivals: Mutex<Vec<(i64, i64)>>,
}

async fn sink_handler(
    State(log): State<Arc<SinkLog>>,
    headers: HeaderMap,
    _body: Bytes,
) -> &'static str {
    let received = now_ms();
    let eta = headers
        .get("x-kairos-eta")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    log.arrivals.lock().unwrap().push((eta, received));
    "ok"
}

async fn start_sink() -> (String, Arc<SinkLog>) {
    let log = Arc::new(SinkLog::default());
    let app = axum::Router::new()
        .fallback(sink_handler)
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), log)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .nth(1)
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb / 1024 / 1024)
        .unwrap_or(0);
    let redis = Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, {mem} GiB RAM, Redis {redis} (append-only file, appendfsync everysec, as `kairos serve` runs its own); kairos, Redis, the bench client and sink all on this machine")
}

fn redis_benchmark(port: u16, pipeline: u32) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-t",
            "zadd",
            "-n",
            "200000",
            "-c",
            "64",
            "-q",
            "-P",
            &pipeline.to_string(),
        ])
        .output()
        .expect("redis-benchmark runs");
    let text = String::from_utf8_lossy(&out.stdout);
    // "ZADD: 95238.10 requests per second, p50=0.3 msec"
    text.split("ZADD:")
        .last()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0)
}

async fn used_memory(redis: &RedisServer) -> i64 {
    let mut conn = redis.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Books `count` point Lives with `clients` concurrent keep-alive clients; `fire_at(i)`
/// gives each one's time. Returns (seconds, per-request latencies in µs, sorted).
async fn book_many(
    host: &Host,
    count: usize,
    clients: usize,
    gateway_path: bool,
    fire_at: impl Fn(usize) -> i64 + Send + Sync + 'static,
) -> (f64, Vec<i64>) {
    book_many_as(host, count, clients, gateway_path, Kind::Plain, fire_at).await
}

/// How the bookings of `book_many_as` are made.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Plain,
    /// Each call with an `Idempotency-Key` of `{prefix}-{i}`.
    Keyed(String),
    /// Each call debounced under key `{prefix}-{i % 1000}`: a thousand windows, each
    /// opened once and then merged into.
    Debounced(String),
    /// A plugin action instead of a webhook: `http-forward`, whose input schema each
    /// booking is checked against, or `noop`, which declares none.
    Plugin(&'static str),
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Keyed(_) => "with Idempotency-Key",
            Kind::Debounced(_) => "debounced",
            Kind::Plugin("noop") => "plugin action, no input schema (noop)",
            Kind::Plugin(_) => "plugin action, input checked against its schema (http-forward)",
        }
    }
}

/// `book_many`, each call made as `kind` says.
async fn book_many_as(
    host: &Host,
    count: usize,
    clients: usize,
    gateway_path: bool,
    kind: Kind,
    fire_at: impl Fn(usize) -> i64 + Send + Sync + 'static,
) -> (f64, Vec<i64>) {
    let fire_at = Arc::new(fire_at);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        // One client (and so one keep-alive connection) per task.
        let api = Api::new(host);
        let (next, fire_at) = (next.clone(), fire_at.clone());
        let kind = kind.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return latencies;
                }
                let action = if let Kind::Plugin(name) = kind {
                    json!({"plugin": name, "input": {"url": "http://example.com/hook", "body": {"n": i}}})
                } else if gateway_path {
                    json!({"path": "/hook", "method": "POST", "body": {"n": i}})
                } else {
                    json!({"url": "http://example.com/hook", "method": "POST", "body": {"n": i}})
                };
                let body = match &kind {
                    Kind::Debounced(p) => json!({"birth": action,
                        "debounce": {"key": format!("{p}-{}", i % 1000), "period": "1h", "max_wait": "2h"}}),
                    _ => json!({"schedule_type": "point", "birth_time": rfc3339_ms(fire_at(i)), "birth": action}),
                };
                let key = match &kind {
                    Kind::Keyed(p) => Some(format!("{p}-{i}")),
                    _ => None,
                };
                let headers: Vec<(&str, &str)> = key
                    .iter()
                    .map(|k| ("idempotency-key", k.as_str()))
                    .collect();
                let body = serde_json::to_vec(&body).unwrap();
                let t = Instant::now();
                let (status, reply) = api
                    .raw(hyper::Method::POST, "/schedules", body, &headers)
                    .await;
                assert_eq!(status, 200, "{reply}");
                latencies.push(t.elapsed().as_micros() as i64);
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    (started.elapsed().as_secs_f64(), all)
}

/// Empties `redis` (after its ceiling was taken there) and starts the host the booking
/// sections measure: no gateway to call, a 30 s guard so that far bookings are taken.
async fn booking_host(redis: &RedisServer) -> Host {
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    Host::start(
        &redis.url(),
        &flags_with(
            fast_flags(),
            &[
                ("--gateway-url", "http://127.0.0.1:9"),
                ("--execution-guard-time", "30s"),
            ],
        ),
    )
}

/// `POST /schedules/batch` against one booking per `POST /schedules`: the same point
/// bookings, on the same host, each way timed after a warm-up.
async fn bench_booking_batch() {
    println!("## Batch booking\n");
    let redis = RedisServer::start_with_fsync("everysec");
    let host = booking_host(&redis).await;
    let far = now_ms() + 86_400_000;
    book_many(&host, 2_000, 64, true, move |i| far + i as i64).await;
    let count = 50_000;
    println!("| way | bookings/s | call latency p50 / p99 (ms) |\n|---|---|---|");
    for clients in [1, 64] {
        let (secs, lat) = book_many(&host, count, clients, true, move |i| {
            far + 10_000 + i as i64
        })
        .await;
        println!(
            "| `POST /schedules`, one booking per call, {clients} keep-alive client(s), {count} bookings | **{:.0}** | {:.2} / {:.2} |",
            count as f64 / secs,
            percentile(&lat, 0.5) as f64 / 1000.0,
            percentile(&lat, 0.99) as f64 / 1000.0
        );
    }
    for (clients, per_call) in [(1, 1000), (4, 1000), (8, 250)] {
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let api = Api::new(&host);
            let next = next.clone();
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let first = next.fetch_add(per_call, Ordering::Relaxed);
                    if first >= count {
                        return latencies;
                    }
                    let bookings: Vec<serde_json::Value> = (first..(first + per_call).min(count))
                        .map(|i| json!({"schedule_type": "point", "birth_time": rfc3339_ms(far + 10_000 + i as i64),
                            "birth": {"path": "/hook", "method": "POST", "body": {"n": i}}}))
                        .collect();
                    let body = serde_json::to_vec(&json!({"bookings": bookings})).unwrap();
                    let t = Instant::now();
                    let (status, reply) = api
                        .raw(hyper::Method::POST, "/schedules/batch", body, &[])
                        .await;
                    assert_eq!(status, 200, "{reply}");
                    assert_eq!(reply["refused"], 0, "{reply}");
                    latencies.push(t.elapsed().as_micros() as i64);
                }
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        lat.sort_unstable();
        let secs = started.elapsed().as_secs_f64();
        println!(
            "| `POST /schedules/batch`, {per_call} per call, {clients} client(s), {count} bookings | **{:.0}** | {:.2} / {:.2} |",
            count as f64 / secs,
            percentile(&lat, 0.5) as f64 / 1000.0,
            percentile(&lat, 0.99) as f64 / 1000.0
        );
    }
    println!();
}

/// Booking throughput and memory on a Redis with `appendfsync` set to `fsync`
/// (`everysec`, as `kairos serve` runs its own, or `always`, its `--durability always`).
async fn bench_booking(fsync: &'static str) {
    println!("## Booking, appendfsync {fsync}\n");
    let redis = RedisServer::start_with_fsync(fsync);
    let ceiling_1 = redis_benchmark(redis.port, 1);
    let ceiling_16 = redis_benchmark(redis.port, 16);
    let host = booking_host(&redis).await;
    // Warm up connections and scripts.
    let far = now_ms() + 86_400_000;
    book_many(&host, 2_000, 64, true, move |i| far + i as i64).await;
    let before = used_memory(&redis).await;
    let count = 100_000;
    let span = CpuSpan::start(&redis, &host).await;
    let (secs, lat) = book_many(&host, count, 64, true, move |i| far + 10_000 + i as i64).await;
    let (redis_per, host_per) = span.per(&redis, count).await;
    let after = used_memory(&redis).await;
    let per_booking = (after - before) as f64 / count as f64;
    println!("| measure | result |\n|---|---|");
    println!("| `POST /schedules`, 100,000 point bookings, 64 keep-alive clients | **{:.0} bookings/s** ({secs:.2} s) |", count as f64 / secs);
    println!(
        "| request latency p50 / p99 / max | {:.2} / {:.2} / {:.2} ms |",
        percentile(&lat, 0.5) as f64 / 1000.0,
        percentile(&lat, 0.99) as f64 / 1000.0,
        percentile(&lat, 1.0) as f64 / 1000.0
    );
    println!(
        "| Redis CPU / host process CPU per booking, same span | {redis_per:.1} / {} µs |",
        host_per.map_or("?".into(), |h| format!("{h:.1}"))
    );
    println!("| Redis `used_memory` per pending point booking (small webhook action) | **{per_booking:.0} bytes** |");
    println!(
        "| ceiling: `redis-benchmark -t zadd -c 64` on the same server | {ceiling_1:.0} ZADD/s |"
    );
    println!("| ceiling: same, pipelined `-P 16` | {ceiling_16:.0} ZADD/s |");
    println!();
}

/// Books `count` Plans firing over `spread_ms` from a start far enough ahead to finish
/// booking first; waits until all fired; returns sorted lateness (ms) and the time from
/// the first fire time to the last arrival.
async fn fire_run(
    host: &Host,
    redis: &RedisServer,
    sink: &Arc<SinkLog>,
    count: usize,
    spread_ms: i64,
) -> (Vec<i64>, i64) {
    sink.arrivals.lock().unwrap().clear();
    // Booking runs at roughly 10k/s here; start firing after it is surely done.
    let lead_ms = 2_000 + (count as i64 / 8);
    let start = now_ms() + lead_ms;
    let step = spread_ms as f64 / count as f64;
    book_many(host, count, 64, true, move |i| {
        start + (i as f64 * step) as i64
    })
    .await;
    assert!(
        now_ms() < start,
        "booking took longer than the lead time; raise it"
    );
    if std::env::var("KAIROS_BENCH_STATS").is_ok() {
        // Count only what firing costs Redis.
        let mut conn = redis.conn().await;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_millis((lead_ms + spread_ms + 60_000) as u64);
    loop {
        if sink.arrivals.lock().unwrap().len() >= count {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {count} fired",
            sink.arrivals.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let arrivals = sink.arrivals.lock().unwrap().clone();
    let mut lateness: Vec<i64> = arrivals.iter().map(|(eta, at)| at - eta).collect();
    lateness.sort_unstable();
    let last = arrivals.iter().map(|(_, at)| *at).max().unwrap_or(start);
    (lateness, last - start)
}

async fn bench_firing(drain_only: bool) {
    println!("## Firing\n");
    let redis = RedisServer::start_with_fsync("everysec");
    let ceiling = redis_benchmark(redis.port, 1);
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let (sink_url, sink) = start_sink().await;
    let host = Host::start(
        &redis.url(),
        &flags_with(
            fast_flags(),
            &[
                ("--gateway-url", sink_url.as_str()),
                ("--execution-guard-time", "500ms"),
                ("--max-claimed", "200000"),
            ],
        ),
    );
    println!("Webhooks to a Rust (axum) sink on keep-alive connections; lateness = sink arrival − booked fire time. Ceiling: `redis-benchmark -t zadd -c 64` on the same server: {ceiling:.0} ZADD/s.\n");
    println!("| run | fired | lateness p50 / p99 / max | last fired after first fire time |\n|---|---|---|---|");
    let mut best_rate = 0;
    if !drain_only {
        best_rate = fire_rates(&host, &redis, &sink).await;
    }
    let (lat, drain) = fire_run(&host, &redis, &sink, 100_000, 1_000).await;
    println!(
        "| 100,000 Plans due within one second | {} | {} / {} / {} ms | **{:.2} s** |",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&lat, 1.0),
        drain as f64 / 1000.0
    );
    if std::env::var("KAIROS_BENCH_STATS").is_ok() {
        let mut conn = redis.conn().await;
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        eprintln!("{stats}");
    }
    if !drain_only {
        println!("\nHighest rate tried with p99 lateness under 50 ms: **{best_rate} fires/s**.\n");
    }
}

/// Lateness at 1,000 fires/s, then rising rates until p99 passes 50 ms; returns the
/// highest rate that stayed under.
async fn fire_rates(host: &Host, redis: &RedisServer, sink: &Arc<SinkLog>) -> usize {
    let (lat, _) = fire_run(host, redis, sink, 10_000, 10_000).await;
    println!(
        "| 1,000 fires/s for 10 s | {} | **{} / {} / {} ms** | |",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&lat, 1.0)
    );
    let mut best_rate = 0;
    for rate in [2_000usize, 5_000, 10_000, 15_000, 20_000] {
        let count = rate * 5;
        let (lat, _) = fire_run(host, redis, sink, count, 5_000).await;
        let p99 = percentile(&lat, 0.99);
        println!(
            "| {rate} fires/s for 5 s | {} | {} / {p99} / {} ms | |",
            lat.len(),
            percentile(&lat, 0.5),
            percentile(&lat, 1.0)
        );
        if p99 < 50 {
            best_rate = rate;
        } else {
            break;
        }
    }
    best_rate
}

/// Queue task throughput with no rate limit: 20,000 tasks added in lists of 100 by 16
/// clients, all with one ETA after the adding ends; then the time until the sink has
/// them all.
async fn bench_queue() {
    println!("## Queue\n");
    let redis = RedisServer::start_with_fsync("everysec");
    let (sink_url, sink) = start_sink().await;
    let host = Host::start(
        &redis.url(),
        &flags_with(
            fast_flags(),
            &[
                ("--gateway-url", sink_url.as_str()),
                ("--max-claimed", "200000"),
            ],
        ),
    );
    let api = Api::new(&host);
    let (status, reply) = api
        .raw(
            axum::http::Method::PUT,
            "/queues/bench",
            serde_json::to_vec(&json!({"rate": 0, "max_concurrent": 0})).unwrap(),
            &[],
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    let count = 20_000usize;
    let per_call = 100;
    let clients = 16;
    let eta = now_ms() + 2_000 + count as i64 / 4;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let api = Api::new(&host);
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(per_call, Ordering::Relaxed);
                if first >= count {
                    return;
                }
                let list: Vec<serde_json::Value> = (first..(first + per_call).min(count))
                    .map(|i| json!({"name": format!("t{i}"), "eta": rfc3339_ms(eta), "action": {"path": "/hook", "method": "POST", "body": {"n": i}}}))
                    .collect();
                let (status, reply) = api
                    .raw(
                        axum::http::Method::POST,
                        "/queues/bench/tasks",
                        serde_json::to_vec(&list).unwrap(),
                        &[],
                    )
                    .await;
                assert_eq!(status, 200, "{reply}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let add_secs = started.elapsed().as_secs_f64();
    assert!(
        now_ms() < eta,
        "adding took longer than the lead time; raise it"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while sink.arrivals.lock().unwrap().len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} tasks delivered",
            sink.arrivals.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = sink
        .arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|(_, at)| *at)
        .max()
        .unwrap_or(eta);
    let drain_secs = (last - eta) as f64 / 1000.0;
    println!("| measure | result |\n|---|---|");
    println!(
        "| `POST /queues/bench/tasks`, {count} tasks in lists of {per_call}, {clients} clients | **{:.0} tasks/s** added ({add_secs:.2} s) |",
        count as f64 / add_secs
    );
    println!(
        "| {count} tasks due at once, no rate or concurrency limit: first ETA to last arrival | {drain_secs:.2} s, **{:.0} tasks/s** delivered |",
        count as f64 / drain_secs
    );
    println!();
}

/// A count a section takes from the environment variable `name`, else `default`.
fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `used_cpu_sys + used_cpu_user` of a redis-server, in µs.
async fn redis_cpu_us(redis: &RedisServer) -> f64 {
    let mut conn = redis.conn().await;
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut conn)
        .await
        .unwrap();
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (field("used_cpu_sys") + field("used_cpu_user")) * 1e6
}

/// Redis's and a host process's CPU time at the start of a measured span.
struct CpuSpan {
    redis_us: f64,
    host_pid: Option<u32>,
    host_us: Option<f64>,
}

impl CpuSpan {
    async fn start(redis: &RedisServer, host: &Host) -> CpuSpan {
        let host_pid = host.pid();
        CpuSpan {
            redis_us: redis_cpu_us(redis).await,
            host_pid,
            host_us: host_pid.and_then(process_cpu_us),
        }
    }

    /// CPU per operation since the start, `n` operations, in µs: Redis's, and the host's
    /// where `/proc` tells it.
    async fn per(&self, redis: &RedisServer, n: usize) -> (f64, Option<f64>) {
        let redis_per = (redis_cpu_us(redis).await - self.redis_us) / n as f64;
        let host_per = self
            .host_us
            .zip(self.host_pid.and_then(process_cpu_us))
            .map(|(b, a)| (a - b) / n as f64);
        (redis_per, host_per)
    }
}

/// CPU time (user + system) process `pid` has used so far, in µs, from
/// `/proc/<pid>/stat` (fields 14 and 15, in clock ticks); None off Linux.
fn process_cpu_us(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it do not.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let hz = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse::<f64>().ok())
        .unwrap_or(100.0);
    Some(ticks / hz * 1e6)
}

/// A host that fires to the bench sink at `sink_url`, booking half a second ahead and
/// holding up to 200,000 claimed Plans, with `extra` flags.
fn firing_host(redis: &RedisServer, sink_url: &str, extra: &[(&str, &str)]) -> Host {
    let mut all = vec![
        ("--gateway-url", sink_url),
        ("--execution-guard-time", "500ms"),
        ("--max-claimed", "200000"),
    ];
    all.extend_from_slice(extra);
    Host::start(&redis.url(), &flags_with(fast_flags(), &all))
}

/// Redis CPU per fire: 100,000 point Plans due within one second, booked first with a
/// look-ahead of one second, so that their claims, starts and finishes all fall in the
/// measured span and the booking does not.
async fn bench_cpu() {
    println!(
        "## Redis CPU per fire
"
    );
    let redis = RedisServer::start_with_fsync("everysec");
    // As `kairos serve` runs its own Redis, and as `scripts/bench peers` runs BullMQ's.
    set_listpack_limit(&redis, "1024").await;
    let (sink_url, sink) = start_sink().await;
    let host = firing_host(&redis, &sink_url, &[("--preset-execution-time", "1s")]);
    let count = 100_000usize;
    // Time enough to book them all before the first is due, on a slow machine too: a
    // warm-up of 5,000 bookings a day ahead (they do not fire here) gives the rate.
    let (warm_secs, _) =
        book_many(&host, 5_000, 64, true, |i| now_ms() + 86_400_000 + i as i64).await;
    let lead_ms = 4_000 + (warm_secs * 1_000.0 * (count as f64 / 5_000.0) * 1.5) as i64;
    let start = now_ms() + lead_ms;
    let step = 1_000.0 / count as f64;
    book_many(&host, count, 64, true, move |i| {
        start + (i as f64 * step) as i64
    })
    .await;
    let measure_from = start - 1_500;
    assert!(
        now_ms() < measure_from,
        "booking took longer than the lead time"
    );
    tokio::time::sleep(Duration::from_millis((measure_from - now_ms()) as u64)).await;
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut by_script = ScriptTimes::start(&mut conn).await;
    let span = CpuSpan::start(&redis, &host).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut polls = 0u32;
    while sink.arrivals.lock().unwrap().len() < count {
        assert!(Instant::now() < deadline, "not every Plan fired");
        tokio::time::sleep(Duration::from_millis(20)).await;
        polls += 1;
        if polls.is_multiple_of(25) {
            by_script.collect(&mut conn).await;
        }
    }
    let last = sink
        .arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|(_, at)| *at)
        .max()
        .unwrap_or(start);
    // The last finish batches are written just after the last call.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (per_fire, host_per_fire) = span.per(&redis, count).await;
    by_script.collect(&mut conn).await;
    let rows = command_stats(&mut conn).await;
    let scripts: u64 = rows
        .iter()
        .filter(|r| r.0 == "evalsha" || r.0 == "eval")
        .map(|r| r.1)
        .sum();
    let commands: u64 = rows
        .iter()
        .filter(|r| r.0 != "evalsha" && r.0 != "eval")
        .map(|r| r.1)
        .sum();
    println!("| measure | result |\n|---|---|");
    println!("| Redis CPU (`used_cpu_sys` + `used_cpu_user`) per fire, claim to finish | **{per_fire:.1} µs** |");
    if let Some(host_per_fire) = host_per_fire {
        println!(
            "| host process CPU (user + system, `/proc/<pid>/stat`) per fire, same span | {host_per_fire:.1} µs |"
        );
    }
    println!(
        "| script calls / Redis commands (inside scripts too) per fire | {:.3} / {:.1} |",
        scripts as f64 / count as f64,
        commands as f64 / count as f64
    );
    println!(
        "| 100,000 Plans due within one second, last call after the first fire time | {:.2} s |",
        (last - start) as f64 / 1000.0
    );
    let top: Vec<String> = rows
        .iter()
        .take(8)
        .map(|(n, calls, usec)| {
            format!(
                "{n} {:.2}/fire {:.1} µs/fire",
                *calls as f64 / count as f64,
                *usec as f64 / count as f64
            )
        })
        .collect();
    println!("| commands by time (commandstats) | {} |", top.join("; "));
    let evalsha_usec: u64 = rows.iter().filter(|r| r.0 == "evalsha").map(|r| r.2).sum();
    println!(
        "| `EVALSHA` time per fire by script (SLOWLOG, calls of {} µs or more: {:.0} % of `EVALSHA`'s time) | {} |",
        ScriptTimes::FROM_US,
        by_script.total_usec() as f64 * 100.0 / evalsha_usec.max(1) as f64,
        by_script.per(count).join("; ")
    );
    println!(
        "| ceiling: `redis-benchmark -t zadd -c 64` on the same server, after the above | {:.0} ZADD/s |",
        redis_benchmark(redis.port, 1)
    );
    println!();
}

/// Redis's time in each kairos script over a span, from its slow log: every call that
/// took `FROM_US` or more is logged, with the script's SHA-1, and read off every second
/// (a read and a reset in one `MULTI`, so that no call is counted twice or lost between
/// them). Calls shorter than that (a claim of a shard with nothing due) are left out; the
/// report says how much of `EVALSHA`'s time the logged ones cover.
struct ScriptTimes {
    names: std::collections::HashMap<String, &'static str>,
    /// Script name (or the start of its hash, for a script of another build) -> (calls,
    /// µs).
    times: std::collections::BTreeMap<String, (u64, u64)>,
}

impl ScriptTimes {
    const FROM_US: u64 = 10;

    async fn start(conn: &mut redis::aio::MultiplexedConnection) -> ScriptTimes {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "slowlog-log-slower-than"])
            .arg(Self::FROM_US)
            .arg(&["slowlog-max-len", "100000"])
            .query_async(conn)
            .await
            .unwrap();
        let mut times = ScriptTimes {
            names: kairos::store::script_names_by_hash(),
            times: Default::default(),
        };
        // What was logged before the span (with the earlier threshold) goes.
        times.collect(conn).await;
        times.times.clear();
        times
    }

    /// Adds the calls logged since the last read.
    async fn collect(&mut self, conn: &mut redis::aio::MultiplexedConnection) {
        let (entries,): (Vec<redis::Value>,) = redis::pipe()
            .atomic()
            .cmd("SLOWLOG")
            .arg("GET")
            .arg(100_000)
            .cmd("SLOWLOG")
            .arg("RESET")
            .ignore()
            .query_async(conn)
            .await
            .unwrap();
        for entry in entries {
            // [id, time, µs, [command, args...], client, name]
            let redis::Value::Array(fields) = entry else {
                continue;
            };
            let (Some(redis::Value::Int(usec)), Some(redis::Value::Array(args))) =
                (fields.get(2), fields.get(3))
            else {
                continue;
            };
            let text = |v: Option<&redis::Value>| match v {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).to_string(),
                _ => String::new(),
            };
            if !text(args.first()).eq_ignore_ascii_case("evalsha") {
                continue;
            }
            let sha = text(args.get(1));
            let name = match self.names.get(&sha) {
                Some(name) => name.to_string(),
                // Another build's script (KAIROS_BIN names an older kairos).
                None => format!("{}…", &sha[..sha.len().min(8)]),
            };
            let t = self.times.entry(name).or_default();
            t.0 += 1;
            t.1 += *usec as u64;
        }
    }

    fn total_usec(&self) -> u64 {
        self.times.values().map(|t| t.1).sum()
    }

    /// "name X µs/fire (n calls)", largest first.
    fn per(&self, count: usize) -> Vec<String> {
        let mut rows: Vec<_> = self.times.iter().collect();
        rows.sort_by_key(|(_, t)| std::cmp::Reverse(t.1));
        rows.iter()
            .map(|(name, (calls, usec))| {
                format!(
                    "{name} {:.1} µs/fire ({calls} calls)",
                    *usec as f64 / count as f64
                )
            })
            .collect()
    }
}

/// What an `Idempotency-Key` and a debounce cost a booking: plain, keyed (every key new,
/// as a client's first try) and debounced bookings (a thousand keys, each window opened
/// once and then merged into) in alternating rounds on one host and Redis, with the
/// ceiling taken on that Redis in the same run, and the Redis memory each adds.
async fn bench_idempotency() {
    println!("## Booking with an Idempotency-Key or a debounce, against plain\n");
    let redis = RedisServer::start();
    let ceiling = redis_benchmark(redis.port, 1);
    let host = booking_host(&redis).await;
    let kinds = [
        Kind::Plain,
        Kind::Keyed("bench-k".into()),
        Kind::Debounced("bench-d".into()),
    ];
    alternate(&host, &redis, &kinds, 2, ceiling).await;
}

/// Booking a plugin action whose input is checked against the plugin's JSON Schema
/// (`http-forward`), one whose plugin declares none (`noop`), and a webhook action, in
/// alternating rounds on one host and Redis, with the ceiling taken on that Redis in the
/// same run.
async fn bench_plugin_booking() {
    println!("## Booking a plugin action (its input checked against the plugin's schema), against a webhook action\n");
    let redis = RedisServer::start();
    let ceiling = redis_benchmark(redis.port, 1);
    let host = booking_host(&redis).await;
    for name in ["http-forward", "noop"] {
        let meta = upload_plugin(&Api::new(&host), name, name, "allowed_hosts=example.com").await;
        assert_eq!(
            meta["input_schema"].is_object(),
            name == "http-forward",
            "{meta}"
        );
    }
    let kinds = [
        Kind::Plain,
        Kind::Plugin("noop"),
        Kind::Plugin("http-forward"),
    ];
    alternate(&host, &redis, &kinds, 3, ceiling).await;
}

/// `rounds` rounds of 20,000 bookings of each of `kinds` in turn over 64 clients: the
/// rate, latency and Redis bytes of each, and each kind's time per booking against the
/// first kind's (the mean of the rounds).
async fn alternate(host: &Host, redis: &RedisServer, kinds: &[Kind], rounds: usize, ceiling: f64) {
    let far = now_ms() + 30 * 86_400_000;
    let per_round = 20_000;
    let mut rows = Vec::new();
    for round in 0..rounds * kinds.len() {
        let kind = match &kinds[round % kinds.len()] {
            Kind::Keyed(p) => Kind::Keyed(format!("{p}-{round}")),
            Kind::Debounced(p) => Kind::Debounced(format!("{p}-{round}")),
            other => other.clone(),
        };
        let before = used_memory(redis).await;
        let (secs, latencies) = book_many_as(host, per_round, 64, true, kind.clone(), move |i| {
            far + (round * per_round + i) as i64
        })
        .await;
        let bytes = (used_memory(redis).await - before) as f64 / per_round as f64;
        rows.push((kind, per_round as f64 / secs, latencies, bytes));
    }
    println!("| round | bookings/s | latency p50 / p99 (ms) | Redis bytes per booking |");
    println!("|---|---|---|---|");
    for (kind, rate, latencies, bytes) in &rows {
        println!(
            "| {} | {rate:.0} | {:.2} / {:.2} | {bytes:.0} |",
            kind.name(),
            percentile(latencies, 0.50) as f64 / 1000.0,
            percentile(latencies, 0.99) as f64 / 1000.0,
        );
    }
    let mean = |want: &str| {
        let rates: Vec<f64> = rows
            .iter()
            .filter(|r| r.0.name() == want)
            .map(|r| r.1)
            .collect();
        rates.iter().sum::<f64>() / rates.len() as f64
    };
    let base = kinds[0].name();
    let ratios: Vec<String> = kinds[1..]
        .iter()
        .map(|k| format!("{} {:.2}x", k.name(), mean(base) / mean(k.name())))
        .collect();
    println!(
        "\nTime per booking against {base} (mean of the rounds): {}. Ceiling in the same run: {ceiling:.0} ZADD/s (`redis-benchmark -t zadd -c 64`).\n",
        ratios.join(", ")
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let want = |s: &str| args.is_empty() || args.iter().any(|a| a == s);
    kairos_e2e::quiet_hosts();
    println!("# kairos benchmark run\n");
    println!("Machine: {}.\n", machine());
    if want("booking") {
        bench_booking("everysec").await;
    }
    if args.iter().any(|a| a == "booking-batch") {
        bench_booking_batch().await;
    }
    if args.iter().any(|a| a == "durability") {
        bench_booking("always").await;
    }
    if want("firing") {
        bench_firing(false).await;
    } else if want("drain") {
        bench_firing(true).await;
    }
    if want("queue") {
        bench_queue().await;
    }
    if args.iter().any(|a| a == "cpu") {
        bench_cpu().await;
    }
    if args.iter().any(|a| a == "idempotency") {
        bench_idempotency().await;
    }
    if args.iter().any(|a| a == "memory") {
        bench_memory().await;
    }
    if args.iter().any(|a| a == "memory-finished") {
        bench_memory_finished().await;
    }
    if args.iter().any(|a| a == "memory-shapes") {
        bench_memory_shapes().await;
    }
    if args.iter().any(|a| a == "scripts") {
        bench_scripts().await;
    }
    if args.iter().any(|a| a == "pending-1m") {
        bench_pending_million().await;
    }
    if args.iter().any(|a| a == "plugin-first-fire") {
        bench_plugin_first_fire().await;
    }
    if args.iter().any(|a| a == "plugin-booking") {
        bench_plugin_booking().await;
    }
}

/// Issue 17 at scale: 1,000,000 pending point Lives (small webhook action, a day ahead)
/// booked into one Redis at `hash-max-listpack-value 1024` (as `kairos serve` runs its
/// own): the booking rate and Redis bytes per Life, then, with all of them pending, the
/// time to list 50 and to GET one by id, the lateness of 1,000 fires/s for 10 s, and
/// the storage ceiling on the same server. Set `KAIROS_BENCH_PENDING` for another count.
async fn bench_pending_million() {
    let count = env_number("KAIROS_BENCH_PENDING", 1_000_000);
    println!("## {count} pending point Lives\n");
    let redis = RedisServer::start_with_fsync("everysec");
    set_listpack_limit(&redis, "1024").await;
    let (sink_url, sink) = start_sink().await;
    let host = firing_host(&redis, &sink_url, &[]);
    let far = now_ms() + 86_400_000;
    // A first 2,000 create every shard's sets.
    post_many(&host, "/schedules", 2_000, 64, move |i| {
        json!({"birth_time": rfc3339_ms(far + 3_600_000 + i as i64), "birth": {"path": "/hook", "method": "POST", "body": {"n": i}}})
    })
    .await;
    let before = used_memory(&redis).await;
    let started = Instant::now();
    post_many(&host, "/schedules", count, 64, move |i| {
        json!({"birth_time": rfc3339_ms(far + i as i64), "birth": {"path": "/hook", "method": "POST", "body": {"n": i}}})
    })
    .await;
    let took = started.elapsed().as_secs_f64();
    let after = used_memory(&redis).await;
    println!("| measure | result |\n|---|---|");
    println!(
        "| booking {count} (single POSTs, 64 clients) | {:.0} /s |",
        count as f64 / took
    );
    println!(
        "| Redis bytes per pending Life (`used_memory` delta) | **{:.0} B** |",
        (after - before) as f64 / count as f64
    );
    let api = Api::new(&host);
    let timed = |lat: &mut Vec<i64>, t: Instant| lat.push(t.elapsed().as_micros() as i64);
    let (mut list, mut by_id, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    let span = CpuSpan::start(&redis, &host).await;
    for _ in 0..200 {
        let path = match &cursor {
            Some(c) => format!("/schedules?limit=50&cursor={c}"),
            None => "/schedules?limit=50".to_string(),
        };
        let t = Instant::now();
        let (status, page) = api.get(&path).await;
        timed(&mut list, t);
        assert_eq!(status, 200, "{page}");
        let items = page["items"].as_array().expect("a page of Lives");
        assert_eq!(items.len(), 50, "{page}");
        ids.extend(
            items
                .iter()
                .filter_map(|l| l["life_uuid"].as_str().map(String::from)),
        );
        cursor = page["next_cursor"].as_str().map(String::from);
    }
    let (redis_per_page, host_per_page) = span.per(&redis, 200).await;
    for id in ids.iter().step_by(ids.len() / 200) {
        let t = Instant::now();
        let (status, _) = api.get(&format!("/schedules/{id}")).await;
        timed(&mut by_id, t);
        assert_eq!(status, 200);
    }
    list.sort_unstable();
    by_id.sort_unstable();
    let ms = |us: i64| us as f64 / 1000.0;
    println!(
        "| `GET /schedules?limit=50`, 200 pages in turn, p50 / p99 | {:.2} / {:.2} ms |",
        ms(percentile(&list, 0.5)),
        ms(percentile(&list, 0.99))
    );
    println!(
        "| the same pages: Redis CPU / host process CPU per page | {:.0} / {} µs |",
        redis_per_page,
        host_per_page.map_or("?".into(), |h| format!("{h:.0}"))
    );
    println!(
        "| `GET /schedules/{{id}}`, {} Lives, p50 / p99 | {:.2} / {:.2} ms |",
        by_id.len(),
        ms(percentile(&by_id, 0.5)),
        ms(percentile(&by_id, 0.99))
    );
    let (lat, _) = fire_run(&host, &redis, &sink, 10_000, 10_000).await;
    println!(
        "| 1,000 fires/s for 10 s beside them: lateness p50 / p99 / max | {} / **{}** / {} ms |",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&lat, 1.0)
    );
    println!(
        "| ceiling: `redis-benchmark -t zadd -c 64` on the same server, after the above | {:.0} ZADD/s |",
        redis_benchmark(redis.port, 1)
    );
    println!();
}

/// A component with a custom section appended (`kairos-bench` = `n`): the same code
/// under a new digest, which no host has compiled yet.
fn with_custom_section(component: &[u8], n: u32) -> Vec<u8> {
    let name = b"kairos-bench";
    let payload = n.to_le_bytes();
    let mut out = component.to_vec();
    out.push(0); // a custom section
    out.push((1 + name.len() + payload.len()) as u8); // its size (LEB128, < 128)
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.extend_from_slice(&payload);
    out
}

/// A plugin's first firing on a host that did not take its upload (issue 16: it should
/// cost what later firings do). Each round uploads `http-forward` under a new digest
/// through host A, stops A, and lets host B, which prepared the upload on its own, fire
/// two Lives with it; the run durations come from the Lives' history.
async fn bench_plugin_first_fire() {
    println!("## A plugin's first firing on another host\n");
    let redis = RedisServer::start_with_fsync("everysec");
    let (sink_url, sink) = start_sink().await;
    let sink_addr = sink_url.trim_start_matches("http://").to_string();
    let flags = flags_with(
        fast_flags(),
        &[
            ("--gateway-url", sink_url.as_str()),
            ("--allowed-hosts", sink_addr.as_str()),
        ],
    );
    let dir_b = TempDir::new("first-fire-b");
    let b = Host::start_in(&redis.url(), &flags, &dir_b.0);
    let api_b = Api::new(&b);
    let base = plugin_wasm("http-forward");
    println!(
        "| round | B prepared it in (compile, link) | first firing on B | second firing on B |"
    );
    println!("|---|---|---|---|");
    for round in 0..5u32 {
        let dir_a = TempDir::new("first-fire-a");
        let mut a = Host::start_in(&redis.url(), &flags, &dir_a.0);
        let meta = upload_component(
            &Api::new(&a),
            "fwd",
            with_custom_section(&base, round),
            &format!("allowed_hosts={sink_addr}"),
        )
        .await;
        a.terminate(Duration::from_secs(10));
        drop(a);
        let digest = meta["digest"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        let prepared_ms = loop {
            let log = b.log_text();
            if let Some(line) = log
                .lines()
                .find(|l| l.contains("plugin ready") && l.contains(&digest))
            {
                break line
                    .split("ms=")
                    .nth(1)
                    .and_then(|t| t.split_whitespace().next())
                    .unwrap_or("?")
                    .to_string();
            }
            assert!(
                Instant::now() < deadline,
                "B did not prepare round {round}: {log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let arrived = sink.arrivals.lock().unwrap().len();
        let mut ids = Vec::new();
        for k in 0..2 {
            let body = json!({"birth_time": rfc3339_ms(now_ms() + 1_500 + k * 500),
                "birth": {"plugin": format!("fwd@{}", meta["version"]), "input": {"url": format!("{sink_url}/hook"), "body": {"round": round}}}});
            let (status, reply) = api_b
                .raw(
                    hyper::Method::POST,
                    "/schedules",
                    serde_json::to_vec(&body).unwrap(),
                    &[],
                )
                .await;
            assert_eq!(status, 200, "{reply}");
            ids.push(reply["life_uuid"].as_str().unwrap().to_string());
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while sink.arrivals.lock().unwrap().len() < arrived + 2 {
            assert!(Instant::now() < deadline, "round {round} did not fire");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut ms = Vec::new();
        for id in &ids {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (_, life) = api_b.get(&format!("/schedules/{id}")).await;
                if let Some(d) = life["history"][0]["duration_ms"].as_i64() {
                    ms.push(d);
                    break;
                }
                assert!(Instant::now() < deadline, "no history for {id}: {life}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        println!(
            "| {} | {prepared_ms} ms | {} ms | {} ms |",
            round + 1,
            ms[0],
            ms[1]
        );
    }
    println!();
}

/// POSTs `count` bodies to `path` over `clients` keep-alive clients, `body(i)` each,
/// every one answered 200.
async fn post_many(
    host: &Host,
    path: &'static str,
    count: usize,
    clients: usize,
    body: impl Fn(usize) -> serde_json::Value + Send + Sync + 'static,
) {
    let body = Arc::new(body);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let api = Api::new(host);
        let (next, body) = (next.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return;
                }
                let bytes = serde_json::to_vec(&body(i)).unwrap();
                let (status, reply) = api.raw(hyper::Method::POST, path, bytes, &[]).await;
                assert_eq!(status, 200, "{reply}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Redis bytes per pending item at 100,000 pending (issue 17): point and term bookings
/// and queue tasks, with a small webhook action (~50 B of JSON) and one of ~110 B, on
/// Redis's default `hash-max-listpack-value` (64: a hash holding a longer value takes
/// Redis's larger hashtable encoding) and on the 1024 `kairos serve` gives its own Redis.
async fn bench_memory() {
    println!("## Memory per pending item, 100,000 pending\n");
    println!("| item | `hash-max-listpack-value 64` (Redis's default) | `1024` (`kairos serve`'s own Redis) |");
    println!("|---|---|---|");
    let small = |i: usize| json!({"path": "/hook", "method": "POST", "body": {"n": i}});
    let large = |i: usize| json!({"path": "/hook", "method": "POST", "body": {"order": format!("A-{i:07}"), "customer": "c-99", "note": "remind the customer"}});
    type Make = Box<dyn Fn(usize) -> serde_json::Value + Send + Sync>;
    let cases: Vec<(&str, &'static str, Make)> = vec![
        (
            "point booking, small action",
            "/schedules",
            Box::new(
                move |i| json!({"schedule_type": "point", "birth_time": rfc3339_ms(now_ms() + 86_400_000 + i as i64), "birth": small(i)}),
            ),
        ),
        (
            "point booking, ~110 B action",
            "/schedules",
            Box::new(
                move |i| json!({"schedule_type": "point", "birth_time": rfc3339_ms(now_ms() + 86_400_000 + i as i64), "birth": large(i)}),
            ),
        ),
        (
            "term booking, small actions",
            "/schedules",
            Box::new(move |i| {
                let at = now_ms() + 86_400_000 + i as i64 * 10;
                json!({"schedule_type": "term", "birth_time": rfc3339_ms(at), "death_time": rfc3339_ms(at + 600_000), "birth": small(i), "death": small(i)})
            }),
        ),
        (
            "queue task, small action",
            "/queues/default/tasks",
            Box::new(
                move |i| json!({"name": format!("t{i}"), "eta": rfc3339_ms(now_ms() + 86_400_000), "action": small(i)}),
            ),
        ),
    ];
    let count = 100_000;
    for (label, path, make) in cases {
        let make = Arc::new(make);
        let mut row = Vec::new();
        for limit in ["64", "1024"] {
            let redis = RedisServer::start_with_fsync("everysec");
            let host = booking_host(&redis).await;
            set_listpack_limit(&redis, limit).await;
            // A first 2,000 create every shard's sets and the default queue.
            let m = make.clone();
            post_many(&host, path, 2_000, 64, move |i| m(count + i)).await;
            let before = used_memory(&redis).await;
            let m = make.clone();
            post_many(&host, path, count, 64, move |i| m(i)).await;
            let after = used_memory(&redis).await;
            row.push(format!("{:.0} B", (after - before) as f64 / count as f64));
        }
        println!("| {label} | {} | {} |", row[0], row[1]);
    }
    bench_memory_finished().await;
    println!();
    bench_memory_shapes().await;
}

/// The last row of `memory` on its own (`memory-finished`): bytes per finished Life.
async fn bench_memory_finished() {
    let mut row = Vec::new();
    for limit in ["64", "1024"] {
        row.push(format!("{:.0} B", finished_bytes(limit, 20_000).await));
    }
    println!(
        "| point booking, small action, **finished** and kept as history (20,000 fired) | {} | {} |",
        row[0], row[1]
    );
}

/// What a pending point booking would cost in other key shapes (issue 17's 300 B): the
/// same 100,000 Lives written straight to a Redis at `hash-max-listpack-value 1024`, with
/// the same small action, in layout 2's and today's shapes and in ones with fewer keys and
/// shorter names.
/// No kairos runs: this measures Redis's cost of each shape, the floor a layout can reach.
async fn bench_memory_shapes() {
    println!("## Redis bytes per pending point booking, by key shape (100,000, no kairos)\n");
    println!("| shape | bytes per Life |");
    println!("|---|---|");
    type Shape = fn(&mut redis::Pipeline, &str, i64, &str);
    let shapes: [(&str, Shape); 6] = [
        (
            "layout 2: Life hash, Plan hash, `due` and `lives` entries",
            |p, id, at, action| {
                p.hset_multiple(
                    format!("kairos:{{s4.10}}:life:{id}"),
                    &[
                        ("schedule_type", "point".to_string()),
                        ("state", "Inexistent".to_string()),
                        ("birth_at_ms", at.to_string()),
                        ("created_at_ms", (at - 86_400_000).to_string()),
                    ],
                )
                .hset_multiple(
                    format!("kairos:{{s4.10}}:plan:{id}:birth"),
                    &[
                        ("state", "Standby".to_string()),
                        ("fire_at_ms", at.to_string()),
                        ("action", action.to_string()),
                    ],
                )
                .zadd("kairos:{s4.10}:due", format!("{id}:birth"), at)
                .zadd("kairos:{s4.10}:lives", format!("{at:013}:{id}"), 0);
            },
        ),
        (
            "layout 3 (today's): the Plan's fields folded into the Life's hash (`b.state`, ...), `due`, `lives`",
            |p, id, at, action| {
                folded(p, &format!("kairos:{{s4.10}}:life:{id}"), at, action);
                p.zadd("kairos:{s4.10}:due", format!("{id}:birth"), at)
                    .zadd("kairos:{s4.10}:lives", format!("{at:013}:{id}"), 0);
            },
        ),
        ("folded, and no `lives` index", |p, id, at, action| {
            folded(p, &format!("kairos:{{s4.10}}:life:{id}"), at, action);
            p.zadd("kairos:{s4.10}:due", format!("{id}:birth"), at);
        }),
        (
            "folded, no `lives`, one-letter key parts and field names",
            |p, id, at, action| {
                short_named(p, format!("k:{{s4}}:L:{id}"), at, action);
                p.zadd("k:{s4}:due", format!("{id}:b"), at);
            },
        ),
        (
            "as above, the id as 16 raw bytes in the key and the `due` member",
            |p, id, at, action| {
                let raw = uuid_bytes(id);
                let mut key = b"k:{s4}:L:".to_vec();
                key.extend_from_slice(&raw);
                short_named(p, key, at, action);
                p.zadd("k:{s4}:due", raw.to_vec(), at);
            },
        ),
        (
            "only the Life's hash (short names), no sorted-set entry at all",
            |p, id, at, action| {
                short_named(p, format!("k:{{s4}}:L:{id}"), at, action);
            },
        ),
    ];
    /// The folded Life's hash with one- and two-letter field names.
    fn short_named(
        p: &mut redis::Pipeline,
        key: impl redis::ToSingleRedisArg,
        at: i64,
        action: &str,
    ) {
        p.hset_multiple(
            key,
            &[
                ("t", "p".to_string()),
                ("s", "I".to_string()),
                ("b", at.to_string()),
                ("c", (at - 86_400_000).to_string()),
                ("bs", "S".to_string()),
                ("ba", action.to_string()),
            ],
        );
    }
    fn folded(p: &mut redis::Pipeline, key: &str, at: i64, action: &str) {
        p.hset_multiple(
            key,
            &[
                ("schedule_type", "point".to_string()),
                ("state", "Inexistent".to_string()),
                ("birth_at_ms", at.to_string()),
                ("created_at_ms", (at - 86_400_000).to_string()),
                ("b.state", "Standby".to_string()),
                ("b.action", action.to_string()),
            ],
        );
    }
    fn uuid_bytes(id: &str) -> [u8; 16] {
        let hex: String = id.chars().filter(|c| *c != '-').collect();
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }
    let count = 100_000;
    let base = now_ms() + 86_400_000;
    for (label, shape) in shapes {
        let redis = RedisServer::start_with_fsync("everysec");
        set_listpack_limit(&redis, "1024").await;
        let mut conn = redis.conn().await;
        let write = |from: usize, to: usize| {
            let mut pipe = redis::pipe();
            for i in from..to {
                let id = format!("7f{:06x}-0000-4000-8000-{:012x}", i / 4096, i);
                let action =
                    json!({"path": "/hook", "method": "POST", "body": {"n": i}}).to_string();
                shape(&mut pipe, &id, base + i as i64, &action);
            }
            pipe.ignore();
            pipe
        };
        // The first 2,000 create the sorted sets.
        let _: () = write(count, count + 2_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let before = used_memory(&redis).await;
        for from in (0..count).step_by(10_000) {
            let _: () = write(from, from + 10_000)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        let after = used_memory(&redis).await;
        println!(
            "| {label} | {:.0} B |",
            (after - before) as f64 / count as f64
        );
    }
    println!();
}

/// Every command Redis counted since its last `CONFIG RESETSTAT` (inside scripts too),
/// from `INFO commandstats`: (name, calls, µs), the most time first.
async fn command_stats(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64, u64)> {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    // cmdstat_hset:calls=123,usec=456,...
    let mut rows: Vec<(String, u64, u64)> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let get = |k: &str| -> u64 {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            Some((name.to_string(), get("calls"), get("usec")))
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.2));
    rows
}

/// Prints the commands a phase of `bench_scripts` ran (inside its scripts too), per
/// Plan, by time (INFO commandstats), and resets the counts for the next phase.
async fn phase_commands(redis: &RedisServer, phase: &str, count: usize) {
    let mut conn = redis.conn().await;
    let rows = command_stats(&mut conn).await;
    let top: Vec<String> = rows
        .iter()
        .take(7)
        .map(|(n, calls, usec)| {
            format!(
                "{n} {:.2}/Plan {:.2} µs/Plan",
                *calls as f64 / count as f64,
                *usec as f64 / count as f64
            )
        })
        .collect();
    println!("{phase}: {}", top.join("; "));
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// `CONFIG SET hash-max-listpack-value limit`: past it, a hash value makes Redis keep the
/// hash in its larger hashtable encoding.
async fn set_listpack_limit(redis: &RedisServer, limit: &str) {
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("hash-max-listpack-value")
        .arg(limit)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Redis bytes a fired point Life keeps as history (its hashes, its run record, its
/// place in `finished`), per Life: `count` Lives booked a few seconds ahead with a small
/// webhook action, all fired to a local sink and recorded.
async fn finished_bytes(listpack_limit: &str, count: usize) -> f64 {
    let redis = RedisServer::start_with_fsync("everysec");
    let (sink_url, sink) = start_sink().await;
    let host = firing_host(&redis, &sink_url, &[]);
    set_listpack_limit(&redis, listpack_limit).await;
    // A first 2,000, fired, create every shard's sets.
    // Each booked a second or two after it is sent, whatever the host's speed.
    book_many(&host, 2_000, 64, true, move |i| {
        now_ms() + 1_000 + (i % 500) as i64
    })
    .await;
    let wait_for = |n: usize| {
        let sink = sink.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            while sink.arrivals.lock().unwrap().len() < n {
                assert!(Instant::now() < deadline, "not every Plan fired");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // The last finish batches are written just after the last call.
            tokio::time::sleep(Duration::from_millis(1_500)).await;
        }
    };
    wait_for(2_000).await;
    let before = used_memory(&redis).await;
    book_many(&host, count, 64, true, move |i| {
        now_ms() + 1_000 + (i % 1_000) as i64
    })
    .await;
    wait_for(2_000 + count).await;
    let after = used_memory(&redis).await;
    (after - before) as f64 / count as f64
}

/// Issue 10's Redis CPU per fire, taken apart: 100,000 point Lives booked into one shard,
/// then claimed, started and finished through the store's own calls (the scripts a host
/// runs, with its arguments), in batches of `KAIROS_BENCH_BATCH` Plans (default 16: about
/// what a host under load sends per shard and call), with Redis's `used_cpu_user +
/// used_cpu_sys` read around each phase. No host, sink or HTTP shares the machine, so
/// the figures are the scripts' own, without the noise of a whole drain; each phase's
/// commands (INFO commandstats) are printed after it. Beside them, the floor of the
/// layout: the commands each phase cannot do without, and nothing else.
async fn bench_scripts() {
    use kairos::model::{Action, NewLife, ScheduleType, WebhookAction};
    use kairos::store::{
        ClaimReply, FinishedRun, IdOrigin, RunOutcome, RunRecord, StartOutcome, Store, Takeover,
    };

    let count = 100_000usize;
    let batch = env_number("KAIROS_BENCH_BATCH", 16);
    println!("## Redis CPU per Plan of each firing script ({count} point Lives, one shard, batches of {batch})\n");
    let redis = RedisServer::start_with_fsync("everysec");
    let store = Store::connect(&redis.url(), "kairos", "UTC".parse().unwrap(), Some(1))
        .await
        .expect("open the keyspace");
    let host = "bench-host-1";
    let gen = match store.shard_takeover(0, host, 600_000).await.unwrap() {
        Takeover::Taken { gen, .. } => gen,
        Takeover::HeldBy(other) => panic!("the shard is held by {other}"),
    };
    let action: WebhookAction = serde_json::from_value(json!({
        "url": "http://127.0.0.1:9/bench", "method": "POST", "body": {"n": 1}
    }))
    .unwrap();
    let due_ms = now_ms() + 3_600_000;
    let booked_at = now_ms();
    let lives: Vec<NewLife> = (0..count)
        .map(|i| NewLife {
            life_uuid: format!("{:032x}", 0xb0_0000_0000_u64 + i as u64),
            schedule_type: ScheduleType::Point,
            resource_id: None,
            birth_at_ms: due_ms + i as i64,
            death_at_ms: None,
            birth_action: Action::Webhook(action.clone()),
            death_action: None,
        })
        .collect();
    for life in &lives {
        store
            .book(life, IdOrigin::Given, booked_at, 0, 0)
            .await
            .expect("book");
    }
    let cpu = || redis_cpu_us(&redis);
    let mut rows = Vec::new();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis.conn().await)
        .await
        .unwrap();

    let before = cpu().await;
    let mut claimed = Vec::with_capacity(count);
    while claimed.len() < count {
        match store
            .claim(0, host, gen, due_ms + count as i64, 1_000, 0, 0)
            .await
            .unwrap()
        {
            ClaimReply::Claimed { plans, .. } if !plans.is_empty() => claimed.extend(plans),
            other => panic!(
                "claim stopped early: {} claimed, then {other:?}",
                claimed.len()
            ),
        }
    }
    rows.push(("claim (`claim.lua`, 1,000 a call)", cpu().await - before));
    phase_commands(&redis, "claim", count).await;

    let before = cpu().await;
    for chunk in claimed.chunks(batch) {
        let plans: Vec<_> = chunk.iter().collect();
        let outcomes = store
            .start_runs(0, host, gen, &plans, 3_600_000 * 2)
            .await
            .unwrap();
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, StartOutcome::Run { .. })),
            "every Plan starts: {outcomes:?}"
        );
    }
    rows.push(("start (`start_run.lua`)", cpu().await - before));
    phase_commands(&redis, "start", count).await;

    let runs: Vec<FinishedRun> = claimed
        .into_iter()
        .map(|plan| FinishedRun {
            record: RunRecord {
                should_run_at_ms: plan.fire_at_ms,
                started_at_ms: plan.fire_at_ms + 1,
                duration_ms: 2,
                outcome: "success",
                status: Some(200),
                error: None,
                attempt: 1,
                output: None,
                logs: Vec::new(),
                retry_after_ms: None,
            },
            plan,
            outcome: RunOutcome::Done,
            callback: None,
        })
        .collect();
    let before = cpu().await;
    for chunk in runs.chunks(batch) {
        let held = store.finish_lives(host, chunk, now_ms(), 0).await.unwrap();
        assert!(held.iter().all(|h| *h), "every run is recorded as held");
    }
    rows.push(("finish (`finish_life.lua`)", cpu().await - before));
    phase_commands(&redis, "finish", count).await;

    // The floor of layout 4: per Plan, only the commands each phase cannot do without
    // (claim: the Plan off its leaf of `due`, its record read, its `inflight` entry;
    // start: the entry read and rewritten; finish: the record written, the entry
    // dropped, the Life into a leaf of `finished`), over the same Lives, in a bare loop:
    // no index, fence, bucket arithmetic or logic.
    let floor = redis::Script::new(
        r#"
        local phase, p = ARGV[1], KEYS[1]
        for i = 2, #ARGV do
          local id = ARGV[i]
          if phase == 'claim' then
            redis.call('ZREM', p .. 'floor-due', id .. ':birth')
            redis.call('HGET', p .. 'r:0', id)
            redis.call('HSET', p .. 'floor-inflight', id .. ':birth', '1|' .. id .. '|bench-host-1')
          elseif phase == 'start' then
            local v = redis.call('HGET', p .. 'floor-inflight', id .. ':birth')
            redis.call('HSET', p .. 'floor-inflight', id .. ':birth', v .. '|1|1')
          else
            redis.call('HSET', p .. 'floor-r', id, string.rep('x', 250))
            redis.call('HDEL', p .. 'floor-inflight', id .. ':birth')
            redis.call('ZADD', p .. 'floor-finished', 1, id)
          end
        end
        return 1
        "#,
    );
    let mut conn = redis.conn().await;
    let prefix = store.shard(0).prefix.clone();
    for chunk in lives.chunks(1_000) {
        let mut pipe = redis::pipe();
        for life in chunk {
            pipe.cmd("ZADD")
                .arg(format!("{prefix}floor-due"))
                .arg(life.birth_at_ms)
                .arg(format!("{}:birth", life.life_uuid))
                .ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();
    }
    let mut floor_total = 0.0;
    for phase in ["claim", "start", "finish"] {
        let before = cpu().await;
        for chunk in lives.chunks(batch) {
            let mut call = floor.key(&prefix);
            call.arg(phase);
            for life in chunk {
                call.arg(&life.life_uuid);
            }
            let _: i64 = call.invoke_async(&mut conn).await.unwrap();
        }
        floor_total += cpu().await - before;
    }

    println!("| phase | Redis CPU per Plan |\n|---|---|");
    let mut total = 0.0;
    for (name, us) in &rows {
        total += us;
        println!("| {name} | {:.1} µs |", us / count as f64);
    }
    println!(
        "| **claim + start + finish** | **{:.1} µs** |",
        total / count as f64
    );
    println!(
        "| floor: per Plan only the commands each phase needs (8), in a bare loop | {:.1} µs |",
        floor_total / count as f64
    );
    println!(
        "\nStorage ceiling, same server and run (`redis-benchmark -t zadd -c 64`): {:.0} ZADD/s\n",
        redis_benchmark(redis.port, 1)
    );
}
