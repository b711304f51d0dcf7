//! The processes under test: one redis-server (`appendfsync always`) and N kairos hosts,
//! each with a gateway port of its own on the sink, and the faults done to them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rng::Rng;
use super::sink::ChaosSink;
use super::FaultKind;
use crate::{now_ms, Api, Host, RedisServer};

/// One kairos process, from start to end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    /// `h{slot}.{n}`: the n-th process of host slot `slot`.
    pub label: String,
    pub slot: usize,
    pub host_id: String,
    pub api: String,
    pub gateway: String,
    pub started_ms: i64,
    pub ended_ms: Option<i64>,
    /// kill9 / term / exited (on its own) / shutdown (end of the run).
    pub end: Option<String>,
    /// The log, copied out of the process's temporary directory when it ended.
    pub log: Option<String>,
}

/// One fault, with the times the checker classifies by.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    pub kind: FaultKind,
    /// The host slot (None for redis).
    pub slot: Option<usize>,
    /// The process the fault was done to (None for redis).
    pub instance: Option<String>,
    pub host_id: Option<String>,
    /// When the fault was done (the signal sent, redis killed).
    pub start_ms: i64,
    /// When it was healed: the host restarted and listening, SIGCONT sent, redis
    /// answering again.
    pub end_ms: i64,
    /// The process that replaced the faulted one (kill9, term).
    pub replacement: Option<String>,
    /// Whether the replacement has the same `--host-id`.
    pub same_id: Option<bool>,
    /// term: when the process had exited (None if it had to be killed).
    pub exited_ms: Option<i64>,
    pub detail: String,
}

/// Something the harness saw that is a finding in itself (a host that exited on its own,
/// a host that would not start).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Anomaly {
    pub at_ms: i64,
    pub what: String,
}

#[derive(Default)]
pub struct Journal {
    pub instances: Vec<Instance>,
    pub faults: Vec<Fault>,
    pub anomalies: Vec<Anomaly>,
}

struct Slot {
    host: Option<Host>,
    label: String,
    /// Processes started in this slot so far.
    generation: u32,
    /// New host ids handed out in this slot so far.
    renames: u32,
}

/// Redis, the hosts, and the API addresses of the hosts that are up.
pub struct Cluster {
    /// The kairos binary every host runs (a copy taken at the start, so that a new build
    /// written over the original mid-run does not mix versions).
    pub bin: PathBuf,
    pub redis: Arc<Mutex<RedisServer>>,
    pub redis_url: String,
    pub sink: ChaosSink,
    flags: Vec<String>,
    host_data_dir: PathBuf,
    log_dir: PathBuf,
    slots: Vec<Arc<Mutex<Slot>>>,
    /// Per slot: the API of the host when it is up and not stopped.
    apis: RwLock<Vec<Option<(String, Api)>>>,
    pub journal: Mutex<Journal>,
    /// Held while the cluster changes (a fault, a restart by the watchdog): one at a time.
    ops: tokio::sync::Mutex<()>,
    pub lease_ms: i64,
    /// The start of the run (epoch ms), for log lines in seconds since then.
    pub epoch_ms: std::sync::atomic::AtomicI64,
}

fn slot_host_id(slot: usize, renames: u32) -> String {
    if renames == 0 {
        format!("chaos-h{slot}")
    } else {
        format!("chaos-h{slot}-r{renames}")
    }
}

impl Cluster {
    /// Starts redis-server and `hosts` kairos hosts with `flags` (each gets its own
    /// `--gateway-url` on the sink and `--host-id`).
    pub async fn start(
        bin: PathBuf,
        hosts: usize,
        flags: Vec<String>,
        sink: ChaosSink,
        data_dir: PathBuf,
        lease_ms: i64,
    ) -> Arc<Cluster> {
        let redis = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .expect("redis-server starts");
        let redis_url = redis.url();
        let host_data_dir = data_dir.join("kairos-data");
        let log_dir = data_dir.join("logs");
        std::fs::create_dir_all(&host_data_dir).unwrap();
        std::fs::create_dir_all(&log_dir).unwrap();
        let cluster = Arc::new(Cluster {
            bin,
            redis: Arc::new(Mutex::new(redis)),
            redis_url,
            sink,
            flags,
            host_data_dir,
            log_dir,
            slots: (0..hosts)
                .map(|_| {
                    Arc::new(Mutex::new(Slot {
                        host: None,
                        label: String::new(),
                        generation: 0,
                        renames: 0,
                    }))
                })
                .collect(),
            apis: RwLock::new(vec![None; hosts]),
            journal: Mutex::new(Journal::default()),
            ops: tokio::sync::Mutex::new(()),
            lease_ms,
            epoch_ms: std::sync::atomic::AtomicI64::new(now_ms()),
        });
        for slot in 0..hosts {
            cluster
                .launch(slot, true)
                .await
                .unwrap_or_else(|e| panic!("host {slot} does not start: {e}"));
        }
        cluster
    }

    pub fn hosts(&self) -> usize {
        self.slots.len()
    }

    /// The hosts that are up now, as (instance label, API).
    pub fn live_apis(&self) -> Vec<(String, Api)> {
        self.apis
            .read()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    fn set_api(&self, slot: usize, api: Option<(String, Api)>) {
        self.apis.write().unwrap()[slot] = api;
    }

    /// Starts a process in `slot`, under the slot's host id when `same_id`, else under a
    /// new one; returns its label.
    async fn launch(&self, slot: usize, same_id: bool) -> Result<String, String> {
        let (label, host_id) = {
            let mut s = self.slots[slot].lock().unwrap();
            s.generation += 1;
            if !same_id {
                s.renames += 1;
            }
            (
                format!("h{slot}.{}", s.generation),
                slot_host_id(slot, s.renames),
            )
        };
        let gateway = self.sink.open(&label).await;
        let mut args = self.flags.clone();
        args.extend(["--gateway-url".to_string(), gateway.clone()]);
        let redis_url = self.redis_url.clone();
        let data_dir = self.host_data_dir.clone();
        let id = host_id.clone();
        let bin = self.bin.clone();
        let started = tokio::task::spawn_blocking(move || {
            std::panic::catch_unwind(|| {
                Host::start_as(&bin, &redis_url, &args, &[], &data_dir, &id)
            })
        })
        .await
        .map_err(|e| e.to_string())?;
        let host = match started {
            Ok(h) => h,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                let what = format!("host {label} ({host_id}) did not start: {why}");
                self.anomaly(what.clone());
                return Err(what);
            }
        };
        let api = Api::new(&host);
        self.journal.lock().unwrap().instances.push(Instance {
            label: label.clone(),
            slot,
            host_id,
            api: api.base_url().to_string(),
            gateway,
            started_ms: now_ms(),
            ended_ms: None,
            end: None,
            log: None,
        });
        {
            let mut s = self.slots[slot].lock().unwrap();
            s.host = Some(host);
            s.label = label.clone();
        }
        self.set_api(slot, Some((label.clone(), api)));
        Ok(label)
    }

    fn anomaly(&self, what: String) {
        eprintln!("chaos: ANOMALY {what}");
        self.journal.lock().unwrap().anomalies.push(Anomaly {
            at_ms: now_ms(),
            what,
        });
    }

    /// Takes the host out of `slot` (its API is marked down first).
    fn take(&self, slot: usize) -> Option<(String, Host)> {
        self.set_api(slot, None);
        let mut s = self.slots[slot].lock().unwrap();
        s.host.take().map(|h| (s.label.clone(), h))
    }

    /// Records the end of a process and keeps its log.
    fn ended(&self, label: &str, host: &Host, how: &str, at_ms: i64) {
        let log = self.log_dir.join(format!("{label}.log"));
        let kept = std::fs::copy(&host.log, &log).is_ok();
        let mut j = self.journal.lock().unwrap();
        if let Some(i) = j.instances.iter_mut().find(|i| i.label == label) {
            i.ended_ms = Some(at_ms);
            i.end = Some(how.to_string());
            i.log = kept.then(|| log.display().to_string());
        }
    }

    /// Does one fault of `kind` to a host chosen by `rng` (or to Redis) and heals it;
    /// returns when it is healed.
    pub async fn inject(&self, kind: FaultKind, rng: &mut Rng) -> Option<Fault> {
        let _ops = self.ops.lock().await;
        let slot = rng.range(0, self.slots.len() as i64 - 1) as usize;
        // Most faults are aimed at a moment when the target has a call in flight (a
        // resource-bound one if one comes within 1.5 s): that is where at-least-once,
        // fencing and resource order are tested; the rest land wherever they fall.
        let aimed = if rng.chance(0.75) {
            let via = match kind {
                FaultKind::Redis => None,
                _ => Some(self.slots[slot].lock().unwrap().label.clone()),
            };
            self.aim(via.as_deref()).await
        } else {
            None
        };
        let mut fault = self.inject_at(kind, slot, rng).await?;
        if let Some(key) = aimed {
            fault.detail = format!("{}; aimed: {key} in flight", fault.detail);
        }
        eprintln!(
            "chaos: fault {:?} {} at +{:.1}s for {} ms: {}",
            fault.kind,
            fault.instance.as_deref().unwrap_or("redis"),
            (fault.start_ms - self.epoch_ms.load(std::sync::atomic::Ordering::Relaxed)) as f64
                / 1000.0,
            fault.end_ms - fault.start_ms,
            fault.detail
        );
        self.journal.lock().unwrap().faults.push(fault.clone());
        Some(fault)
    }

    /// Waits (at most 3 s) for a call in flight through `via` (any host if None),
    /// preferring a resource-bound one for the first 1.5 s; returns its key.
    async fn aim(&self, via: Option<&str>) -> Option<String> {
        let from = now_ms();
        for _ in 0..1_000 {
            let waited = now_ms() - from;
            if waited > 3_000 {
                return None;
            }
            let held = self.sink.held_via(via);
            let pick = held.iter().find(|c| c.resource.is_some()).or_else(|| {
                if waited > 1_500 {
                    held.first()
                } else {
                    None
                }
            });
            if let Some(c) = pick {
                return Some(c.key());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    async fn inject_at(&self, kind: FaultKind, slot: usize, rng: &mut Rng) -> Option<Fault> {
        let fault = match kind {
            FaultKind::Kill9 | FaultKind::Term => {
                let (label, mut host) = self.take(slot)?;
                let host_id = host.host_id.clone();
                let start_ms = now_ms();
                let (host, exited_ms, detail) = if kind == FaultKind::Kill9 {
                    let host = tokio::task::spawn_blocking(move || {
                        host.kill9();
                        host
                    })
                    .await
                    .ok()?;
                    (host, None, String::new())
                } else {
                    let (host, in_time) = tokio::task::spawn_blocking(move || {
                        let ok = host.terminate(Duration::from_secs(60));
                        (host, ok)
                    })
                    .await
                    .ok()?;
                    let t = now_ms();
                    if !in_time {
                        self.anomaly(format!(
                            "{label} ({host_id}) did not exit within 60 s of SIGTERM; killed"
                        ));
                    }
                    let detail = format!(
                        "exited {} ms after SIGTERM{}",
                        t - start_ms,
                        if in_time { "" } else { " (killed after 60 s)" }
                    );
                    (host, in_time.then_some(t), detail)
                };
                let end_word = if kind == FaultKind::Kill9 {
                    "kill9"
                } else {
                    "term"
                };
                self.ended(&label, &host, end_word, exited_ms.unwrap_or(start_ms));
                drop(host);
                let down_ms = if kind == FaultKind::Kill9 {
                    rng.range(1_000, 5_000)
                } else {
                    rng.range(500, 2_000)
                };
                let same_id = rng.chance(0.5);
                tokio::time::sleep(Duration::from_millis(down_ms as u64)).await;
                let replacement = self.launch(slot, same_id).await.ok();
                Fault {
                    kind,
                    slot: Some(slot),
                    instance: Some(label),
                    host_id: Some(host_id),
                    start_ms,
                    end_ms: now_ms(),
                    replacement,
                    same_id: Some(same_id),
                    exited_ms,
                    detail: format!(
                        "{detail}{}down {down_ms} ms, back with {} id",
                        if detail.is_empty() { "" } else { "; " },
                        if same_id { "the same" } else { "a new" }
                    ),
                }
            }
            FaultKind::Stop => {
                let stop_ms = self.lease_ms + rng.range(2_000, 5_000);
                let (label, host_id, stopped) = {
                    let s = self.slots[slot].lock().unwrap();
                    let host = s.host.as_ref()?;
                    (s.label.clone(), host.host_id.clone(), host.signal("STOP"))
                };
                let api = self.apis.read().unwrap()[slot].clone();
                self.set_api(slot, None);
                let start_ms = now_ms();
                if !stopped {
                    self.anomaly(format!("SIGSTOP to {label} was not delivered"));
                }
                tokio::time::sleep(Duration::from_millis(stop_ms as u64)).await;
                let resumed = {
                    let s = self.slots[slot].lock().unwrap();
                    s.host.as_ref().map(|h| h.signal("CONT")).unwrap_or(false)
                };
                let end_ms = now_ms();
                if resumed {
                    self.set_api(slot, api);
                } else {
                    self.anomaly(format!("SIGCONT to {label} was not delivered"));
                }
                Fault {
                    kind,
                    slot: Some(slot),
                    instance: Some(label),
                    host_id: Some(host_id),
                    start_ms,
                    end_ms,
                    replacement: None,
                    same_id: None,
                    exited_ms: None,
                    detail: format!("stopped {stop_ms} ms (lease {} ms)", self.lease_ms),
                }
            }
            FaultKind::Redis => {
                let down_ms = rng.range(500, 3_000);
                let redis = self.redis.clone();
                let start_ms = now_ms();
                tokio::task::spawn_blocking(move || redis.lock().unwrap().kill_hard())
                    .await
                    .ok()?;
                let killed_ms = now_ms();
                tokio::time::sleep(Duration::from_millis(down_ms as u64)).await;
                let redis = self.redis.clone();
                let back = tokio::task::spawn_blocking(move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        redis.lock().unwrap().start_again()
                    }))
                    .is_ok()
                })
                .await
                .unwrap_or(false);
                if !back {
                    self.anomaly("redis-server did not come back".into());
                }
                Fault {
                    kind,
                    slot: None,
                    instance: None,
                    host_id: None,
                    start_ms,
                    end_ms: now_ms(),
                    replacement: None,
                    same_id: None,
                    exited_ms: None,
                    detail: format!(
                        "killed in {} ms, down {down_ms} ms, AOF replayed",
                        killed_ms - start_ms
                    ),
                }
            }
        };
        Some(fault)
    }

    /// Restarts (same id) any host that exited on its own, recording it as an anomaly.
    pub async fn watch(&self) {
        let _ops = self.ops.lock().await;
        for slot in 0..self.slots.len() {
            let gone = {
                let mut s = self.slots[slot].lock().unwrap();
                let status = s.host.as_mut().and_then(Host::exited);
                status.map(|st| (s.label.clone(), st))
            };
            let Some((label, status)) = gone else {
                continue;
            };
            if let Some((_, host)) = self.take(slot) {
                let tail: String = {
                    let text = host.log_text();
                    let lines: Vec<&str> = text.lines().rev().take(5).collect();
                    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
                };
                self.anomaly(format!(
                    "{label} ({}) exited on its own ({status}); log tail: {tail}",
                    host.host_id
                ));
                self.ended(&label, &host, "exited", now_ms());
            }
            let _ = self.launch(slot, true).await;
        }
    }

    /// Whether a host in `slot` is running now (not killed, maybe stopped).
    pub fn slot_labels(&self) -> Vec<String> {
        self.slots
            .iter()
            .map(|s| s.lock().unwrap().label.clone())
            .collect()
    }

    /// Stops every host (SIGKILL, after SIGCONT in case one is stopped) and keeps their logs.
    pub async fn shutdown(&self) {
        let _ops = self.ops.lock().await;
        for slot in 0..self.slots.len() {
            if let Some((label, mut host)) = self.take(slot) {
                host.signal("CONT");
                let host = tokio::task::spawn_blocking(move || {
                    host.kill9();
                    host
                })
                .await
                .ok();
                if let Some(host) = host {
                    self.ended(&label, &host, "shutdown", now_ms());
                }
            }
        }
    }
}
