//! The layer every request passes first and every answer last, one `from_fn` for what
//! four did (each such layer boxes the request's future and clones the services beneath
//! it, per request):
//!
//! 1. counts and times the request by its route's template (`metrics::http`), with the
//!    status the client gets;
//! 2. gives it an id ([`RequestId`]) and answers it as `X-Request-Id`;
//! 3. refuses a `Content-Length` over the route's limit with 413 before reading a byte,
//!    and puts a deadline on reading the body (`http_server`);
//! 4. gives the framework's own refusals (a method a route does not take, a path that
//!    does not decode, a missing content type) the spec's error body.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::RequestId;
use super::Shared;
use crate::error::ApiError;

pub(crate) async fn edge(State(app): State<Shared>, mut request: Request, next: Next) -> Response {
    // A clone of the template axum keeps (shared, not copied).
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = request.method().clone();
    let started = std::time::Instant::now();
    let id = request_id(&request);
    request.extensions_mut().insert(RequestId(id.clone()));
    let uri = request.uri().clone();
    // Plugin uploads have a limit of their own; the routes apply each exactly.
    let limit = if uri.path().starts_with("/plugins/") {
        app.config.max_plugin_bytes.max(app.config.max_body_bytes)
    } else {
        app.config.max_body_bytes
    };
    let mut response = match crate::http_server::limit_body(limit, request) {
        Ok(request) => spec_error_body(&method, &uri, next.run(request).await).await,
        Err(refused) => refused.into_response(),
    };
    if let Ok(value) = header::HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    app.engine.metrics.http.observe(
        route.as_ref().map(|p| p.as_str()),
        method.as_str(),
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// The caller's `X-Request-Id` when it is a sane one (1 to 64 visible ASCII characters),
/// else a new one.
fn request_id(request: &Request) -> String {
    request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()))
}

/// Gives an error answer that is not the spec's JSON error body (axum's own refusals:
/// 405, a path segment that is not UTF-8, a missing content type) that body.
async fn spec_error_body(method: &Method, uri: &Uri, response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let path = uri.path();
    let allow = response.headers().get(header::ALLOW).cloned();
    let text = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let (code, message) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            format!(
                "{path} does not take {method}{}",
                allow
                    .as_ref()
                    .and_then(|a| a.to_str().ok())
                    .map(|a| format!("; it takes {a}"))
                    .unwrap_or_default()
            ),
        ),
        StatusCode::NOT_FOUND => ("not_found", format!("no route for {method} {path}")),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported_media_type", text),
        s if s.is_client_error() => (
            "invalid_request",
            format!("the request is not valid: {text}"),
        ),
        _ => ("internal_error", format!("the request failed: {text}")),
    };
    let mut answer = ApiError::new(status, code, message).into_response();
    if let Some(allow) = allow {
        answer.headers_mut().insert(header::ALLOW, allow);
    }
    answer
}
