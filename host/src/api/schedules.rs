//! `/schedules`: booking, listing, showing, changing and cancelling Lives.

use crate::bookings::request::{self as booking, BookingRequest};
use crate::error::ApiError;
use crate::store::{self, ListFilter};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::extractors::{flag, Query};
use super::views::{
    BatchRequest, BatchResult, Booked, BookingChange, Cancelled, FailurePage, LifePage, LifeView,
};
use super::{body_bytes, idempotent, App, Shared};
use crate::bookings::idempotency::Answer;
use crate::error::ErrorBody;
use axum::http::{HeaderMap, StatusCode};

/// Books a Life: a point Life (one action at `birth_time`) or a term Life (a birth and a
/// death action). Checked in the order of the spec's validation table.
#[utoipa::path(
    post,
    path = "/schedules",
    tag = "schedules",
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeats of the call with the same key and body get the first answer (24 h).")),
    request_body(content = BookingRequest, description = "The booking; the field names are those of the Qmonus Schedule service."),
    responses(
        (status = 200, description = "Booked.", body = Booked),
        (status = 400, description = "Not JSON of the right shape, a time that does not parse, a missing field, an unknown field or plugin, a plugin input that does not fit the plugin's input schema (`invalid_input`), a field in both spellings, birth not before death, a term shorter than minimum_life_term.", body = ErrorBody,
            example = json!({"error": {"code": "unknown_field", "message": "the body has an unknown field `resource_idd`"}})),
        (status = 406, description = "A time within execution_guard_time of now.", body = ErrorBody,
            example = json!({"error": {"code": "too_soon", "message": "birth_time must be more than execution_guard_time (30 s) from now"}})),
        (status = 409, description = "Another Life of the resource overlaps (`resource_conflict`), the life_uuid is taken, or an Idempotency-Key call is under way.", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for another request.", body = ErrorBody),
    )
)]
pub(crate) async fn create_schedule(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    let result = book_schedule(&app, &headers, body).await;
    app.count_booking(&result);
    result
}

pub(crate) async fn book_schedule(
    app: &App,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let body = &body;
    let parts: [&[u8]; 2] = [b"POST /schedules", body];
    if let Some(key) = super::idempotency_key(headers)? {
        let fingerprint = crate::bookings::idempotency::fingerprint(&parts);
        let ttl_ms = app.config.idempotency_ttl.as_millis() as i64;
        let one_step = app
            .bookings
            .book_json_idempotent(body, &key, &fingerprint, ttl_ms)
            .await?;
        if let Some(answer) = one_step {
            return Ok(answer);
        }
    }
    idempotent(app, headers, &parts, |key| async move {
        let booked = app.bookings.book_json_keyed(body, key.as_deref()).await?;
        tracing::debug!(life_uuid = %booked.life.life_uuid, debounced = booked.debounced, "booked");
        let mut view = store::booked_view(&booked.life, app.config.timezone);
        if booked.debounced {
            view["debounced"] = true.into();
        }
        Ok((StatusCode::OK, view))
    })
    .await
}

/// The body of `POST /schedules/batch`: `{"bookings": [...]}`, or the list itself.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    bookings: Vec<Value>,
}

/// Books up to 1,000 Lives in one call: each booking is checked and stored as by
/// `POST /schedules`, whole or not at all, and answered on its own, in order. One
/// booking refused does not stop the others.
#[utoipa::path(
    post,
    path = "/schedules/batch",
    tag = "schedules",
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeats of the call with the same key and body get the first answer (24 h); the Lives a repeat would book are those of the first try.")),
    request_body(content = BatchRequest, description = "The bookings, each the body of a `POST /schedules`: `{\"bookings\": [...]}` or the list itself."),
    responses(
        (status = 200, description = "One result per booking, in order: `status` 200 with the `booking`, or the status and `error` body that `POST /schedules` would have answered.", body = BatchResult),
        (status = 400, description = "Not a list of bookings, no booking, or more than 1,000 (`invalid_batch`); an unknown field (`unknown_field`).", body = ErrorBody,
            example = json!({"error": {"code": "invalid_batch", "message": "a batch holds 1 to 1000 bookings; this one has 1200"}})),
        (status = 409, description = "An Idempotency-Key call is under way.", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for another request.", body = ErrorBody),
    )
)]
pub(crate) async fn create_schedules_batch(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let items = parse_batch(&body)?;
    let (app, items) = (&app, &items);
    idempotent(app, &headers, &[b"POST /schedules/batch", &body], |key| async move {
        let results = app.bookings.book_batch(items, key.as_deref()).await;
        let mut answers = Vec::with_capacity(results.len());
        let (mut booked, mut refused, mut failed) = (0u64, 0u64, false);
        for result in results {
            app.count_booked(result.as_ref().map(|_| ()));
            answers.push(match result {
                Ok(done) => {
                    booked += 1;
                    let mut view = store::booked_view(&done.life, app.config.timezone);
                    if done.debounced {
                        view["debounced"] = true.into();
                    }
                    json!({"status": 200, "booking": view})
                }
                Err(e) => {
                    refused += 1;
                    failed |= e.status.is_server_error();
                    let mut answer = e.body();
                    answer["status"] = e.status.as_u16().into();
                    answer
                }
            });
        }
        if failed && key.is_some() {
            // Answered 5xx, the key is forgotten: a repeat with it books what this try
            // could not, and meets (never doubles) what it booked.
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "batch_incomplete",
                "some bookings of the batch could not be stored (Redis failed); repeat the call with the same Idempotency-Key to finish it",
            ));
        }
        Ok((
            StatusCode::OK,
            json!({"items": answers, "booked": booked, "refused": refused}),
        ))
    })
    .await
}

/// Reads a batch body: a list of bookings or `{"bookings": [...]}`, 1 to 1,000 of them.
fn parse_batch(body: &[u8]) -> Result<Vec<Value>, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    let items = match value {
        Value::Array(items) => items,
        Value::Object(_) => {
            serde_json::from_value::<BatchBody>(value)
                .map_err(|e| booking::body_error("the batch", "invalid_batch", e))?
                .bookings
        }
        _ => {
            return Err(ApiError::bad_request(
                "invalid_batch",
                "the body must be a list of bookings or {\"bookings\": [...]}",
            ))
        }
    };
    let max = crate::bookings::MAX_BATCH;
    if items.is_empty() || items.len() > max {
        return Err(ApiError::bad_request(
            "invalid_batch",
            format!(
                "a batch holds 1 to {max} bookings; this one has {}",
                items.len()
            ),
        ));
    }
    Ok(items)
}

pub(crate) fn parse_query_time(name: &str, text: &str, app: &App) -> Result<i64, ApiError> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    booking::parse_time(text, app.config.timezone)
        .map(|t| t.timestamp_millis())
        .map_err(|e| ApiError::bad_request("invalid_query", format!("{name}: {e}")))
}

/// The filters of `GET /schedules`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only Lives in this state.
    #[param(value_type = Option<super::views::LifeState>)]
    state: Option<String>,
    /// Only Lives that came to this outcome (finished ones).
    #[param(value_type = Option<super::views::LifeOutcome>)]
    outcome: Option<String>,
    /// Only this resource's Lives.
    resource_id: Option<String>,
    /// Births from this time on (epoch ms, or either time format).
    from: Option<String>,
    /// Births up to this time.
    to: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before.
    cursor: Option<String>,
    /// `asc` (default): the earliest birth first; `desc`: the latest first.
    #[param(value_type = Option<SortOrder>)]
    order: Option<String>,
}

/// The order of a listing by time.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
#[schema(rename_all = "lowercase")]
pub(crate) enum SortOrder {
    Asc,
    Desc,
}

/// Lists Lives by birth time, a page at a time, either way. A filter on state or outcome
/// fills the page or ends the list unless a page's time budget runs out first (a rare
/// match among very many Lives: then a short page with a cursor).
#[utoipa::path(
    get,
    path = "/schedules",
    tag = "schedules",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of Lives.", body = LifePage),
        (status = 400, description = "A filter that does not parse or that the route does not take (`invalid_query`).", body = ErrorBody,
            example = json!({"error": {"code": "invalid_query", "message": "limit must be 1 to 1000"}})),
    )
)]
pub(crate) async fn list_schedules(
    State(app): State<Shared>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let mut filter = ListFilter {
        limit: super::extractors::page_limit(query.limit)?,
        ..Default::default()
    };
    if let Some(state) = query.state {
        state.parse::<crate::model::LifeState>().map_err(|_| {
            ApiError::bad_request(
                "invalid_query",
                format!("state `{state}` is not one of Inexistent, Alive, Dead, Stillbirth, Invalidated"),
            )
        })?;
        filter.state = Some(state);
    }
    if let Some(outcome) = query.outcome {
        filter.outcome = Some(outcome.parse().map_err(|_| {
            ApiError::bad_request(
                "invalid_query",
                format!(
                    "outcome `{outcome}` is not one of {}",
                    store::outcome::OUTCOMES.join(", ")
                ),
            )
        })?);
    }
    filter.descending = parse_order(query.order.as_deref())?;
    filter.resource_id = query.resource_id;
    if let Some(from) = &query.from {
        filter.from_ms = Some(parse_query_time("from", from, &app)?);
    }
    if let Some(to) = &query.to {
        filter.to_ms = Some(parse_query_time("to", to, &app)?);
    }
    filter.cursor = query.cursor;
    let page = app.store.list(&filter).await?;
    Ok(Json(page_json(page)))
}

fn page_json(page: store::Page) -> Value {
    json!({"items": page.items, "next_cursor": page.next_cursor, "total": page.total})
}

/// `order=asc|desc`: whether newest comes first.
pub(crate) fn parse_order(order: Option<&str>) -> Result<bool, ApiError> {
    match order {
        None | Some("asc") => Ok(false),
        Some("desc") => Ok(true),
        Some(other) => Err(ApiError::bad_request(
            "invalid_query",
            format!("order `{other}` is not one of asc, desc"),
        )),
    }
}

/// The filters of `GET /failures`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct FailureQuery {
    /// Only this kind of failure: `birth_failed`, `death_failed` or `invalidated`.
    #[param(value_type = Option<super::views::LifeOutcome>)]
    outcome: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before.
    cursor: Option<String>,
}

/// Lists the Lives that failed, most recently finished first: a birth that failed for
/// good (`birth_failed`), a death that failed for good (`death_failed`), a birth missed
/// by more than birth_delay_limit_time (`invalidated`), each with its `outcome_reason`.
/// They are kept as long as finished Lives are (schedule_history_duration_days).
#[utoipa::path(
    get,
    path = "/failures",
    tag = "schedules",
    params(FailureQuery),
    responses(
        (status = 200, description = "A page of failed Lives.", body = FailurePage),
        (status = 400, description = "A filter that does not parse (`invalid_query`), or a cursor this listing did not give (`invalid_cursor`).", body = ErrorBody,
            example = json!({"error": {"code": "invalid_query", "message": "outcome `cancelled` is not one of birth_failed, death_failed, invalidated"}})),
    )
)]
pub(crate) async fn list_failures(
    State(app): State<Shared>,
    Query(query): Query<FailureQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = super::extractors::page_limit(query.limit)?;
    let outcome = match query.outcome {
        None => None,
        Some(word) => match word.parse::<store::outcome::Outcome>() {
            Ok(o) if o.is_failure() => Some(o),
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    format!(
                        "outcome `{word}` is not one of birth_failed, death_failed, invalidated"
                    ),
                ))
            }
        },
    };
    let page = app
        .store
        .failures(outcome, limit, query.cursor.as_deref())
        .await?;
    Ok(Json(page_json(page)))
}

/// A Life: its Plans (state, attempts, last error, next attempt) and its recent history.
#[utoipa::path(
    get,
    path = "/schedules/{life_uuid}",
    tag = "schedules",
    params(("life_uuid" = String, Path, description = "The Life's id.")),
    responses(
        (status = 200, description = "The Life.", body = LifeView),
        (status = 404, description = "No such Life.", body = ErrorBody),
    )
)]
pub(crate) async fn show_schedule(
    State(app): State<Shared>,
    Path(life_uuid): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match app.store.life_view(&life_uuid, 50).await? {
        Some(view) => Ok(Json(view)),
        None => Err(ApiError::not_found(format!("no Life `{life_uuid}`"))),
    }
}

/// Moves times or changes actions of Plans still Standby; validated as a booking.
#[utoipa::path(
    patch,
    path = "/schedules/{life_uuid}",
    tag = "schedules",
    params(("life_uuid" = String, Path, description = "The Life's id.")),
    request_body(content = BookingChange, description = "The fields to change."),
    responses(
        (status = 200, description = "The Life as changed.", body = LifeView),
        (status = 400, description = "As for a booking.", body = ErrorBody),
        (status = 404, description = "No such Life.", body = ErrorBody),
        (status = 406, description = "A time moved within execution_guard_time of now.", body = ErrorBody),
        (status = 409, description = "The Life is finished, a Plan to change has started, the resource overlaps another Life, or the Life kept changing.", body = ErrorBody),
    )
)]
pub(crate) async fn patch_schedule(
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
        let request: BookingRequest = booking::parse_request(&body)?;
        // Read after the plugins: naming a version still compiling waits for it.
        let known = app.bookings.registered_plugins(&request).await?;
        let now_ms = app.clock.now_ms();
        let merged = request.merge_into(&current, &app.bookings.rules(now_ms, &known))?;
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

/// `?force=` of a DELETE.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ForceQuery {
    /// `true`: end it without running anything more (a Life: not even its death).
    #[param(value_type = Option<bool>)]
    pub(crate) force: Option<String>,
}

/// Cancels a Life: before birth it becomes Stillbirth and nothing runs; a term Life that
/// is Alive has its death run now.
#[utoipa::path(
    delete,
    path = "/schedules/{life_uuid}",
    tag = "schedules",
    params(("life_uuid" = String, Path, description = "The Life's id."), ForceQuery),
    responses(
        (status = 200, description = "Cancelled.", body = Cancelled),
        (status = 400, description = "A query parameter that does not parse.", body = ErrorBody),
        (status = 404, description = "No such Life.", body = ErrorBody),
        (status = 409, description = "One of its actions is running (`plan_running`): try again when it returns.", body = ErrorBody),
    )
)]
pub(crate) async fn cancel_schedule(
    State(app): State<Shared>,
    Path(life_uuid): Path<String>,
    Query(query): Query<ForceQuery>,
) -> Result<Json<Value>, ApiError> {
    let force = flag("force", query.force.as_deref())?;
    let state = app.bookings.cancel(&life_uuid, force).await?;
    Ok(Json(json!({"life_uuid": life_uuid, "state": state})))
}
