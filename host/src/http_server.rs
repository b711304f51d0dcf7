//! Serving the API over HTTP/1.1, with the limits a server facing careless or hostile
//! clients needs (SPEC section 2: bad input gets a clear error, never a stuck host):
//!
//! - a client has [`HEADER_READ_TIMEOUT`] to send a request's headers, and
//!   [`BODY_READ_TIMEOUT`] to send its body: a socket that never finishes either is
//!   closed (408 for a body), so thousands of them cannot hold the host;
//! - a `Content-Length` above the route's limit is refused with 413 before any byte of
//!   the body is read (the routes apply the limit while reading too);
//! - the process's open-file limit is raised to its hard limit at startup, so that idle
//!   sockets do not run it out of descriptors before the timeouts close them.
//!
//! Graceful shutdown: the listener stops, connections finish their request in flight.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::Router;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::error::ApiError;

/// Time a client has to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a request's body, once its headers are in.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown` completes, then lets connections finish
/// the request they are on (for at most `grace`).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, most likely: wait for some to close rather than
                    // spin on the error.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        // The client's address, for the audit line (`ConnectInfo`).
        let service = TowerToHyperService::new(
            app.clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(peer))),
        );
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that goes away or times out ends its connection; nothing to do.
            let _ = connection.await;
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!("connections still open after the shutdown grace period");
        }
    }
}

/// 413 for a `Content-Length` above `limit` (before reading the body); else the request,
/// its body given a deadline of [`BODY_READ_TIMEOUT`].
pub fn limit_body(limit: usize, request: Request) -> Result<Request, ApiError> {
    let promised = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if promised.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is larger than the limit of {limit} bytes"),
        ));
    }
    let (parts, body) = request.into_parts();
    let body = Body::new(Deadline {
        inner: body,
        sleep: Box::pin(tokio::time::sleep(BODY_READ_TIMEOUT)),
    });
    Ok(Request::from_parts(parts, body))
}

/// A body that fails if it is not read to its end before its deadline.
struct Deadline {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

/// The error a [`Deadline`] body fails with.
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the body did not arrive within {} s",
            BODY_READ_TIMEOUT.as_secs()
        )
    }
}

impl std::error::Error for BodyTimedOut {}

impl hyper::body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Raises the soft limit of open files to the hard limit, so that many idle or slow
/// clients cannot exhaust descriptors before the timeouts close them. Returns the limit
/// in effect.
pub fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}

/// Whether a body error is a [`Deadline`]'s: 408, not 400.
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if e.is::<BodyTimedOut>() {
            return true;
        }
        current = e.source();
    }
    false
}
