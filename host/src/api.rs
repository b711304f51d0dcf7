//! The REST API (SPEC section 2 and 9): routes, bearer-token scopes and the error body.
//!
//! [`router`] builds the whole app so that tests can drive it without a socket; the
//! server in `server.rs` binds it to the configured address.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::booking::{self, BookingRequest, Rules};
use crate::bookings::Bookings;
use crate::clock::Clock;
use crate::config::{Config, Scope};
use crate::error::ApiError;
use crate::plugins::PluginRuntime;
use crate::scheduler::Engine;
use crate::store::{self, ListFilter, Store};

/// What every handler shares.
pub struct App {
    pub config: Config,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    /// This host's engine, for `/metrics`.
    pub engine: Arc<Engine>,
    pub bookings: Arc<Bookings>,
    pub plugins: Arc<PluginRuntime>,
}

pub(crate) type Shared = Arc<App>;

impl App {
    /// Reads the action of a timer or a queue task, a plugin's name checked in the
    /// registry as for bookings.
    pub(crate) async fn parse_action(
        &self,
        which: &str,
        value: &Value,
        now_ms: i64,
    ) -> Result<crate::model::Action, ApiError> {
        let specs: Vec<String> = value
            .get("plugin")
            .and_then(Value::as_str)
            .map(|s| vec![s.to_string()])
            .unwrap_or_default();
        let known = self.bookings.plugins.registered(specs).await?;
        let registered = |spec: &str| known.contains(spec);
        booking::parse_action(which, value, &self.bookings.rules(now_ms, &registered))
    }

    /// Rules for bookings that name no plugin (`/defer`).
    pub(crate) fn rules(&self, now_ms: i64) -> Rules<'static> {
        self.bookings.rules(now_ms, &|_| false)
    }

    fn delay_guard_ms(&self) -> i64 {
        self.config.execution_delay_guard_time.as_millis() as i64
    }

    /// Stores a validated booking (the 409 checks run in the store's script).
    async fn book(&self, life: &booking::NewLife, now_ms: i64) -> Result<(), ApiError> {
        self.bookings.store(life, now_ms).await
    }

    /// Counts a booking route's answer for `/metrics`.
    fn count_booking<T>(&self, result: &Result<T, ApiError>) {
        let counter = match result {
            Ok(_) => &self.engine.metrics.bookings_accepted,
            Err(e) if e.status.is_client_error() => &self.engine.metrics.bookings_refused,
            Err(_) => return,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bookings due before this are announced to the schedulers at once.
    pub(crate) fn notify_before_ms(&self, now_ms: i64) -> i64 {
        self.bookings.notify_before_ms(now_ms)
    }
}

/// The whole HTTP app.
pub fn router(app: Shared) -> Router {
    let limit = app.config.max_body_bytes;
    Router::new()
        .route("/schedules", get(list_schedules).post(create_schedule))
        .route(
            "/schedules/{life_uuid}",
            get(show_schedule)
                .patch(patch_schedule)
                .delete(cancel_schedule),
        )
        .route("/defer/{*path}", any(defer_request))
        .merge(crate::plugins::routes::routes(app.config.max_plugin_bytes))
        .merge(crate::timers::routes())
        .merge(crate::queues::routes())
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), authorize))
        // /healthz answers without a token, for load balancers and supervisors.
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

/// The scope a request needs: reading needs `read`; bookings need `book`; everything
/// else (plugins, queues, timers administration) needs `admin`.
fn required_scope(method: &Method, path: &str) -> Scope {
    if method == Method::GET || method == Method::HEAD {
        Scope::Read
    } else if path.starts_with("/schedules")
        || path.starts_with("/defer")
        || crate::queues::is_task_path(path)
    {
        // Adding, deleting and running queue tasks is booking work; defining queues and
        // timers is administration.
        Scope::Book
    } else {
        Scope::Admin
    }
}

async fn authorize(State(app): State<Shared>, request: Request, next: Next) -> Response {
    if app.config.api_tokens.is_empty() {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(presented) = presented else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this route needs `Authorization: Bearer <token>`",
        )
        .into_response();
    };
    // Compare every token in full so timing does not reveal a prefix match.
    let granted = app
        .config
        .api_tokens
        .iter()
        .filter(|t| constant_time_eq(t.token.as_bytes(), presented.as_bytes()))
        .map(|t| t.scope)
        .max();
    let Some(granted) = granted else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "unknown API token",
        )
        .into_response();
    };
    let needed = required_scope(request.method(), request.uri().path());
    if granted < needed {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token has scope `{granted:?}`; this route needs `{needed:?}`")
                .to_lowercase(),
        )
        .into_response();
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Turns the body extractor's refusal into the spec's error body (413 for a body over
/// the limit).
pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("the body is larger than the limit of {limit} bytes"),
            )
        } else {
            ApiError::bad_request("unreadable_body", rejection.body_text())
        }
    })
}

async fn create_schedule(
    State(app): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let result = book_schedule(&app, body).await;
    app.count_booking(&result);
    result
}

async fn book_schedule(
    app: &App,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let life = app.bookings.book_json(&body).await?;
    tracing::debug!(life_uuid = %life.life_uuid, "booked");
    Ok(Json(store::booked_view(&life, app.config.timezone)))
}

fn parse_query_time(name: &str, text: &str, app: &App) -> Result<i64, ApiError> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    booking::parse_time(text, app.config.timezone)
        .map(|t| t.timestamp_millis())
        .map_err(|e| ApiError::bad_request("invalid_query", format!("{name}: {e}")))
}

async fn list_schedules(
    State(app): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let mut filter = ListFilter {
        limit: 100,
        ..Default::default()
    };
    for (name, value) in &query {
        match name.as_str() {
            "state" => {
                value.parse::<crate::model::LifeState>().map_err(|_| {
                    ApiError::bad_request(
                        "invalid_query",
                        format!("state `{value}` is not one of Inexistent, Alive, Dead, Stillbirth, Invalidated"),
                    )
                })?;
                filter.state = Some(value.clone());
            }
            "resource_id" => filter.resource_id = Some(value.clone()),
            "from" => filter.from_ms = Some(parse_query_time("from", value, &app)?),
            "to" => filter.to_ms = Some(parse_query_time("to", value, &app)?),
            "limit" => {
                filter.limit = value
                    .parse()
                    .ok()
                    .filter(|l| (1..=1000).contains(l))
                    .ok_or_else(|| {
                        ApiError::bad_request("invalid_query", "limit must be 1 to 1000")
                    })?
            }
            "cursor" => filter.cursor = Some(value.clone()),
            other => {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    format!(
                        "unknown filter `{other}` (state, resource_id, from, to, limit, cursor)"
                    ),
                ))
            }
        }
    }
    let (items, next_cursor) = app.store.list(&filter).await?;
    Ok(Json(json!({"items": items, "next_cursor": next_cursor})))
}

async fn show_schedule(
    State(app): State<Shared>,
    Path(life_uuid): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match app.store.life_view(&life_uuid, 50).await? {
        Some(view) => Ok(Json(view)),
        None => Err(ApiError::not_found(format!("no Life `{life_uuid}`"))),
    }
}

async fn patch_schedule(
    State(app): State<Shared>,
    Path(life_uuid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    // Parse once up front so that a malformed body is a 400 whatever the Life's state.
    booking::parse_request(&body)?;
    // Optimistic concurrency: the script applies the change only if the Life is still at
    // the version the merge was computed from.
    for _ in 0..5 {
        let Some((current, version, state)) = app.store.load_booking(&life_uuid).await? else {
            return Err(ApiError::not_found(format!("no Life `{life_uuid}`")));
        };
        // The table's order: the body's own checks (400, 406) before conflicts (409).
        let now_ms = app.clock.now_ms();
        let request: BookingRequest = booking::parse_request(&body)?;
        let known = app.bookings.registered_plugins(&request).await?;
        let exists = |spec: &str| known.contains(spec);
        let merged = request.merge_into(&current, &app.bookings.rules(now_ms, &exists))?;
        if state
            .parse::<crate::model::LifeState>()
            .map(|s| s.is_finished())
            .unwrap_or(false)
        {
            return Err(ApiError::conflict(
                "life_finished",
                format!("Life `{life_uuid}` is {state}; a finished Life cannot change"),
            ));
        }
        if app
            .store
            .patch(
                &current,
                &version,
                &merged,
                now_ms,
                app.delay_guard_ms(),
                app.notify_before_ms(now_ms),
            )
            .await?
        {
            let view = app.store.life_view(&life_uuid, 50).await?;
            return view
                .map(Json)
                .ok_or_else(|| ApiError::not_found(format!("no Life `{life_uuid}`")));
        }
    }
    Err(ApiError::conflict(
        "concurrent_change",
        "the Life kept changing while this PATCH was applied; try again",
    ))
}

async fn cancel_schedule(
    State(app): State<Shared>,
    Path(life_uuid): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let force = matches!(
        query.get("force").map(String::as_str),
        Some("true") | Some("1")
    );
    let state = app.bookings.cancel(&life_uuid, force).await?;
    Ok(Json(json!({"life_uuid": life_uuid, "state": state})))
}

/// Headers of a deferred request that are not replayed: hop-by-hop headers (RFC 9110
/// section 7.6.1), what the replay sets itself, credentials meant for kairos, and the
/// scheduling headers.
const NOT_REPLAYED: &[&str] = &[
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
async fn defer_request(
    State(app): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let result = defer_booking(&app, method, uri, headers, body).await;
    app.count_booking(&result);
    result
}

async fn defer_booking(
    app: &App,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
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
    let replayed: std::collections::BTreeMap<String, String> = headers
        .iter()
        .filter(|(name, _)| !NOT_REPLAYED.contains(&name.as_str()))
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
        })
        .collect();
    let now_ms = app.clock.now_ms();
    let action = crate::model::Action::Webhook(crate::model::WebhookAction {
        path: Some(path),
        url: None,
        method: method.as_str().to_string(),
        headers: replayed,
        body: (!body_text.is_empty()).then_some(Value::String(body_text)),
        connect_timeout_ms: None,
        request_timeout_ms: None,
        retry_count: 0,
        retry_interval_ms: 0,
    });
    let life = booking::point_life(when, action, &app.rules(now_ms))?;
    app.book(&life, now_ms).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "life_uuid": life.life_uuid,
            "birth_time": store::rfc3339(life.birth_at_ms, app.config.timezone),
            "birth_time_ms": life.birth_at_ms,
        })),
    ))
}

/// Prometheus text format: this host's counters, its claimed and running Plans, and the
/// cluster's due Plans and live hosts read from Redis.
async fn metrics(State(app): State<Shared>) -> Result<Response, ApiError> {
    let (due, hosts) = app.store.cluster_stats(app.clock.now_ms()).await?;
    let text = app.engine.metrics.render(&[
        (
            "kairos_claimed_plans",
            "Plans this host holds in memory (timer, queue, running).",
            app.engine.claimed() as i64,
        ),
        (
            "kairos_running_plans",
            "Actions running on this host now.",
            app.engine.running() as i64,
        ),
        (
            "kairos_due_plans",
            "Plans waiting in Redis to be claimed (all hosts).",
            due,
        ),
        (
            "kairos_hosts_alive",
            "Hosts whose lease is current (all hosts).",
            hosts,
        ),
    ]);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(app): State<Shared>) -> Result<Json<Value>, ApiError> {
    app.store.ping().await?;
    Ok(Json(
        json!({"status": "ready", "host_id": app.config.host_id}),
    ))
}

async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_method_and_route() {
        assert_eq!(required_scope(&Method::GET, "/schedules"), Scope::Read);
        assert_eq!(required_scope(&Method::POST, "/schedules"), Scope::Book);
        assert_eq!(required_scope(&Method::DELETE, "/schedules/x"), Scope::Book);
        assert_eq!(required_scope(&Method::PUT, "/plugins/x"), Scope::Admin);
        assert_eq!(
            required_scope(&Method::POST, "/queues/q/tasks"),
            Scope::Book
        );
        assert_eq!(
            required_scope(&Method::POST, "/queues/q/tasks/t/run"),
            Scope::Book
        );
        assert_eq!(
            required_scope(&Method::POST, "/queues/q/purge"),
            Scope::Admin
        );
        assert_eq!(required_scope(&Method::PUT, "/queues/q"), Scope::Admin);
        assert_eq!(required_scope(&Method::POST, "/timers"), Scope::Admin);
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
