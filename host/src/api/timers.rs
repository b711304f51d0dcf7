//! `/timers`: recurring timers, their runs, and schedule checks (SPEC section 5).

use super::{body_bytes, idempotent, App, Shared};
use crate::bookings::idempotency::Answer;
use crate::error::ApiError;
use crate::model::DEFAULT_TIMER_RETRIES;
use crate::schedule::{Checked, Schedule};
use crate::store::{self, NextRun, TimerPut};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono_tz::Tz;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extractors::Query;
use super::views::{Deleted, ScheduleCheck, TimerList, TimerRunNow, TimerRuns, TimerView};
use crate::error::ErrorBody;

use crate::model::check_name;
use crate::timers::{
    apply_settings, checked_json, empty_body, parse_body, preview_count, TimerBody, TimerDef,
    DEFAULT_PREVIEW, DEFAULT_PRIORITY,
};

/// The `/timers` routes.
pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(list_timers, create_timer))
        .routes(routes!(show_timer, patch_timer, delete_timer))
        .routes(routes!(run_timer))
        .routes(routes!(activate_timer))
        .routes(routes!(deactivate_timer))
        .routes(routes!(timer_runs))
        .routes(routes!(validate_schedule))
}

/// `POST /timers/validate`: a schedule to check, and how many of its next runs to show.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"schedule": "0 9 * * 1-5", "timezone": "America/New_York", "preview": 3}))]
pub(crate) struct ValidateBody {
    schedule: String,
    timezone: Option<String>,
    /// The instant the preview starts from (now when absent).
    from: Option<String>,
    /// 0 to 100.
    #[schema(maximum = 100)]
    preview: Option<usize>,
}

/// `POST /timers/validate {schedule, timezone, from?, preview?}`: what a timer with this
/// schedule would do, without creating one.
#[utoipa::path(
    post,
    path = "/timers/validate",
    tag = "timers",
    request_body = ValidateBody,
    responses(
        (status = 200, description = "The schedule in plain English and its next runs.", body = ScheduleCheck),
        (status = 400, description = "A schedule or zone that does not parse (`invalid_schedule`, `invalid_timezone`).", body = ErrorBody),
    )
)]
pub(crate) async fn validate_schedule(
    State(app): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let value: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    let body: ValidateBody = serde_json::from_value(value)
        .map_err(|e| crate::bookings::request::body_error("the body", "invalid_body", e))?;
    let zone = body
        .timezone
        .unwrap_or_else(|| app.config.timezone.name().to_string());
    let count = preview_count(body.preview.map(|n| n.to_string()).as_ref())?;
    let from_ms = preview_from(&app, body.from.as_ref())?;
    let checked = Checked::new(&body.schedule, &zone, from_ms, count).map_err(|e| {
        let code = if zone.parse::<Tz>().is_err() {
            "invalid_timezone"
        } else {
            "invalid_schedule"
        };
        ApiError::bad_request(code, e)
    })?;
    let mut out = checked_json(&checked);
    out["schedule"] = Value::String(body.schedule.trim().to_string());
    Ok(Json(out))
}

/// `from=T`: the instant a preview starts from (now when absent).
pub(crate) fn preview_from(app: &App, text: Option<&String>) -> Result<i64, ApiError> {
    match text {
        None => Ok(app.clock.now_ms()),
        Some(t) => crate::bookings::request::parse_time(t, app.config.timezone)
            .map(|t| t.timestamp_millis())
            .map_err(|e| ApiError::bad_request("invalid_time", format!("from: {e}"))),
    }
}

/// Applies the body's fields to `base` (a new timer's defaults, or the stored timer).
pub(crate) async fn apply(
    app: &App,
    mut body: TimerBody,
    mut def: TimerDef,
    now_ms: i64,
) -> Result<(TimerDef, Option<i64>), ApiError> {
    if let Some(action) = body.action.take() {
        def.action = app.parse_action("action", &action, now_ms).await?;
    }
    let next_run = apply_settings(body, &mut def, app.config.timezone)?;
    Ok((def, next_run))
}

pub(crate) fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("no timer `{name}`"))
}

/// Creates a recurring timer.
#[utoipa::path(
    post,
    path = "/timers",
    tag = "timers",
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeats of the call with the same key and body get the first answer.")),
    request_body(content = TimerBody, description = "The timer."),
    responses(
        (status = 200, description = "Created.", body = TimerView),
        (status = 400, description = "A missing field, a schedule, zone or action that does not parse.", body = ErrorBody),
        (status = 409, description = "A timer of that name exists (`duplicate_timer`).", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for another request.", body = ErrorBody),
    )
)]
pub(crate) async fn create_timer(
    State(app): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Answer, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let body = &body;
    let app = &app;
    idempotent(app, &headers, &[b"POST /timers", body], |key| async move {
        let Json(view) = create_timer_keyed(app, body, key).await?;
        Ok((StatusCode::OK, view))
    })
    .await
}

/// Creates a timer; under an `Idempotency-Key` (`key`), which the timer keeps in its hash
/// (`idem_key`), a timer of that name made by an earlier try of the same call is this
/// call's own.
async fn create_timer_keyed(
    app: &App,
    body: &[u8],
    key: Option<String>,
) -> Result<Json<Value>, ApiError> {
    let body = parse_body(body)?;
    let name = body
        .name
        .clone()
        .ok_or_else(|| ApiError::bad_request("missing_field", "name is required"))?;
    check_name("timer name", &name, 100)?;
    if body.schedule.is_none() {
        return Err(ApiError::bad_request(
            "missing_field",
            "schedule is required",
        ));
    }
    let Some(action) = body.action.clone() else {
        return Err(ApiError::bad_request("missing_field", "action is required"));
    };
    let now_ms = app.clock.now_ms();
    let base = TimerDef {
        schedule_text: String::new(),
        schedule: Schedule::TimesOfDay(Vec::new()),
        timezone: app.config.timezone,
        action: app.parse_action("action", &action, now_ms).await?,
        priority: DEFAULT_PRIORITY,
        timeout_ms: None,
        retries: DEFAULT_TIMER_RETRIES,
        active: true,
        policy: Default::default(),
    };
    let (def, next_run) = apply(app, body, base, now_ms).await?;
    let next = match (def.active, next_run) {
        (false, _) => NextRun::Nothing,
        (true, Some(ms)) => NextRun::At(ms, store::rfc3339(ms, def.timezone)),
        (true, None) => match def.next_after(now_ms) {
            Some(ms) => NextRun::At(ms, store::rfc3339(ms, def.timezone)),
            None => NextRun::Nothing,
        },
    };
    let mut fields = def.fields();
    fields.push((
        "created_at".into(),
        store::rfc3339(now_ms, app.config.timezone),
    ));
    if let Some(key) = &key {
        fields.push(("idem_key".into(), key.clone()));
    }
    match app
        .store
        .timer_put(
            &name,
            true,
            "",
            &next,
            false,
            &def.action_json(),
            &def.opts_json(),
            now_ms,
            app.notify_before_ms(now_ms),
            &fields,
        )
        .await?
    {
        TimerPut::Ok(_) => {}
        TimerPut::Duplicate => {
            if let Some(key) = &key {
                let made_by_this_call = app
                    .store
                    .timer_load(&name)
                    .await?
                    .is_some_and(|(hash, _)| hash.get("idem_key") == Some(key));
                if made_by_this_call {
                    return view(app, &name, DEFAULT_PREVIEW).await;
                }
            }
            return Err(ApiError::conflict(
                "duplicate_timer",
                format!("a timer named `{name}` exists; PATCH it or DELETE it first"),
            ));
        }
        other => {
            return Err(ApiError::unavailable(format!(
                "unexpected reply from timer_put: {other:?}"
            )))
        }
    }
    tracing::info!(timer = %name, schedule = %def.schedule_text, "timer created");
    view(app, &name, DEFAULT_PREVIEW).await
}

/// Changes a timer with optimistic concurrency on its `version`. `change` edits the body
/// given, `activate` is Some for the activate/deactivate routes.
pub(crate) async fn update(
    app: &App,
    name: &str,
    body: TimerBody,
) -> Result<Json<Value>, ApiError> {
    check_name("timer name", name, 100)?;
    if body.name.as_deref().is_some_and(|n| n != name) {
        return Err(ApiError::bad_request(
            "invalid_body",
            "a timer's name cannot change",
        ));
    }
    for _ in 0..5 {
        let Some((hash, _plan)) = app.store.timer_load(name).await? else {
            return Err(not_found(name));
        };
        let version = hash.get("version").cloned().unwrap_or_else(|| "0".into());
        let current = TimerDef::from_hash(name, &hash)?;
        let now_ms = app.clock.now_ms();
        let body = TimerBody {
            name: None,
            ..body.clone()
        };
        let (def, next_run) = apply(app, body, current.clone(), now_ms).await?;
        let moved = def.schedule_text != current.schedule_text
            || def.timezone != current.timezone
            || def.policy.exclude_dates != current.policy.exclude_dates
            || def.policy.dst != current.policy.dst
            || (def.active && !current.active);
        let next = match (def.active, next_run) {
            (false, _) => NextRun::Nothing,
            (true, Some(ms)) => NextRun::At(ms, store::rfc3339(ms, def.timezone)),
            (true, None) if moved => match def.next_after(now_ms) {
                Some(ms) => NextRun::At(ms, store::rfc3339(ms, def.timezone)),
                None => NextRun::Nothing,
            },
            (true, None) => NextRun::Keep,
        };
        match app
            .store
            .timer_put(
                name,
                false,
                &version,
                &next,
                next_run.is_some(),
                &def.action_json(),
                &def.opts_json(),
                now_ms,
                app.notify_before_ms(now_ms),
                &def.fields(),
            )
            .await?
        {
            TimerPut::Ok(_) => return view(app, name, DEFAULT_PREVIEW).await,
            TimerPut::Missing => return Err(not_found(name)),
            _ => continue,
        }
    }
    Err(ApiError::conflict(
        "concurrent_change",
        "the timer kept changing while this change was applied; try again",
    ))
}

/// Changes a timer; `next_run` moves its next run.
#[utoipa::path(
    patch,
    path = "/timers/{name}",
    tag = "timers",
    params(("name" = String, Path, description = "The timer's name.")),
    request_body(content = super::views::TimerChange, description = "The fields to change."),
    responses(
        (status = 200, description = "The timer as changed.", body = TimerView),
        (status = 400, description = "A field that does not parse, or another name.", body = ErrorBody),
        (status = 404, description = "No such timer.", body = ErrorBody),
        (status = 409, description = "It kept changing meanwhile.", body = ErrorBody),
    )
)]
pub(crate) async fn patch_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(body, app.config.max_body_bytes)?;
    update(&app, &name, parse_body(&body)?).await
}

pub(crate) async fn set_active(
    app: &App,
    name: &str,
    active: bool,
) -> Result<Json<Value>, ApiError> {
    let body = TimerBody {
        active: Some(active),
        ..empty_body()
    };
    update(app, name, body).await
}

#[utoipa::path(
    post,
    path = "/timers/{name}/activate",
    tag = "timers",
    params(("name" = String, Path, description = "The timer's name.")),
    responses(
        (status = 200, description = "Active: its next run is scheduled.", body = TimerView),
        (status = 400, description = "Not a timer name.", body = ErrorBody),
        (status = 404, description = "No such timer.", body = ErrorBody),
        (status = 409, description = "It kept changing meanwhile.", body = ErrorBody),
    )
)]
pub(crate) async fn activate_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_active(&app, &name, true).await
}

#[utoipa::path(
    post,
    path = "/timers/{name}/deactivate",
    tag = "timers",
    params(("name" = String, Path, description = "The timer's name.")),
    responses(
        (status = 200, description = "Inactive: it runs no more until activated.", body = TimerView),
        (status = 400, description = "Not a timer name.", body = ErrorBody),
        (status = 404, description = "No such timer.", body = ErrorBody),
        (status = 409, description = "It kept changing meanwhile.", body = ErrorBody),
    )
)]
pub(crate) async fn deactivate_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_active(&app, &name, false).await
}

/// Runs a timer now (once), besides its schedule.
#[utoipa::path(
    post,
    path = "/timers/{name}/run",
    tag = "timers",
    params(("name" = String, Path, description = "The timer's name.")),
    responses(
        (status = 200, description = "Due now.", body = TimerRunNow),
        (status = 400, description = "Not a timer name.", body = ErrorBody),
        (status = 404, description = "No such timer.", body = ErrorBody),
        (status = 409, description = "It is running now (`timer_running`).", body = ErrorBody),
    )
)]
pub(crate) async fn run_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_name("timer name", &name, 100)?;
    let now_ms = app.clock.now_ms();
    let reply = app
        .store
        .timer_run_now(&name, now_ms, app.notify_before_ms(now_ms))
        .await?;
    match reply.as_str() {
        "ok" => Ok(Json(json!({
            "name": name,
            "run_at": store::rfc3339(now_ms, app.config.timezone),
            "run_at_ms": now_ms,
        }))),
        "running" => Err(ApiError::conflict(
            "timer_running",
            format!("timer `{name}` is running now; a timer never runs twice at once, try again when it returns"),
        )),
        _ => Err(not_found(&name)),
    }
}

#[utoipa::path(
    delete,
    path = "/timers/{name}",
    tag = "timers",
    params(("name" = String, Path, description = "The timer's name.")),
    responses(
        (status = 200, description = "Deleted.", body = Deleted),
        (status = 400, description = "Not a timer name.", body = ErrorBody),
        (status = 404, description = "No such timer.", body = ErrorBody),
    )
)]
pub(crate) async fn delete_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_name("timer name", &name, 100)?;
    if app.store.timer_delete(&name).await? {
        Ok(Json(json!({"name": name, "deleted": true})))
    } else {
        Err(not_found(&name))
    }
}

/// `?preview=N&from=T` of `GET /timers/{name}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PreviewQuery {
    /// How many next runs to show, 0 to 100.
    #[param(value_type = Option<u32>, maximum = 100)]
    preview: Option<String>,
    /// Show the runs from this time on, whatever the timer's state (either time format).
    from: Option<String>,
}

/// A timer, its schedule in plain English, and its next runs.
#[utoipa::path(
    get,
    path = "/timers/{name}",
    tag = "timers",
    params(("name" = String, Path, description = "The timer's name."), PreviewQuery),
    responses(
        (status = 200, description = "The timer.", body = TimerView),
        (status = 400, description = "Not a timer name, or a query that does not parse.", body = ErrorBody),
        (status = 404, description = "No such timer.", body = ErrorBody),
    )
)]
pub(crate) async fn show_timer(
    State(app): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<PreviewQuery>,
) -> Result<Json<Value>, ApiError> {
    let preview = preview_count(query.preview.as_ref())?;
    let from = query
        .from
        .as_ref()
        .map(|from| preview_from(&app, Some(from)))
        .transpose()?;
    check_name("timer name", &name, 100)?;
    let Some((hash, plan)) = app.store.timer_load(&name).await? else {
        return Err(not_found(&name));
    };
    Ok(Json(timer_json(
        &app,
        &name,
        &hash,
        &plan,
        app.clock.now_ms(),
        preview,
        from,
    )))
}

#[utoipa::path(
    get,
    path = "/timers",
    tag = "timers",
    params(TimerListQuery),
    responses(
        (status = 200, description = "A page of timers by name; `next_cursor` goes on from its last.", body = TimerList),
        (status = 400, description = "A limit that is not 1 to 1000 (`invalid_query`).", body = ErrorBody),
    )
)]
pub(crate) async fn list_timers(
    State(app): State<Shared>,
    Query(query): Query<TimerListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = super::extractors::page_limit(query.limit)?;
    let now_ms = app.clock.now_ms();
    let (timers, next_cursor) = app.store.timer_page(query.cursor.as_deref(), limit).await?;
    let items: Vec<Value> = timers
        .into_iter()
        .map(|(name, hash, plan)| timer_json(&app, &name, &hash, &plan, now_ms, 0, None))
        .collect();
    Ok(Json(json!({"items": items, "next_cursor": next_cursor})))
}

/// A page of `GET /timers`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct TimerListQuery {
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the page before: the timers named after it.
    cursor: Option<String>,
}

/// `?limit=N&outcome=` of a timer's runs.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunsQuery {
    /// How many, newest first (at most as many as are kept).
    #[param(minimum = 0)]
    pub(crate) limit: Option<u32>,
    /// Only the runs that ended so (`failed`: its failures), among the last 200 kept.
    #[param(value_type = Option<super::views::RunOutcome>)]
    pub(crate) outcome: Option<String>,
}

/// The words of a run's `outcome`.
const RUN_OUTCOMES: [&str; 8] = [
    "success",
    "retry",
    "failed",
    "skipped",
    "interrupted",
    "cancelled",
    "expired",
    "invalidated",
];

/// A timer's recent runs: should-have-run-at, started-at, duration, host, outcome.
#[utoipa::path(
    get,
    path = "/timers/{name}/runs",
    tag = "timers",
    params(("name" = String, Path, description = "The timer's name."), RunsQuery),
    responses(
        (status = 200, description = "Its runs, newest first.", body = TimerRuns),
        (status = 400, description = "Not a timer name, a limit that is not a number, or an outcome that is none (`invalid_query`).", body = ErrorBody),
        (status = 404, description = "No such timer.", body = ErrorBody),
    )
)]
pub(crate) async fn timer_runs(
    State(app): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<RunsQuery>,
) -> Result<Json<Value>, ApiError> {
    check_name("timer name", &name, 100)?;
    let limit = (query.limit.unwrap_or(50) as usize).clamp(1, store::TIMER_RUNS_KEPT);
    if let Some(word) = query.outcome.as_deref() {
        if !RUN_OUTCOMES.contains(&word) {
            return Err(ApiError::bad_request(
                "invalid_query",
                format!("outcome `{word}` is not one of {}", RUN_OUTCOMES.join(", ")),
            ));
        }
    }
    if app.store.timer_load(&name).await?.is_none() {
        return Err(not_found(&name));
    }
    let tz = app.config.timezone;
    // With an outcome, every run kept is read and the newest that match are answered.
    let read = match query.outcome {
        Some(_) => store::TIMER_RUNS_KEPT,
        None => limit,
    };
    let items: Vec<Value> = app
        .store
        .timer_runs(&name, read)
        .await?
        .into_iter()
        .filter(|r| {
            query
                .outcome
                .as_deref()
                .is_none_or(|o| r.get("outcome").and_then(Value::as_str) == Some(o))
        })
        .take(limit)
        .map(|mut r| {
            // As in a Life's history: `name` the time as text, `name_ms` in epoch ms.
            for field in ["should_run_at", "started_at", "last_should_run_at"] {
                if let Some(ms) = r.get(field).and_then(Value::as_i64) {
                    r[format!("{field}_ms")] = Value::from(ms);
                    r[field] = Value::String(store::rfc3339(ms, tz));
                }
            }
            r
        })
        .collect();
    Ok(Json(json!({"name": name, "items": items})))
}

pub(crate) async fn view(app: &App, name: &str, preview: usize) -> Result<Json<Value>, ApiError> {
    check_name("timer name", name, 100)?;
    let Some((hash, plan)) = app.store.timer_load(name).await? else {
        return Err(not_found(name));
    };
    Ok(Json(timer_json(
        app,
        name,
        &hash,
        &plan,
        app.clock.now_ms(),
        preview,
        None,
    )))
}

pub(crate) fn timer_json(
    app: &App,
    name: &str,
    hash: &HashMap<String, String>,
    plan: &HashMap<String, String>,
    now_ms: i64,
    preview: usize,
    preview_from: Option<i64>,
) -> Value {
    let text = |k: &str| {
        hash.get(k)
            .cloned()
            .map(Value::String)
            .unwrap_or(Value::Null)
    };
    let num = |k: &str| {
        hash.get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .map(Value::from)
            .unwrap_or(Value::Null)
    };
    let mut out = json!({
        "name": name,
        "schedule": text("schedule"),
        "timezone": text("timezone"),
        "action": hash.get("action").and_then(|a| serde_json::from_str::<Value>(a).ok()),
        "priority": num("priority"),
        "timeout_ms": num("timeout_ms"),
        "retries": num("retries"),
        "active": hash.get("active").map(String::as_str) == Some("1"),
        "state": plan.get("state").cloned().unwrap_or_else(|| "Inactive".into()),
        "next_run": text("next_run"),
        "next_run_ms": num("next_run_ms"),
        "last_run_at_ms": num("last_run_at_ms"),
        "last_outcome": hash.get("last_outcome").map(|o| crate::timers::last_outcome(o)),
        "created_at": text("created_at"),
        "version": num("version"),
    });
    if let Ok(def) = TimerDef::from_hash(name, hash) {
        out["description"] = Value::String(def.schedule.describe());
        if let (Value::Object(out), Value::Object(policy)) = (&mut out, def.policy_json()) {
            out.extend(policy);
        }
        out["dst_rule"] = Value::from(match def.schedule.clock() {
            crate::schedule::Clock::WallClock => "wall_clock",
            crate::schedule::Clock::Elapsed => "elapsed",
        });
    }
    if preview > 0 {
        if let Ok(def) = TimerDef::from_hash(name, hash) {
            // From `?from=` the schedule is shown whatever the timer's state, to check a
            // DST date or a holiday; otherwise the runs an active timer will make.
            let times = match preview_from {
                Some(from) => def.calendar().preview(from, preview),
                None if def.active => def.calendar().preview(now_ms, preview),
                None => Vec::new(),
            };
            out["preview"] = times
                .iter()
                .map(|ms| Value::String(store::rfc3339(*ms, def.timezone)))
                .collect();
            out["preview_ms"] = times.into_iter().map(Value::from).collect();
        }
    }
    let _ = app;
    out
}
