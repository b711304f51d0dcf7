//! `/schedules`: booking, listing, showing, changing and cancelling Lives.

use crate::bookings::request::{self as booking, BookingRequest};
use crate::error::ApiError;
use crate::store::{self, ListFilter};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;

use super::{body_bytes, idempotent, App, Shared};
use crate::bookings::idempotency::Answer;
use axum::http::{HeaderMap, StatusCode};

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
    idempotent(
        app,
        headers,
        &[b"POST /schedules", body],
        |key| async move {
            let booked = app.bookings.book_json_keyed(body, key.as_deref()).await?;
            tracing::debug!(life_uuid = %booked.life.life_uuid, debounced = booked.debounced, "booked");
            let mut view = store::booked_view(&booked.life, app.config.timezone);
            if booked.debounced {
                view["debounced"] = true.into();
            }
            Ok((StatusCode::OK, view))
        },
    )
    .await
}

pub(crate) fn parse_query_time(name: &str, text: &str, app: &App) -> Result<i64, ApiError> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    booking::parse_time(text, app.config.timezone)
        .map(|t| t.timestamp_millis())
        .map_err(|e| ApiError::bad_request("invalid_query", format!("{name}: {e}")))
}

pub(crate) async fn list_schedules(
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

pub(crate) async fn show_schedule(
    State(app): State<Shared>,
    Path(life_uuid): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match app.store.life_view(&life_uuid, 50).await? {
        Some(view) => Ok(Json(view)),
        None => Err(ApiError::not_found(format!("no Life `{life_uuid}`"))),
    }
}

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

pub(crate) async fn cancel_schedule(
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
