//! The REST API (SPEC section 2 and 9), the HTTP layer: one file per resource, over the
//! domain modules (`bookings`, `timers`, `queues`, `plugins`, the engine), which know
//! nothing of HTTP.
//!
//! [`router`] builds the whole app so that tests can drive it without a socket; the
//! server in `server.rs` binds it to the configured address.

mod auth;
mod defer;
mod edge;
mod extractors;
mod openapi;
mod ops;
mod plugins;
mod pull;
mod queues;
mod schedules;
mod tasks;
mod timers;
mod ui;
mod views;

pub(crate) use ops::metrics_router;
#[cfg(test)]
pub(crate) use plugins::upload_limits;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::{Extension, Router};
use serde_json::Value;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::bookings::idempotency;
use crate::bookings::request::{self as booking, Rules};
use crate::bookings::Bookings;
use crate::clock::Clock;
use crate::config::Config;
use crate::engine::Engine;
use crate::error::ApiError;
use crate::plugins::PluginRuntime;
use crate::store::Store;

/// What every handler shares.
pub struct App {
    pub config: Config,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    /// This host's engine, for `/metrics`.
    pub engine: Arc<Engine>,
    pub bookings: Arc<Bookings>,
    pub plugins: Arc<PluginRuntime>,
    /// The clock itself when it is manual (`--clock manual`): `POST /clock` moves it.
    pub manual_clock: Option<Arc<crate::clock::ManualClock>>,
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
        booking::parse_action(which, value, &self.bookings.rules(now_ms, &known))
    }

    /// Rules for bookings that name no plugin (`/defer`).
    pub(crate) fn rules(&self, now_ms: i64) -> Rules<'_> {
        static NONE: std::sync::LazyLock<booking::KnownPlugins> =
            std::sync::LazyLock::new(booking::KnownPlugins::default);
        self.bookings.rules(now_ms, &NONE)
    }

    fn delay_guard_ms(&self) -> i64 {
        self.config.execution_delay_guard_time.as_millis() as i64
    }

    /// Counts a booking route's answer for `/metrics` (a replayed answer booked nothing).
    fn count_booking(&self, result: &Result<idempotency::Answer, ApiError>) {
        match result {
            Ok(answer) if answer.replayed => {}
            Ok(_) => self.count_booked(Ok(())),
            Err(e) => self.count_booked(Err(e)),
        }
    }

    /// Counts one booking for `/metrics`: accepted, or refused (a 4xx).
    fn count_booked(&self, result: Result<(), &ApiError>) {
        let counter = match result {
            Ok(()) => &self.engine.metrics.bookings_accepted,
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

/// Every refusal answers with the spec's error body.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// The whole HTTP app.
pub fn router(app: Shared) -> Router {
    let limit = app.config.max_body_bytes;
    // Each `routes!` registers a route and its documentation together, so the document
    // served at /openapi.json lists exactly the routes served.
    let (routes, mut doc) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(
            schedules::list_schedules,
            schedules::create_schedule
        ))
        .routes(routes!(schedules::create_schedules_batch))
        .routes(routes!(schedules::list_failures))
        .routes(routes!(
            schedules::show_schedule,
            schedules::patch_schedule,
            schedules::cancel_schedule
        ))
        // Every method: documented in `openapi::ApiDoc` (a wildcard path is no OpenAPI
        // path, and `routes!` takes no `any`).
        .routes(routes!(defer::defer_json))
        .route("/defer/{*path}", any(defer::defer_request))
        .merge(plugins::routes(app.config.max_plugin_bytes))
        .merge(timers::routes())
        .merge(queues::routes())
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::show_clock, ops::move_clock))
        .fallback(ops::not_found)
        .layer(middleware::from_fn_with_state(app.clone(), auth::authorize))
        // The document reveals nothing the docs do not, and generators are pointed at
        // its URL: no token.
        .routes(routes!(openapi::openapi_json))
        // Health and readiness answer without a token (they reveal nothing), for load
        // balancers, supervisors and Kubernetes probes.
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        // The dashboard's page and scripts: no token (they hold no data; the page asks
        // for one and sends it with every API call), not in the OpenAPI document.
        .merge(OpenApiRouter::from(ui::routes()))
        .split_for_parts();
    openapi::finish(&mut doc);
    let doc = openapi::OpenApiJson(Bytes::from(openapi::served(&doc)));
    routes
        .layer(Extension(doc))
        .layer(DefaultBodyLimit::max(limit))
        // Counts, ids, body limits and the spec's error body for the framework's own
        // refusals, in one layer (`edge`).
        .layer(middleware::from_fn_with_state(app.clone(), edge::edge))
        .with_state(app)
}

/// Reads the `Idempotency-Key` header of a booking call; a malformed one is a 400.
pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    headers
        .get("idempotency-key")
        .map(|v| idempotency::parse_key(v.as_bytes()))
        .transpose()
}

/// Answers a booking call made under an `Idempotency-Key` (or none): the first call's
/// answer, status and body, is replayed to its repeats with `Idempotent-Replayed: true`.
/// `parts` identify the request (route, body, headers that matter); `call` books, given
/// the key to derive the ids it generates.
pub(crate) async fn idempotent<F, Fut>(
    app: &App,
    headers: &HeaderMap,
    parts: &[&[u8]],
    call: F,
) -> Result<idempotency::Answer, ApiError>
where
    F: FnOnce(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<(StatusCode, Value), ApiError>>,
{
    let key = idempotency_key(headers)?;
    let ttl_ms = app.config.idempotency_ttl.as_millis() as i64;
    let fingerprint = match key {
        Some(_) => idempotency::fingerprint(parts),
        None => String::new(),
    };
    idempotency::run(&app.store, ttl_ms, key.as_deref(), &fingerprint, call).await
}

impl IntoResponse for idempotency::Answer {
    fn into_response(self) -> Response {
        let object = auth::object_of_answer(&self.body);
        let mut response = (self.status, axum::Json(self.body)).into_response();
        if let Some(object) = object {
            response.extensions_mut().insert(auth::Audited(object));
        }
        if self.replayed {
            response.headers_mut().insert(
                "idempotent-replayed",
                header::HeaderValue::from_static("true"),
            );
        }
        response
    }
}

/// Turns the body extractor's refusal into the spec's error body (413 for a body over
/// the limit).
pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if crate::http_server::is_body_timeout(&rejection) {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                rejection.body_text(),
            )
        } else if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
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
