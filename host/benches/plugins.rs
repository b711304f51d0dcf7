//! Plugin invocation benchmark (`cargo bench -p kairos --bench plugins`, or
//! `scripts/bench plugins`). Prints a markdown report for BENCHMARKS.md.
//!
//! - no-op invocation: fresh store + instantiate from the pre-linked component + call +
//!   drop, with the `noop` plugin from `plugins/`: per-call p50/p99 on one task, and
//!   invocations/s with 1, 2 and 64 concurrent callers on a 2-worker runtime;
//! - HTTP: the `http-forward` plugin's call next to the built-in webhook's, to the same
//!   local sink, one at a time.
//!
//! It starts its own redis-server (the registry lives there) on a free port.
//!
//! For looking into the HTTP rows: `KAIROS_BENCH_HTTP_ONLY=1` skips the no-op rows,
//! `KAIROS_BENCH_CURRENT_THREAD=1` runs everything (sink included) on one thread, with
//! no wake-ups between threads, and `KAIROS_BENCH_ONLY=hook` or `=plugin` makes only
//! that kind of call (both rows then show it), so that `perf stat --no-inherit` counts
//! one kind's syscalls and CPU.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kairos::actions::webhook::{pooled_client, tls_config, CallContext, WebhookAgent};
use kairos::bookings::Bookings;
use kairos::clock::SystemClock;
use kairos::config::{AllowedHost, Config};
use kairos::model::{PlanKind, WebhookAction};
use kairos::outbound::{OutboundPolicy, PolicyResolver};
use kairos::plugins::registry::UploadLimits;
use kairos::plugins::runtime::DEFAULT_KEEP_RESIDENT;
use kairos::plugins::{InvokeContext, PluginRuntime, Registry, RuntimeSettings};
use kairos::store::Store;

fn wasm(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target-plugins/wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build plugins/ first (scripts/bench does)",
            path.display()
        )
    })
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

struct RedisChild(std::process::Child);

impl Drop for RedisChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (RedisChild, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server runs");
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (RedisChild(child), format!("redis://127.0.0.1:{port}"))
}

/// `redis-benchmark -t zadd` against the bench's Redis: the storage ceiling of the same
/// machine in the same run, for comparison with the other benchmarks.
fn redis_ceiling(url: &str) -> String {
    let port = url.rsplit(':').next().unwrap_or("6379");
    std::process::Command::new("redis-benchmark")
        .args(["-p", port, "-t", "zadd", "-c", "64", "-n", "100000", "-q"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).replace('\r', "\n"))
        .unwrap_or_else(|e| format!("redis-benchmark did not run: {e}"))
}

fn ctx() -> InvokeContext {
    InvokeContext {
        life_id: "00000000-0000-4000-8000-000000000000".into(),
        plan: PlanKind::Birth,
        scheduled_at_ms: 0,
        attempt: 1,
        resource_id: None,
        fence: Default::default(),
    }
}

fn main() {
    let runtime = if std::env::var_os("KAIROS_BENCH_CURRENT_THREAD").is_some() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    runtime.block_on(run());
}

async fn run() {
    let (_redis, url) = start_redis();
    let data = std::env::temp_dir().join(format!("kairos-plugin-bench-{}", std::process::id()));
    let store = Store::connect(&url, "bench", chrono_tz::UTC, None)
        .await
        .unwrap();
    let registry = Registry::new(store.conn(), store.keys.registry());
    let sink = start_sink().await;
    let config = Config {
        allowed_hosts: vec![AllowedHost::Host {
            host: "127.0.0.1".into(),
            port: Some(sink.port()),
        }],
        ..Config::default()
    };
    let tls = tls_config(None).unwrap();
    let policy = Arc::new(OutboundPolicy::new(config.allowed_hosts.clone(), None));
    let bookings = Arc::new(Bookings {
        config: config.clone(),
        store: store.clone(),
        clock: Arc::new(SystemClock),
        plugins: registry.clone(),
        policy: policy.clone(),
    });
    let make_runtime = |keep_resident: usize, pagemap_scan: bool| {
        PluginRuntime::new(
            registry.clone(),
            bookings.clone(),
            RuntimeSettings {
                instances: 256,
                // In place: the bench times the runtime itself, not the hop to a pool.
                threads: 0,
                cache_dir: data.join("plugin-cache"),
                policy: policy.clone(),
                client: pooled_client(
                    tls.clone(),
                    Duration::from_secs(5),
                    PolicyResolver::new(policy.clone(), false),
                ),
                public_client: pooled_client(
                    tls.clone(),
                    Duration::from_secs(5),
                    PolicyResolver::new(policy.clone(), true),
                ),
                response_limit: 64 * 1024,
                request_timeout: Duration::from_secs(10),
                keep_resident,
                pagemap_scan,
            },
        )
        .unwrap()
    };
    let limits = UploadLimits {
        allowed_hosts: vec![format!("127.0.0.1:{}", sink.port())],
        memory_mb: 64,
        timeout_ms: 10_000,
    };
    for (name, file) in [("noop", "noop"), ("http-forward", "http_forward")] {
        registry
            .put(
                name,
                &wasm(file),
                None,
                kairos::plugins::registry::PluginState::Ready,
                &limits,
                "",
                0,
            )
            .await
            .unwrap();
    }

    println!("## Plugin invocations\n");
    println!(
        "`cargo bench -p kairos --bench plugins`; {} cores; wasmtime 48, pooling allocator, release build. `keep_resident`: bytes of dirtied linear memory the pool resets in place per instance; PAGEMAP_SCAN: whether it finds those pages with the Linux ioctl (kairos serves with 256 KiB and on).\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!("| no-op invocation (fresh store + instantiate + call + drop) | keep_resident | PAGEMAP_SCAN | p50 | p99 | invocations/s |");
    println!("|---|---|---|---|---|---|");
    // `KAIROS_BENCH_POOL=65536:0,1048576:1` picks the (keep_resident, pagemap) pairs.
    let settings: Vec<(usize, bool)> = match std::env::var("KAIROS_BENCH_POOL") {
        Ok(list) => list
            .split(',')
            .map(|s| {
                let (k, p) = s.trim().split_once(':').unwrap();
                (k.parse().unwrap(), p == "1")
            })
            .collect(),
        Err(_) => vec![
            (0, false),
            (64 << 10, false),
            (1 << 20, false),
            (64 << 10, true),
            (DEFAULT_KEEP_RESIDENT, true),
            (2 << 20, true),
        ],
    };
    for (keep, pagemap) in settings {
        if std::env::var_os("KAIROS_BENCH_HTTP_ONLY").is_some() {
            break;
        }
        let plugins = make_runtime(keep, pagemap);
        noop_rows(&plugins, keep, pagemap).await;
    }
    let plugins = make_runtime(DEFAULT_KEEP_RESIDENT, true);

    // HTTP: the same POST through a plugin and through the webhook agent.
    let target = format!("http://127.0.0.1:{}/bench", sink.port());
    let (fwd, fwd_meta) = plugins.preload("http-forward").await.unwrap();
    let fwd_input = serde_json::json!({"url": target, "body": {"n": 1}}).to_string();
    let webhook = WebhookAgent::new(
        None,
        Arc::new(OutboundPolicy::new(config.allowed_hosts.clone(), None)),
        None,
        Duration::from_secs(5),
        Duration::from_secs(10),
        64 * 1024,
        tls,
    );
    let action = WebhookAction {
        path: None,
        url: Some(target.clone()),
        method: "POST".into(),
        headers: Default::default(),
        body: Some(serde_json::json!({"n": 1})),
        connect_timeout_ms: None,
        request_timeout_ms: None,
        retry_count: 0,
        retry_interval_ms: 0,
        callbacks: Default::default(),
    };
    let call_ctx = CallContext {
        life_uuid: "00000000-0000-4000-8000-000000000000",
        plan: "birth",
        execution_count: 1,
        fire_at_ms: 0,
        resource_id: None,
        extra_headers: &[],
        fence: &Default::default(),
    };
    let n = 5_000;
    for _ in 0..500 {
        let r = plugins
            .invoke_loaded(&fwd, &fwd_meta, &ctx(), &fwd_input)
            .await;
        assert!(r.result.is_ok(), "{:?} {:?}", r.result, r.logs);
        assert!(webhook.call(&action, &call_ctx).await.is_success());
    }
    let mut plugin_times = Vec::with_capacity(n);
    let mut hook_times = Vec::with_capacity(n);
    let only = std::env::var("KAIROS_BENCH_ONLY").unwrap_or_default();
    for _ in 0..n {
        if only == "hook" {
            let t = Instant::now();
            assert!(webhook.call(&action, &call_ctx).await.is_success());
            hook_times.push(t.elapsed());
            plugin_times.push(t.elapsed());
            continue;
        }
        if only == "plugin" {
            let t = Instant::now();
            let r = plugins
                .invoke_loaded(&fwd, &fwd_meta, &ctx(), &fwd_input)
                .await;
            assert!(r.result.is_ok());
            plugin_times.push(t.elapsed());
            hook_times.push(t.elapsed());
            continue;
        }
        let t = Instant::now();
        let r = plugins
            .invoke_loaded(&fwd, &fwd_meta, &ctx(), &fwd_input)
            .await;
        plugin_times.push(t.elapsed());
        assert!(r.result.is_ok(), "{:?}", r.result);
        let t = Instant::now();
        assert!(webhook.call(&action, &call_ctx).await.is_success());
        hook_times.push(t.elapsed());
    }
    plugin_times.sort();
    hook_times.sort();
    println!("\n| one POST to a local axum sink, keep-alive, alternating | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| built-in webhook | {:.0} µs | {:.0} µs |",
        percentile(&hook_times, 0.5),
        percentile(&hook_times, 0.99)
    );
    println!(
        "| `http-forward` plugin (instantiate + wasi:http through the host's pooled client) | {:.0} µs | {:.0} µs |",
        percentile(&plugin_times, 0.5),
        percentile(&plugin_times, 0.99)
    );
    println!(
        "\nStorage ceiling, same machine and run (`redis-benchmark -t zadd -c 64`): {}",
        redis_ceiling(&url)
            .lines()
            .rfind(|l| l.contains("requests per second"))
            .unwrap_or("")
    );
    let _ = std::fs::remove_dir_all(&data);
}

async fn noop_rows(plugins: &Arc<PluginRuntime>, keep_resident: usize, pagemap: bool) {
    let kib = keep_resident / 1024;
    let scan = if pagemap { "on" } else { "off" };
    let (pre, meta) = plugins.preload("noop").await.unwrap();
    let input = "null";
    // Warm up: slots, caches, the allocator.
    for _ in 0..2_000 {
        let r = plugins.invoke_loaded(&pre, &meta, &ctx(), input).await;
        assert!(r.result.is_ok(), "{:?}", r.result);
    }

    let n = 20_000;
    let mut times = Vec::with_capacity(n);
    let started = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let r = plugins.invoke_loaded(&pre, &meta, &ctx(), input).await;
        times.push(t.elapsed());
        assert!(r.result.is_ok());
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    times.sort();
    println!(
        "| one task, sequential | {kib} KiB | {scan} | {:.1} µs | {:.1} µs | {rate:.0} |",
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );

    for callers in [2usize, 64] {
        let per = 40_000 / callers;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..callers {
            let plugins = plugins.clone();
            let pre = pre.clone();
            let meta = meta.clone();
            tasks.push(tokio::spawn(async move {
                let mut times = Vec::with_capacity(per);
                for _ in 0..per {
                    let t = Instant::now();
                    let r = plugins.invoke_loaded(&pre, &meta, &ctx(), "null").await;
                    times.push(t.elapsed());
                    assert!(r.result.is_ok());
                }
                times
            }));
        }
        let mut times = Vec::new();
        for t in tasks {
            times.extend(t.await.unwrap());
        }
        let rate = times.len() as f64 / started.elapsed().as_secs_f64();
        times.sort();
        println!(
            "| {callers} concurrent tasks on 2 worker threads | {kib} KiB | {scan} | {:.1} µs | {:.1} µs | {rate:.0} |",
            percentile(&times, 0.5),
            percentile(&times, 0.99)
        );
    }
}

async fn start_sink() -> std::net::SocketAddr {
    let app = axum::Router::new().fallback(|| async { "ok" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}
