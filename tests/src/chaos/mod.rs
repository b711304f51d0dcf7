//! The chaos suite: three kairos hosts on one redis-server (`appendfsync always`) under a
//! steady booking load, faults on a seeded schedule (kill -9, SIGTERM, SIGSTOP longer
//! than the lease, redis-server killed and restarted), a recording sink, and a checker
//! that counts every way the run broke the contract (`check.rs`).
//!
//! `run` is the whole suite; the `kairos-chaos` binary and `tests/chaos.rs` call it.
//! Everything is real and on loopback: redis-server, kairos processes, HTTP.

pub mod check;
pub mod cluster;
pub mod load;
pub mod rng;
pub mod sink;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{fast_flags, kairos_bin, now_ms, TempDir};
use check::{Observed, Report};
use cluster::Cluster;
use rng::Rng;
use sink::ChaosSink;

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL a host, restart it 1–5 s later (same host id or a new one, seeded).
    Kill9,
    /// SIGTERM a host (it hands its Plans back), restart it 0.5–2 s after it exited.
    Term,
    /// SIGSTOP a host for its lease + 2–5 s, then SIGCONT.
    Stop,
    /// SIGKILL redis-server, restart it on the same port and append-only file 0.5–3 s later.
    Redis,
}

impl FaultKind {
    pub const ALL: [FaultKind; 4] = [
        FaultKind::Kill9,
        FaultKind::Term,
        FaultKind::Stop,
        FaultKind::Redis,
    ];

    pub fn parse(word: &str) -> Result<FaultKind, String> {
        match word.trim() {
            "kill9" => Ok(FaultKind::Kill9),
            "term" => Ok(FaultKind::Term),
            "stop" => Ok(FaultKind::Stop),
            "redis" => Ok(FaultKind::Redis),
            other => Err(format!(
                "unknown fault `{other}`: give kill9, term, stop or redis"
            )),
        }
    }
}

/// The suite's settings (the binary's flags).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChaosConfig {
    /// How long the load books (ms).
    pub duration_ms: u64,
    pub seed: u64,
    pub hosts: usize,
    /// `--lease-ttl` for the hosts; None leaves the host's default, whose takeover time
    /// is what the suite measures.
    pub lease_ms: Option<u64>,
    /// Mean time between faults (ms).
    pub fault_every_ms: u64,
    pub faults: Vec<FaultKind>,
    /// The bound on lateness after a kill -9 (ms).
    pub takeover_ms: i64,
    /// Where to write the JSON report.
    pub report: Option<PathBuf>,
    /// Keep the data directory (host logs, Redis files, raw calls and bookings).
    pub keep: bool,
    /// How far past the end of the load a booking may be due (ms).
    pub tail_ms: u64,
    /// Longest wait after the load for Plans to be delivered (ms); None: until every
    /// Plan is due plus a lease plus the takeover time.
    pub drain_max_ms: Option<u64>,
    /// Resources the resource-bound Lives are booked on.
    pub resources: usize,
    /// More `kairos serve` flags (e.g. `--workers 16`), after the suite's own.
    pub host_flags: Vec<String>,
}

impl Default for ChaosConfig {
    fn default() -> Self {
        ChaosConfig {
            duration_ms: 60_000,
            seed: 1,
            hosts: 3,
            lease_ms: None,
            fault_every_ms: 15_000,
            faults: FaultKind::ALL.to_vec(),
            takeover_ms: 6_000,
            report: None,
            keep: false,
            tail_ms: 15_000,
            drain_max_ms: None,
            resources: 6,
            host_flags: Vec::new(),
        }
    }
}

/// Reads a duration the way kairos does: a number of ms, or `500ms`, `30s`, `3m`, `1h`.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let t = text.trim();
    let (num, unit) = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| t.split_at(i))
        .unwrap_or((t, "ms"));
    let n: f64 = num.parse().ok()?;
    let factor = match unit.trim() {
        "ms" | "" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return None,
    };
    Some((n * factor).round() as u64)
}

/// The default of a `kairos serve` flag as its `--help` states it (`[default: 30s]`).
pub fn host_default(bin: &std::path::Path, flag: &str) -> Option<String> {
    let out = Command::new(bin).args(["serve", "--help"]).output().ok()?;
    let help = String::from_utf8_lossy(&out.stdout);
    let mut lines = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(flag));
    lines.next()?;
    let text: String = lines
        .take_while(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ");
    let at = text.find("[default: ")? + "[default: ".len();
    let end = text[at..].find(']')?;
    Some(text[at..at + end].to_string())
}

/// The flags every host gets: the short guards of `fast_flags()` (bookings a few seconds
/// ahead, a 1 s resource guard) without its short lease, unless one is asked for.
fn host_flags(cfg: &ChaosConfig) -> Vec<String> {
    let mut flags = Vec::new();
    let base = fast_flags();
    let mut i = 0;
    while i + 1 < base.len() {
        if base[i] != "--lease-ttl" {
            flags.push(base[i].clone());
            flags.push(base[i + 1].clone());
        }
        i += 2;
    }
    if let Some(lease) = cfg.lease_ms {
        flags.push("--lease-ttl".into());
        flags.push(format!("{lease}ms"));
    }
    flags.extend(cfg.host_flags.iter().cloned());
    flags
}

/// The `--execution-delay-guard-time` the hosts run with.
fn resource_guard_ms(flags: &[String]) -> i64 {
    flags
        .iter()
        .position(|f| f == "--execution-delay-guard-time")
        .and_then(|i| flags.get(i + 1))
        .and_then(|v| parse_duration_ms(v))
        .unwrap_or(1_000) as i64
}

/// Reads a GET through any host that is up; None for a 404, Err when no host answered.
async fn read(cluster: &Cluster, path: &str) -> Result<Option<Value>, String> {
    let mut last = String::from("no host up");
    for attempt in 0..20 {
        let live = cluster.live_apis();
        if let Some((_, api)) = live.get(attempt % live.len().max(1)) {
            match api
                .try_raw(Method::GET, path, Vec::new(), Duration::from_secs(3))
                .await
            {
                Ok((200, v)) => return Ok(Some(v)),
                Ok((404, _)) => return Ok(None),
                Ok((s, v)) => last = format!("{s} {v}"),
                Err(e) => last = e,
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last)
}

/// The fault schedule: kinds in a seeded shuffled cycle (so a short run still has every
/// kind), gaps drawn around `fault_every`, one fault at a time, none started that would
/// last past the load's end by more than a few seconds.
async fn fault_schedule(
    cluster: Arc<Cluster>,
    cfg: ChaosConfig,
    until_ms: i64,
    mut rng: Rng,
) -> usize {
    if cfg.faults.is_empty() {
        return 0;
    }
    let mut order = cfg.faults.clone();
    rng.shuffle(&mut order);
    // The longest fault first, so that a short run still has room for every kind.
    if let Some(i) = order.iter().position(|k| *k == FaultKind::Stop) {
        order.swap(0, i);
    }
    let mean = cfg.fault_every_ms as i64;
    let mut done = 0;
    let mut next = 0usize;
    // The first fault comes after the load has settled a little.
    tokio::time::sleep(Duration::from_millis(rng.range(mean / 3, mean) as u64)).await;
    for _ in 0..10_000 {
        let now = now_ms();
        if now >= until_ms {
            break;
        }
        let kind = order[next % order.len()];
        let longest = match kind {
            FaultKind::Stop => cluster.lease_ms + 5_000,
            FaultKind::Kill9 => 8_000,
            FaultKind::Term => 8_000,
            FaultKind::Redis => 4_000,
        };
        if now + longest <= until_ms + 5_000 {
            next += 1;
            if cluster.inject(kind, &mut rng).await.is_some() {
                done += 1;
            }
        } else if order.iter().all(|k| *k == FaultKind::Stop) {
            break;
        } else {
            // Too long for the time left: the next kind in the cycle.
            next += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let gap = rng.range(mean / 2, mean * 3 / 2).max(500);
        tokio::time::sleep(Duration::from_millis(gap as u64)).await;
    }
    done
}

/// Every state whose count in the shards' `census` hashes differs from the number of
/// Lives in that state (each Life record's own `state`), read once no host runs: the
/// census is what `/metrics` and the dashboard show, changed by every script that
/// changes a Life, faults or not.
async fn census_mismatches(cluster: &Cluster) -> Vec<String> {
    let redis = cluster.redis.lock().unwrap().url();
    let client = redis::Client::open(redis.as_str()).expect("a Redis URL");
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return vec!["cannot connect to Redis to read the census".into()];
    };
    async fn keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await
                .unwrap_or_default();
            out.extend(batch);
            if next == 0 {
                return out;
            }
            cursor = next;
        }
    }
    // Layout 4: each Life is a record, a field of one of its shard's buckets `r:{n}`.
    let mut lives: HashMap<String, i64> = HashMap::new();
    for key in keys(&mut conn, "kairos:{*}:r:*").await {
        let records: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for text in records.values() {
            let state = kairos::store::record::LifeRecord::from_json(text)
                .map(|r| r.state)
                .unwrap_or_else(|e| format!("unreadable record: {e}"));
            *lives.entry(state).or_default() += 1;
        }
    }
    let mut census: HashMap<String, i64> = HashMap::new();
    for key in keys(&mut conn, "kairos:{*}:census").await {
        let counts: HashMap<String, i64> = redis::cmd("HGETALL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        for (state, n) in counts {
            if state != "v" {
                *census.entry(state).or_default() += n;
            }
        }
    }
    if lives.is_empty() {
        // The load always books Lives: none found means the keys were not where looked.
        return vec!["no Lives found under kairos:{*}:r:* to count".into()];
    }
    let mut states: Vec<&String> = lives.keys().chain(census.keys()).collect();
    states.sort();
    states.dedup();
    states
        .into_iter()
        .filter_map(|s| {
            let (c, l) = (
                census.get(s).copied().unwrap_or(0),
                lives.get(s).copied().unwrap_or(0),
            );
            (c != l).then(|| format!("{s}: census {c}, Lives {l}"))
        })
        .collect()
}

/// Runs the suite: start, load with faults, drain, read the final state, check.
pub async fn run(cfg: &ChaosConfig) -> Report {
    let root = Rng::new(cfg.seed);
    let dir = TempDir::new("chaos");
    let original = kairos_bin();
    let bin = dir.0.join("kairos");
    std::fs::copy(&original, &bin)
        .unwrap_or_else(|e| panic!("copying {}: {e}", original.display()));
    let binary = binary_identity(&original, &bin);
    eprintln!("chaos: kairos {binary}");
    let lease_ms = cfg
        .lease_ms
        .or_else(|| host_default(&bin, "--lease-ttl").and_then(|d| parse_duration_ms(&d)))
        .unwrap_or(30_000) as i64;
    let birth_delay_limit_ms = host_default(&bin, "--birth-delay-limit-time")
        .and_then(|d| parse_duration_ms(&d))
        .unwrap_or(180_000) as i64;
    let flags = host_flags(cfg);
    eprintln!(
        "chaos: seed {} hosts {} lease {} ms{} faults {:?} every ~{} ms, load {} ms, data {}",
        cfg.seed,
        cfg.hosts,
        lease_ms,
        if cfg.lease_ms.is_some() {
            ""
        } else {
            " (host default)"
        },
        cfg.faults,
        cfg.fault_every_ms,
        cfg.duration_ms,
        dir.0.display()
    );
    let sink = ChaosSink::new(cfg.seed);
    let cluster = Cluster::start(
        bin.clone(),
        cfg.hosts,
        flags.clone(),
        sink.clone(),
        dir.0.clone(),
        lease_ms,
    )
    .await;
    let first = cluster.live_apis()[0].1.clone();
    if let Err(e) = load::setup(&first).await {
        panic!("setting up queues and timers: {e}");
    }

    let start_ms = now_ms();
    cluster.epoch_ms.store(start_ms, Ordering::Relaxed);
    let until_ms = start_ms + cfg.duration_ms as i64;
    let watching = Arc::new(AtomicBool::new(true));
    let watchdog = {
        let (cluster, watching) = (cluster.clone(), watching.clone());
        tokio::spawn(async move {
            while watching.load(Ordering::Relaxed) {
                cluster.watch().await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let faults = tokio::spawn(fault_schedule(
        cluster.clone(),
        cfg.clone(),
        until_ms,
        root.fork(1),
    ));
    let plan = load::LoadPlan {
        run: format!("c{}", cfg.seed % 100_000),
        until_ms,
        latest_birth_ms: until_ms + cfg.tail_ms as i64,
        resource_guard_ms: resource_guard_ms(&flags),
        resources: cfg.resources.max(1),
    };
    let log: load::Log = Default::default();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn(sample_running(
        cluster.clone(),
        log.clone(),
        sampling.clone(),
        root.fork(3),
    ));
    let bookings = load::run(cluster.clone(), plan, &root.fork(2), log).await;
    let load_end_ms = now_ms();
    let n_faults = faults.await.unwrap_or(0);
    eprintln!(
        "chaos: load done at +{} ms: {} bookings, {} faults; draining",
        load_end_ms - start_ms,
        bookings.len(),
        n_faults
    );

    // Drain: until every Plan is due and delivered and every Life finished, or until the
    // last Plan is due plus a lease and the takeover time (a Plan held by the last killed
    // host may wait that long), whichever comes first.
    let last_due = bookings
        .iter()
        .filter(|b| b.acked())
        .flat_map(|b| b.plan_keys().into_iter().map(|(_, _, due)| due))
        .max()
        .unwrap_or(load_end_ms);
    let last_fault_end = cluster
        .journal
        .lock()
        .unwrap()
        .faults
        .iter()
        .map(|f| f.end_ms)
        .max()
        .unwrap_or(start_ms);
    let mut deadline = last_due.max(last_fault_end) + lease_ms + cfg.takeover_ms + 10_000;
    if let Some(max) = cfg.drain_max_ms {
        deadline = deadline.min(load_end_ms + max as i64);
    }
    let expected: Vec<String> = bookings
        .iter()
        .filter(|b| b.acked())
        .flat_map(|b| b.plan_keys().into_iter().map(|(k, _, _)| k))
        .collect();
    let mut next_state_poll = 0;
    for _ in 0..100_000 {
        let now = now_ms();
        if now >= deadline {
            break;
        }
        if now >= last_due + 2_000 && now >= next_state_poll && sink.in_flight() == 0 {
            let seen: std::collections::HashSet<String> =
                sink.calls().iter().map(|c| c.key()).collect();
            if expected.iter().all(|k| seen.contains(k)) {
                next_state_poll = now + 5_000;
                if all_lives_final(&cluster, &bookings).await {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    watching.store(false, Ordering::Relaxed);
    sampling.store(false, Ordering::Relaxed);
    let _ = watchdog.await;
    let samples = sampler.await.unwrap_or_default();

    // The final state, through the API.
    let mut lives = HashMap::new();
    let mut tasks = HashMap::new();
    let seen: std::collections::HashSet<String> = sink.calls().iter().map(|c| c.key()).collect();
    for b in &bookings {
        match b.kind {
            load::Kind::Task => {
                if seen.contains(&b.plan_keys()[0].0) {
                    continue;
                }
                let (queue, task) = b.id.split_once('/').unwrap_or((&b.id, ""));
                if let Ok(v) = read(&cluster, &format!("/queues/{queue}/tasks/{task}")).await {
                    tasks.insert(b.id.clone(), v);
                }
            }
            _ => {
                if let Ok(v) = read(&cluster, &format!("/schedules/{}", b.id)).await {
                    lives.insert(b.id.clone(), v);
                }
            }
        }
    }
    let mut timer_runs = HashMap::new();
    for (name, _, _) in load::TIMERS {
        if let Ok(Some(v)) = read(&cluster, &format!("/timers/{name}/runs?limit=200")).await {
            timer_runs.insert(
                name.to_string(),
                v["items"].as_array().cloned().unwrap_or_default(),
            );
        }
    }
    let end_ms = now_ms();
    let in_flight_at_end = sink.in_flight();
    eprintln!(
        "chaos: final state read at +{:.1}s ({:.1}s after the load)",
        (end_ms - start_ms) as f64 / 1000.0,
        (end_ms - load_end_ms) as f64 / 1000.0
    );
    cluster.shutdown().await;
    let census_mismatches = census_mismatches(&cluster).await;

    let journal = std::mem::take(&mut *cluster.journal.lock().unwrap());
    let observed = Observed {
        bookings,
        calls: sink.calls(),
        faults: journal.faults,
        instances: journal.instances,
        anomalies: journal.anomalies,
        lives,
        tasks,
        timers: load::TIMERS
            .iter()
            .map(|(name, _, period)| (name.to_string(), *period))
            .collect(),
        timer_runs,
        start_ms,
        load_end_ms,
        end_ms,
        takeover_ms: cfg.takeover_ms,
        lease_ms,
        birth_delay_limit_ms,
        in_flight_at_end,
        samples,
        kairos: binary.clone(),
        census_mismatches,
    };
    let report = check::check_all(&observed);
    let json = serde_json::json!({
        "config": cfg,
        "lease_ms": lease_ms,
        "kairos": binary,
        "start_ms": start_ms,
        "load_end_ms": load_end_ms,
        "end_ms": end_ms,
        "report": report,
    });
    if let Some(path) = &cfg.report {
        if let Err(e) = std::fs::write(path, serde_json::to_vec_pretty(&json).unwrap()) {
            eprintln!("chaos: cannot write {}: {e}", path.display());
        }
    }
    if cfg.keep {
        let keep = |name: &str, v: Value| {
            let _ = std::fs::write(dir.0.join(name), serde_json::to_vec_pretty(&v).unwrap());
        };
        keep("report.json", json);
        keep(
            "observed.json",
            serde_json::to_value(&observed).unwrap_or(Value::Null),
        );
        let redis_dir = cluster.redis.lock().unwrap().dir.0.clone();
        let _ = Command::new("cp")
            .arg("-r")
            .arg(&redis_dir)
            .arg(dir.0.join("redis"))
            .status();
        let _ = std::fs::remove_file(&bin);
        eprintln!("chaos: kept {}", dir.0.display());
        std::mem::forget(dir);
    }
    report
}

/// Checks again what a run kept (`observed.json` of a `--keep` data directory), with
/// another takeover bound if given: for working on the checker, or a second look.
pub fn recheck(path: &std::path::Path, takeover_ms: Option<i64>) -> Result<Report, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut observed: Observed =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(t) = takeover_ms {
        observed.takeover_ms = t;
    }
    Ok(check::check_all(&observed))
}

/// Which kairos ran: the path given, its size and modification time, and a hash of the
/// copy the hosts ran.
fn binary_identity(original: &std::path::Path, copy: &std::path::Path) -> String {
    let meta = std::fs::metadata(copy).ok();
    let modified = std::fs::metadata(original)
        .and_then(|m| m.modified())
        .ok()
        .map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339())
        .unwrap_or_default();
    let sum = Command::new("sha256sum")
        .arg(copy)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .map(|h| h[..12.min(h.len())].to_string())
        })
        .unwrap_or_default();
    format!(
        "{} ({} bytes, modified {modified}, sha256 {sum}…)",
        original.display(),
        meta.map(|m| m.len()).unwrap_or(0)
    )
}

/// While the run goes on, every 2 s, reads up to 16 Lives due in the last 20 s (seeded
/// picks) and up to 16 of those it last saw with a Plan Running (followed until it is no
/// longer Running, so a Plan stuck Running is seen for as long as it is stuck), and keeps
/// every Plan it finds Running, with when and by whom: the checker holds each against
/// the calls in flight then.
async fn sample_running(
    cluster: Arc<Cluster>,
    log: load::Log,
    on: Arc<AtomicBool>,
    mut rng: Rng,
) -> Vec<check::Sample> {
    let mut samples = Vec::new();
    let mut followed: Vec<String> = Vec::new();
    for _ in 0..100_000 {
        if !on.load(Ordering::Relaxed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        let now = now_ms();
        let recent: Vec<String> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|b| b.kind != load::Kind::Task && b.acked())
            .filter(|b| {
                b.plan_keys()
                    .iter()
                    .any(|(_, _, due)| *due <= now && *due > now - 20_000)
            })
            .map(|b| b.id.clone())
            .collect();
        let mut picks: Vec<String> = std::mem::take(&mut followed);
        picks.truncate(16);
        for _ in 0..recent.len().min(16) {
            picks.push(rng.pick(&recent).clone());
        }
        picks.sort();
        picks.dedup();
        for id in picks {
            let at_ms = now_ms();
            let Ok(Some(life)) = read(&cluster, &format!("/schedules/{id}")).await else {
                continue;
            };
            for p in life["plans"].as_array().into_iter().flatten() {
                if p["state"] == "Running" {
                    if !followed.contains(&id) {
                        followed.push(id.clone());
                    }
                    samples.push(check::Sample {
                        at_ms,
                        read_ms: now_ms(),
                        key: format!("{id}:{}", p["kind"].as_str().unwrap_or("?")),
                        held_by: p["held_by"].as_str().unwrap_or("").to_string(),
                        attempts: p["attempts"].as_i64().unwrap_or(0),
                    });
                }
            }
        }
    }
    samples
}

/// Whether every Life booked has no Plan left to run or running.
async fn all_lives_final(cluster: &Cluster, bookings: &[load::Booking]) -> bool {
    for b in bookings.iter().filter(|b| b.kind != load::Kind::Task) {
        match read(cluster, &format!("/schedules/{}", b.id)).await {
            Ok(Some(life)) => {
                let busy =
                    life["plans"].as_array().into_iter().flatten().any(|p| {
                        matches!(p["state"].as_str(), Some("Standby" | "Preset" | "Running"))
                    });
                if busy {
                    return false;
                }
            }
            Ok(None) => {}
            Err(_) => return false,
        }
    }
    true
}
