//! `/defer/{path}`: a request replayed later, booked as a point Life whose webhook is the
//! request itself.

use crate::bookings::request as booking;
use crate::error::ApiError;
use crate::store::{self, IdOrigin};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;

use super::views::Deferred;
use super::{body_bytes, idempotent, App, Shared};
use crate::bookings::idempotency::Answer;
use crate::error::ErrorBody;

/// Headers of a deferred request that are not replayed: hop-by-hop headers (RFC 9110
/// section 7.6.1), what the replay sets itself, credentials meant for kairos, and the
/// scheduling headers. Nor are `X-Kairos-*` and `Idempotency-Key`: only the host sets
/// those on a call (`webhook::is_host_header`).
pub(crate) const NOT_REPLAYED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "authorization",
    "cookie",
    "x-kairos-schedule-datetime",
    "x-xaas-schedule-datetime",
];

/// `{any method} /defer/{path}` with `X-Kairos-Schedule-Datetime` (or
/// `X-Xaas-Schedule-Datetime`): books a point Life whose birth replays this request —
/// method, headers, body — to `{gateway_url}/{path}` at that time. Same validation codes
/// as `POST /schedules`; answers 202.
#[utoipa::path(
    method(get, post, put, patch, delete),
    path = "/defer/{path}",
    tag = "defer",
    params(
        ("path" = String, Path, description = "The rest of the path (with its query string): the request is replayed to `{gateway_url}/{path}`."),
        ("X-Kairos-Schedule-Datetime" = String, Header, description = "When to replay it: `YYYY-MM-DD HH:MM:SS` in the host's timezone, or RFC 3339 with an offset (`X-Xaas-Schedule-Datetime` is read too).", example = "2030-12-15 15:05:00"),
        ("Idempotency-Key" = Option<String>, Header, description = "Repeats of the call with the same key and request get the first answer."),
    ),
    request_body(description = "Any body, replayed as it is (UTF-8 text).", content(("application/json"), ("text/plain"))),
    responses(
        (status = 202, description = "Booked: a point Life that replays this request.", body = Deferred),
        (status = 400, description = "No schedule header, a time that does not parse, no gateway_url, a body that is not UTF-8.", body = ErrorBody,
            example = json!({"error": {"code": "missing_field", "message": "a deferred request needs the X-Kairos-Schedule-Datetime header"}})),
        (status = 406, description = "A time within execution_guard_time of now.", body = ErrorBody),
        (status = 409, description = "An Idempotency-Key call is under way.", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for another request.", body = ErrorBody),
    )
)]
pub(crate) async fn defer_request(
    State(app): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    let result = defer_booking(&app, method, uri, headers, body).await;
    app.count_booking(&result);
    result
}

/// Refuses a deferred path whose `/` came encoded (`%2F`): a client that sent the whole
/// path as one encoded parameter (`orders%2F42%2Fconfirm`, as generated clients do)
/// meant `orders/42/confirm`, and one that meant an encoded `/` inside a segment cannot
/// be told apart from it. Either would be replayed to a path other than meant.
fn check_unencoded(path_and_query: &str) -> Result<(), ApiError> {
    let path = path_and_query.split('?').next().unwrap_or_default();
    if path.to_ascii_lowercase().contains("%2f") {
        return Err(ApiError::bad_request(
            "encoded_path",
            format!(
                "the deferred path `{path}` holds an encoded `/` (%2F): write the path's slashes as they are (/defer/orders/42/confirm), or use POST /defer with the path in its JSON body"
            ),
        ));
    }
    Ok(())
}

pub(crate) async fn defer_booking(
    app: &App,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let when = headers
        .get("x-kairos-schedule-datetime")
        .or_else(|| headers.get("x-xaas-schedule-datetime"))
        .ok_or_else(|| {
            ApiError::bad_request(
                "missing_field",
                "a deferred request needs the X-Kairos-Schedule-Datetime header",
            )
        })?
        .to_str()
        .map_err(|_| {
            ApiError::bad_request("invalid_time", "X-Kairos-Schedule-Datetime is not text")
        })?;
    if app.config.gateway_url.is_none() {
        return Err(ApiError::bad_request(
            "no_gateway",
            "deferred requests replay to gateway_url, which is not configured",
        ));
    }
    let body_text = String::from_utf8(body.to_vec()).map_err(|_| {
        ApiError::bad_request("invalid_body", "a deferred request body must be UTF-8 text")
    })?;
    let path = uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/")
        .strip_prefix("/defer")
        .unwrap_or("/")
        .to_string();
    check_unencoded(&path)?;
    if !booking::HTTP_METHODS.contains(&method.as_str()) {
        return Err(ApiError::bad_request(
            "invalid_method",
            format!(
                "a deferred request's method must be one of {}, not {method}",
                booking::HTTP_METHODS.join(", ")
            ),
        ));
    }
    let replayed: std::collections::BTreeMap<String, String> = headers
        .iter()
        .filter(|(name, _)| {
            !NOT_REPLAYED.contains(&name.as_str())
                && !crate::actions::webhook::is_host_header(name.as_str())
        })
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
        })
        .collect();
    // The request is what is replayed: method, path, the headers that travel, the time
    // and the body.
    let replayed_text = serde_json::to_string(&replayed).expect("headers serialize");
    let parts: [&[u8]; 6] = [
        b"/defer",
        method.as_str().as_bytes(),
        path.as_bytes(),
        when.as_bytes(),
        replayed_text.as_bytes(),
        &body,
    ];
    let (path, method) = (&path, &method);
    idempotent(app, &headers, &parts, |key| async move {
        let now_ms = app.clock.now_ms();
        let action = crate::model::Action::Webhook(crate::model::WebhookAction {
            path: Some(path.clone()),
            url: None,
            method: method.as_str().to_string(),
            headers: replayed,
            body: (!body_text.is_empty()).then_some(Value::String(body_text)),
            connect_timeout_ms: None,
            request_timeout_ms: None,
            retry_count: 0,
            retry_interval_ms: 0,
            callbacks: Default::default(),
        });
        let life = booking::point_life(when, action, &app.rules(now_ms), key.as_deref())?;
        app.bookings
            .store_keyed(
                &life,
                IdOrigin::of_key(key.as_deref()),
                now_ms,
                key.as_deref(),
            )
            .await?;
        Ok((StatusCode::ACCEPTED, deferred_view(app, &life)))
    })
    .await
}

/// `POST /defer`: a request to replay later, as JSON.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"path": "/orders/42/confirm", "method": "POST", "headers": {"content-type": "application/json"}, "body": {"by": "scheduler"}, "at": "2030-12-15 15:05:00"}))]
pub(crate) struct DeferBody {
    /// Where the request goes: a path (with its query string) under the host's
    /// gateway URL. A leading `/` is added when missing.
    #[schema(example = "/orders/42/confirm")]
    path: String,
    /// The request's method (default `POST`).
    #[schema(value_type = Option<crate::bookings::request::HttpMethod>)]
    method: Option<String>,
    /// Headers sent with it.
    headers: Option<BTreeMap<String, String>>,
    /// The request's body: any JSON value, sent as JSON; a string is sent as it is.
    #[schema(value_type = Option<crate::bookings::request::AnyJson>)]
    body: Option<Value>,
    /// When to send it: `YYYY-MM-DD HH:MM:SS` in the host's timezone, or RFC 3339 with
    /// an offset.
    #[schema(example = "2030-12-15 15:05:00")]
    at: String,
}

/// Books a point Life whose birth sends the request described to `{gateway_url}{path}`
/// at `at`: what `/defer/{path}` does, with the request given as JSON, for clients
/// that cannot send a path as part of theirs. Same validation codes as
/// `POST /schedules`; answers 202.
#[utoipa::path(
    post,
    path = "/defer",
    tag = "defer",
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeats of the call with the same key and body get the first answer.")),
    request_body(content = DeferBody),
    responses(
        (status = 202, description = "Booked: a point Life that sends this request.", body = Deferred),
        (status = 400, description = "Not JSON of this shape, an unknown field, a path or method that is not one, a time that does not parse, no gateway_url.", body = ErrorBody,
            example = json!({"error": {"code": "unknown_field", "message": "the body has an unknown field `when` (known fields: path, method, headers, body, at)"}})),
        (status = 406, description = "A time within execution_guard_time of now.", body = ErrorBody),
        (status = 409, description = "An Idempotency-Key call is under way.", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for another request.", body = ErrorBody),
    )
)]
pub(crate) async fn defer_json(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    let result = defer_json_booking(&app, &headers, body).await;
    app.count_booking(&result);
    result
}

async fn defer_json_booking(
    app: &App,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let value: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "invalid_body",
            "the body must be a JSON object: {\"path\", \"method\", \"headers\", \"body\", \"at\"}",
        ));
    }
    let request: DeferBody = serde_json::from_value(value)
        .map_err(|e| booking::body_error("the body", "invalid_body", e))?;
    let path = if request.path.starts_with('/') {
        request.path.clone()
    } else {
        format!("/{}", request.path)
    };
    let mut action = json!({
        "path": path,
        "method": request.method.as_deref().unwrap_or("POST"),
    });
    if let Some(h) = &request.headers {
        action["headers"] = json!(h);
    }
    if let Some(b) = &request.body {
        action["body"] = b.clone();
    }
    let at = request.at.clone();
    let (app, action, at) = (app, &action, &at);
    idempotent(app, headers, &[b"POST /defer", &body], |key| async move {
        let now_ms = app.clock.now_ms();
        let rules = app.rules(now_ms);
        let action = booking::parse_action("the request", action, &rules)?;
        let life = booking::point_life(at, action, &rules, key.as_deref())?;
        app.bookings
            .store_keyed(
                &life,
                IdOrigin::of_key(key.as_deref()),
                now_ms,
                key.as_deref(),
            )
            .await?;
        Ok((StatusCode::ACCEPTED, deferred_view(app, &life)))
    })
    .await
}

fn deferred_view(app: &App, life: &crate::model::NewLife) -> Value {
    json!({
        "life_uuid": life.life_uuid,
        "birth_time": store::rfc3339(life.birth_at_ms, app.config.timezone),
        "birth_time_ms": life.birth_at_ms,
    })
}
