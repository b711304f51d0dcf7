//! The recording sink: the gateway of every host. It holds each call for a seeded 20–300
//! ms, answers 200, and records when the call started and ended and the identity
//! headers kairos sent. Each host process gets a listener (a port) of its own, so that
//! each call is known to come from one process: the checker needs that to tell a re-run
//! after a crash from a stale run of a host that was stopped.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use serde::{Deserialize, Serialize};

use super::rng::{hash_str, mix};
use crate::now_ms;

/// One call the sink received.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Call {
    /// Order of arrival.
    pub seq: usize,
    /// The host process whose gateway port the call came in on (an instance label).
    pub via: String,
    pub start_ms: i64,
    /// When the sink answered (None while the call is held).
    pub end_ms: Option<i64>,
    /// The caller hung up before the answer (its process died or it timed out); the call
    /// still counts as in flight until `end_ms`.
    pub caller_gone: bool,
    pub delay_ms: i64,
    pub method: String,
    pub path: String,
    pub idempotency_key: Option<String>,
    pub life: Option<String>,
    pub plan: Option<String>,
    pub eta_ms: Option<i64>,
    pub execution_count: Option<u32>,
    pub resource: Option<String>,
    pub timer: Option<String>,
    pub queue: Option<String>,
    pub task: Option<String>,
}

impl Call {
    /// The end of the call, or `now` for one still held.
    pub fn end_or(&self, now: i64) -> i64 {
        self.end_ms.unwrap_or(now)
    }

    /// The Plan this call runs, as the checker keys Plans: the Idempotency-Key (a Life's
    /// `{uuid}:{plan}`, a task's `{queue}/{task}:task`, a timer slot's `{plan}@{ms}`).
    pub fn key(&self) -> String {
        self.idempotency_key
            .clone()
            .unwrap_or_else(|| format!("(no key) {} {}", self.method, self.path))
    }
}

struct Shared {
    seed: u64,
    calls: Mutex<Vec<Call>>,
}

/// The sink and everything it recorded.
#[derive(Clone)]
pub struct ChaosSink {
    shared: Arc<Shared>,
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

async fn handle(
    State((shared, via)): State<(Arc<Shared>, Arc<str>)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    _body: Bytes,
) -> (StatusCode, &'static str) {
    let start_ms = now_ms();
    let idempotency_key = header(&headers, "idempotency-key");
    let execution_count = header(&headers, "x-kairos-execution-count").and_then(|v| v.parse().ok());
    let eta_ms = header(&headers, "x-kairos-eta").and_then(|v| v.parse().ok());
    // The hold time depends on the seed and on which run this is, not on arrival order,
    // so one seed holds the same call for the same time.
    let identity = format!(
        "{}|{}|{}",
        idempotency_key.as_deref().unwrap_or(uri.path()),
        execution_count.unwrap_or(0),
        eta_ms.unwrap_or(0)
    );
    let delay_ms = 20 + (mix(shared.seed ^ hash_str(&identity)) % 281) as i64;
    let seq = {
        let mut calls = shared.calls.lock().unwrap();
        let seq = calls.len();
        calls.push(Call {
            seq,
            via: via.to_string(),
            start_ms,
            end_ms: None,
            caller_gone: false,
            delay_ms,
            method: method.to_string(),
            path: uri.path().to_string(),
            idempotency_key,
            life: header(&headers, "x-kairos-life"),
            plan: header(&headers, "x-kairos-plan"),
            eta_ms,
            execution_count,
            resource: header(&headers, "x-kairos-resource"),
            timer: header(&headers, "x-kairos-timer"),
            queue: header(&headers, "x-kairos-queue"),
            task: header(&headers, "x-kairos-task"),
        });
        seq
    };
    // The hold runs on a task of its own so that its end is recorded even when the caller
    // hangs up (a killed host): the guard below marks that, the task still ends the call.
    struct Gone(Arc<Shared>, usize, bool);
    impl Drop for Gone {
        fn drop(&mut self) {
            if !self.2 {
                self.0.calls.lock().unwrap()[self.1].caller_gone = true;
            }
        }
    }
    let mut gone = Gone(shared.clone(), seq, false);
    let holder = shared.clone();
    let hold = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(delay_ms as u64)).await;
        holder.calls.lock().unwrap()[seq].end_ms = Some(now_ms());
    });
    let _ = hold.await;
    gone.2 = true;
    (StatusCode::OK, "ok")
}

impl ChaosSink {
    pub fn new(seed: u64) -> ChaosSink {
        ChaosSink {
            shared: Arc::new(Shared {
                seed,
                calls: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Opens a listener for the host process `via` and returns its base URL (the
    /// host's `--gateway-url`). Listeners stay open until the runtime ends, so a call of
    /// a process that is gone still gets its answer.
    pub async fn open(&self, via: &str) -> String {
        let app = axum::Router::new()
            .fallback(handle)
            .with_state((self.shared.clone(), Arc::<str>::from(via)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the sink");
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        format!("http://{addr}")
    }

    pub fn calls(&self) -> Vec<Call> {
        self.shared.calls.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.shared.calls.lock().unwrap().len()
    }

    /// The calls held right now that came through `via`'s gateway (any host's if None),
    /// newest first.
    pub fn held_via(&self, via: Option<&str>) -> Vec<Call> {
        self.shared
            .calls
            .lock()
            .unwrap()
            .iter()
            .rev()
            .take(2_000)
            .filter(|c| c.end_ms.is_none() && via.is_none_or(|v| c.via == v))
            .cloned()
            .collect()
    }

    /// Calls being held right now.
    pub fn in_flight(&self) -> usize {
        self.shared
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.end_ms.is_none())
            .count()
    }
}
