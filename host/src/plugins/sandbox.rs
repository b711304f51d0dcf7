//! What one plugin invocation can touch: the store's data, the host side of the
//! `kairos:plugin` interfaces, and the outbound HTTP hook.
//!
//! A fresh [`Sandbox`] is made for every invocation. Its WASI context has no preopened
//! directory, no environment, no arguments and no sockets; standard output and error go
//! into the run's log buffer; outgoing HTTP goes through [`Outbound`], which applies the
//! plugin's `allowed_hosts` and the host's outbound policy before a pooled keep-alive
//! client sends it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper_util::client::legacy::Client;
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use super::bindings::kairos::plugin0_1_0::{schedule, types};
use crate::actions::Fence;
use crate::bookings::Bookings;
use crate::config::AllowedHost;
use crate::outbound::{host_port, OutboundPolicy};

/// Log lines kept per run, and bytes of them.
pub const MAX_LOG_LINES: usize = 64;
pub const MAX_LOG_BYTES: usize = 16 * 1024;
/// Follow-up bookings one run may make.
pub const MAX_BOOKINGS_PER_RUN: u32 = 16;
/// Follow-up bookings all runs of one plugin may make in one second, on all hosts
/// together. With 16 a run alone, a plugin that books itself grows exponentially (one
/// booking became 13,900 Lives in 8 s); this makes it linear, like a REST client.
pub const MAX_PLUGIN_BOOKINGS_PER_SECOND: u64 = 100;
/// Outgoing requests one run may have open at once (sent and not yet answered, or
/// answered with a body the plugin still holds); further ones wait for a place, within
/// the run's deadline. Without it one run could open a connection per request it starts
/// and exhaust the host's file descriptors.
pub const MAX_REQUESTS_IN_FLIGHT: usize = 8;

/// The body type wasi-http hands to the hook.
pub type WasiBody = wasmtime_wasi_http::WasiBody;
/// The pooled client plugins send through.
pub type PluginClient = Client<crate::actions::webhook::PolicyConnector, WasiBody>;

/// A run's log lines, shared by the log interface, stdout/stderr and the HTTP hook.
#[derive(Clone, Default)]
pub struct LogSink(Arc<Mutex<LogBuffer>>);

#[derive(Default)]
struct LogBuffer {
    lines: Vec<String>,
    bytes: usize,
    dropped: usize,
    /// Unfinished stdout/stderr line.
    partial: [Vec<u8>; 2],
}

impl LogSink {
    pub fn push(&self, line: String) {
        let mut b = self.0.lock().expect("log buffer");
        if b.lines.len() >= MAX_LOG_LINES || b.bytes + line.len() > MAX_LOG_BYTES {
            b.dropped += 1;
            return;
        }
        b.bytes += line.len();
        b.lines.push(line);
    }

    fn write_stream(&self, which: usize, data: &[u8]) {
        let mut complete = Vec::new();
        {
            let mut b = self.0.lock().expect("log buffer");
            let partial = &mut b.partial[which];
            partial.extend_from_slice(data);
            while let Some(i) = partial.iter().position(|c| *c == b'\n') {
                let line: Vec<u8> = partial.drain(..=i).collect();
                complete.push(line);
            }
            if partial.len() > MAX_LOG_BYTES {
                partial.truncate(MAX_LOG_BYTES);
            }
        }
        let name = ["stdout", "stderr"][which];
        for line in complete {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            if !text.is_empty() {
                self.push(format!("{name}: {text}"));
            }
        }
    }

    /// The lines, with unfinished output flushed and a note of what was dropped.
    pub fn take(&self) -> Vec<String> {
        let partial: Vec<(usize, Vec<u8>)> = {
            let mut b = self.0.lock().expect("log buffer");
            (0..2)
                .map(|i| (i, std::mem::take(&mut b.partial[i])))
                .filter(|(_, p)| !p.is_empty())
                .collect()
        };
        for (which, mut rest) in partial {
            rest.push(b'\n');
            self.write_stream(which, &rest);
        }
        let mut b = self.0.lock().expect("log buffer");
        let mut lines = std::mem::take(&mut b.lines);
        if b.dropped > 0 {
            lines.push(format!("({} more log lines dropped)", b.dropped));
        }
        lines
    }
}

/// Standard output or error of the guest, captured into the log sink. Writes always
/// succeed (what is over the cap is dropped), so that a chatty plugin does not fail on
/// a full pipe.
struct Capture {
    sink: LogSink,
    which: usize,
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(CaptureWriter {
            sink: self.sink.clone(),
            which: self.which,
        })
    }
}

struct CaptureWriter {
    sink: LogSink,
    which: usize,
}

impl tokio::io::AsyncWrite for CaptureWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.sink.write_stream(self.which, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The outbound HTTP hook of one invocation.
pub struct Outbound {
    pub policy: Arc<OutboundPolicy>,
    /// The plugin's own `allowed_hosts`; empty allows nothing.
    pub allowed: Arc<Vec<AllowedHost>>,
    pub client: PluginClient,
    /// The client for targets granted only through `*` (public addresses only).
    pub public_client: PluginClient,
    pub response_limit: usize,
    pub request_timeout: Duration,
    pub logs: LogSink,
    /// [`MAX_REQUESTS_IN_FLIGHT`] places, one per open request of this run.
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// Log every request with its answer, not only refusals (`kairos plugins run`).
    pub trace: bool,
    /// Asked just before each request goes out; one it refuses sets `fenced`.
    pub fence: Fence,
    pub fenced: Arc<AtomicBool>,
}

impl Outbound {
    /// The places for a new run's requests.
    pub fn in_flight_places() -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS_IN_FLIGHT))
    }
}

/// What a plugin's own `allowed_hosts` says of a target.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Grant {
    /// Not listed.
    Refused,
    /// Listed by name (and port).
    Named,
    /// Only through `*`: public addresses only.
    AnyPublic,
}

fn plugin_allows(allowed: &[AllowedHost], uri: &http::Uri) -> Grant {
    let Some((host, port)) = host_port(uri) else {
        return Grant::Refused;
    };
    let named = allowed.iter().any(|entry| match entry {
        AllowedHost::AnyPublic => false,
        AllowedHost::Host { host: h, port: p } => *h == host && p.is_none_or(|p| p == port),
    });
    if named {
        Grant::Named
    } else if allowed.contains(&AllowedHost::AnyPublic) {
        Grant::AnyPublic
    } else {
        Grant::Refused
    }
}

type ResponseFuture = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                http::Response<WasiBody>,
                Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl WasiHttpHooks for Outbound {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> ResponseFuture {
        let policy = self.policy.clone();
        let allowed = self.allowed.clone();
        let client = self.client.clone();
        let public_client = self.public_client.clone();
        let limit = self.response_limit;
        let timeout = self.request_timeout;
        let logs = self.logs.clone();
        let trace = self.trace;
        let fence = self.fence.clone();
        let fenced = self.fenced.clone();
        // A request takes its place in the order the plugin made it: the place is asked
        // for here, while the guest's call is still on the stack, not when the spawned
        // future first runs (tasks start in any order). Places are held until a response
        // body is dropped, so a plugin that waits for its requests in the order it made
        // them (the common way) never waits on a later request that took the place of an
        // earlier one.
        let mut place = Box::pin(self.in_flight.clone().acquire_owned());
        let early = place
            .as_mut()
            .poll(&mut Context::from_waker(std::task::Waker::noop()));
        Box::new(async move {
            use wasmtime_wasi_http::Error;
            let uri = request.uri().clone();
            let method = request.method().clone();
            let grant = plugin_allows(&allowed, &uri);
            // The policy's DNS lookup counts against the request's time too.
            let deadline = tokio::time::Instant::now() + timeout;
            let checked = tokio::time::timeout_at(deadline, async {
                match grant {
                    Grant::Refused => Some(format!(
                        "outbound policy: {uri} is not in this plugin's allowed_hosts ({})",
                        policy.knobs().plugin_list()
                    )),
                    Grant::Named => policy.check(&uri).await.err(),
                    Grant::AnyPublic => policy.check_public(&uri).await.err(),
                }
            })
            .await;
            let Ok(refusal) = checked else {
                return Err(Error::HttpResponseTimeout);
            };
            let client = if grant == Grant::AnyPublic {
                public_client
            } else {
                client
            };
            if let Some(refusal) = refusal {
                logs.push(format!("denied: {refusal}"));
                return Err(Error::HttpRequestDenied);
            }
            // Held until the response body is dropped (or the request fails).
            let permit = match early {
                Poll::Ready(permit) => permit,
                Poll::Pending => place.await,
            }
            .expect("the in-flight semaphore is never closed");
            let failed = |why: &str| {
                if trace {
                    logs.push(format!("allowed: {method} {uri} failed: {why}"));
                }
            };
            if !fence.holds() {
                fenced.store(true, Ordering::Release);
                logs.push(format!(
                    "denied: {method} {uri}: this host's lease lapsed; another host runs the Plan"
                ));
                return Err(Error::HttpRequestDenied);
            }
            let response = match tokio::time::timeout_at(deadline, client.request(request)).await {
                Err(_) => {
                    failed("no answer in time");
                    return Err(Error::HttpResponseTimeout);
                }
                Ok(Err(e)) if e.is_connect() => {
                    failed("cannot connect");
                    return Err(Error::ConnectionRefused);
                }
                Ok(Err(e)) => {
                    failed(&e.to_string());
                    return Err(Error::InternalError(Some(e.to_string())));
                }
                Ok(Ok(response)) => response,
            };
            if trace {
                logs.push(format!(
                    "allowed: {method} {uri} answered {}",
                    response.status().as_u16()
                ));
            }
            let response = response.map(|body| {
                Limited::new(body, limit)
                    .map_err(|e| {
                        if e.is::<http_body_util::LengthLimitError>() {
                            Error::HttpResponseBodySize(None)
                        } else {
                            Error::InternalError(Some(e.to_string()))
                        }
                    })
                    .map_frame(move |frame| {
                        let _held = &permit;
                        frame
                    })
                    .boxed_unsync()
            });
            let done: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send> =
                Box::new(async { Ok(()) });
            Ok((response, done))
        })
    }
}

/// The data of one invocation's store.
pub struct Sandbox {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    table: ResourceTable,
    outbound: Outbound,
    pub limits: StoreLimits,
    pub logs: LogSink,
    /// None when no scheduler stands behind the run (`kairos plugins run`).
    bookings: Option<Arc<Bookings>>,
    booked: u32,
    /// The plugin's name, for its bookings-per-second budget.
    plugin: String,
}

impl Sandbox {
    pub fn new(
        outbound: Outbound,
        memory_bytes: usize,
        bookings: Option<Arc<Bookings>>,
        plugin: String,
    ) -> Self {
        let logs = outbound.logs.clone();
        let wasi = WasiCtxBuilder::new()
            .stdout(Capture {
                sink: logs.clone(),
                which: 0,
            })
            .stderr(Capture {
                sink: logs.clone(),
                which: 1,
            })
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Sandbox {
            wasi,
            http: WasiHttpCtx::new(),
            table: ResourceTable::new(),
            outbound,
            limits: StoreLimitsBuilder::new()
                .memory_size(memory_bytes)
                .trap_on_grow_failure(true)
                .build(),
            logs,
            bookings,
            booked: 0,
            plugin,
        }
    }
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for Sandbox {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.outbound,
        }
    }
}

impl types::Host for Sandbox {}

/// What `schedule.book` and `schedule.cancel` answer in a run with no scheduler behind
/// it (`kairos plugins run`).
fn no_scheduler() -> schedule::BookingError {
    schedule::BookingError {
        code: "no_scheduler".into(),
        message: "this run has no scheduler behind it (kairos plugins run): nothing was booked or cancelled".into(),
    }
}

impl schedule::Host for Sandbox {
    async fn book(&mut self, request: String) -> Result<String, schedule::BookingError> {
        let Some(bookings) = self.bookings.clone() else {
            self.logs.push(format!(
                "would book (no scheduler here): {}",
                super::runtime::prefix(&request, 512)
            ));
            return Err(no_scheduler());
        };
        if self.booked >= MAX_BOOKINGS_PER_RUN {
            return Err(schedule::BookingError {
                code: "too_many_bookings".into(),
                message: format!("a run may book at most {MAX_BOOKINGS_PER_RUN} Lives"),
            });
        }
        self.booked += 1;
        match bookings
            .count_plugin_booking(&self.plugin, MAX_PLUGIN_BOOKINGS_PER_SECOND)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                return Err(schedule::BookingError {
                    code: "too_many_bookings".into(),
                    message: format!(
                    "plugin {} may book at most {MAX_PLUGIN_BOOKINGS_PER_SECOND} Lives a second",
                    self.plugin
                ),
                })
            }
            Err(e) => {
                return Err(schedule::BookingError {
                    code: e.code.into(),
                    message: e.message,
                })
            }
        }
        match bookings.book_json(request.as_bytes()).await {
            Ok(life) => {
                self.logs.push(format!("booked Life {}", life.life_uuid));
                Ok(life.life_uuid)
            }
            Err(e) => Err(schedule::BookingError {
                code: e.code.into(),
                message: e.message,
            }),
        }
    }

    async fn cancel(&mut self, life_id: String) -> Result<(), schedule::BookingError> {
        let Some(bookings) = self.bookings.clone() else {
            self.logs
                .push(format!("would cancel (no scheduler here): {life_id}"));
            return Err(no_scheduler());
        };
        bookings
            .cancel(&life_id, false)
            .await
            .map(|_| ())
            .map_err(|e| schedule::BookingError {
                code: e.code.into(),
                message: e.message,
            })
    }
}

/// Used by tests of the hook's matching.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_reaches_only_its_listed_hosts() {
        let allowed = vec![
            AllowedHost::Host {
                host: "127.0.0.1".into(),
                port: Some(9000),
            },
            AllowedHost::Host {
                host: "api.example.com".into(),
                port: None,
            },
        ];
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        let grant = |list: &[AllowedHost], u: &str| plugin_allows(list, &uri(u));
        assert_eq!(grant(&allowed, "http://127.0.0.1:9000/x"), Grant::Named);
        assert_eq!(grant(&allowed, "http://127.0.0.1:9001/x"), Grant::Refused);
        assert_eq!(grant(&allowed, "https://api.example.com/v1"), Grant::Named);
        assert_eq!(grant(&allowed, "https://evil.example.com/"), Grant::Refused);
        assert_eq!(grant(&[], "https://api.example.com/v1"), Grant::Refused);
        // `*` grants public hosts only; a name listed beside it is granted as named.
        let mut open = allowed.clone();
        open.push(AllowedHost::AnyPublic);
        assert_eq!(grant(&open, "https://evil.example.com/"), Grant::AnyPublic);
        assert_eq!(grant(&open, "http://127.0.0.1:9000/x"), Grant::Named);
    }

    #[test]
    fn captured_output_becomes_lines_and_is_capped() {
        let sink = LogSink::default();
        sink.write_stream(0, b"hello\nwor");
        sink.write_stream(0, b"ld\n");
        sink.write_stream(1, b"oops");
        sink.push("info: x".into());
        let lines = sink.take();
        assert_eq!(
            lines,
            vec!["stdout: hello", "stdout: world", "info: x", "stderr: oops"]
        );
        let sink = LogSink::default();
        for i in 0..100 {
            sink.push(format!("line {i}"));
        }
        let lines = sink.take();
        assert_eq!(lines.len(), MAX_LOG_LINES + 1);
        assert!(lines.last().unwrap().contains("36 more"), "{lines:?}");
    }
}
