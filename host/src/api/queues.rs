//! `/queues`: queues themselves (SPEC section 6); their tasks are in `tasks.rs`, a pull
//! queue's leases in `pull.rs`.

use super::{body_bytes, pull, tasks, App, Shared};
use crate::error::ApiError;
use crate::model::check_name;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::views::{Deleted, Purged, QueueList, QueueView};
use crate::error::ErrorBody;

use crate::queues::{parse_json, QueueBody, QueueDef, QueueMode, DEFAULT_QUEUE, TASK_TOMBSTONE_MS};

/// Whether `path` is a task route (`/queues/{q}/tasks...`, or a pull queue's
/// `/queues/{q}/lease`), which needs the `book` scope.
pub fn is_task_path(path: &str) -> bool {
    let mut parts = path.trim_start_matches('/').split('/');
    parts.next() == Some("queues")
        && parts.next().is_some()
        && matches!(parts.next(), Some("tasks" | "lease"))
}

/// The `/queues` routes.
pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(list_queues))
        .routes(routes!(show_queue, put_queue, delete_queue))
        .routes(routes!(pause_queue))
        .routes(routes!(resume_queue))
        .routes(routes!(purge_queue))
        .routes(routes!(tasks::list_tasks, tasks::add_tasks))
        .routes(routes!(tasks::list_failed))
        .routes(routes!(tasks::show_task, tasks::delete_task))
        .routes(routes!(tasks::run_task))
        .routes(routes!(pull::lease_tasks))
        .routes(routes!(pull::ack_task))
        .routes(routes!(pull::extend_task))
        .routes(routes!(pull::nack_task))
}

pub(crate) fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("no queue `{name}`"))
}

/// Loads a queue; the default queue is created on first sight.
pub(crate) async fn load_queue(app: &App, name: &str) -> Result<HashMap<String, String>, ApiError> {
    check_name("queue name", name, 100)?;
    if let Some(q) = app.store.queue_load(name).await? {
        return Ok(q);
    }
    if name == DEFAULT_QUEUE {
        app.store
            .queue_put(name, &QueueDef::default().fields(), app.clock.now_ms())
            .await?;
        if let Some(q) = app.store.queue_load(name).await? {
            return Ok(q);
        }
    }
    Err(not_found(name))
}

pub(crate) async fn queue_json(
    app: &App,
    name: &str,
    q: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let def = QueueDef::from_hash(q);
    let mode = QueueMode::of(q);
    let now_ms = app.clock.now_ms();
    let counts = app.store.queue_counts(name, now_ms).await?;
    let secs = |ms: u64| ms as f64 / 1000.0;
    let mut view = json!({
        "name": name,
        "mode": mode.as_str(),
        "state": q.get("state").cloned().unwrap_or_else(|| "running".into()),
        "rate": def.rate,
        "bucket_size": def.bucket_size,
        "max_concurrent": def.max_concurrent,
        "bucket": def.tokens_at(q, now_ms).map(|tokens| json!({"tokens": tokens, "size": def.bucket_size})),
        "key": def.key,
        "max_concurrent_per_key": def.max_concurrent_per_key,
        "rate_per_key": def.rate_per_key,
        "retry": {
            "limit": def.retry.limit,
            "age_limit": secs(def.retry.age_limit_ms),
            "min_backoff": secs(def.retry.min_backoff_ms),
            "max_backoff": secs(def.retry.max_backoff_ms),
            "max_doublings": def.retry.max_doublings,
        },
        "tasks": {"pending": counts.pending, "running": counts.running, "failed": counts.failed},
        "created_at": q.get("created_at"),
    });
    if mode == QueueMode::Pull {
        // Workers lease at their own pace: no rate or concurrency, nothing runs here.
        let obj = view.as_object_mut().expect("an object");
        for field in [
            "rate",
            "bucket_size",
            "bucket",
            "max_concurrent",
            "key",
            "max_concurrent_per_key",
            "rate_per_key",
        ] {
            obj.remove(field);
        }
        view["tasks"] =
            json!({"pending": counts.pending, "leased": counts.leased, "failed": counts.failed});
    }
    Ok(view)
}

/// Creates or changes a queue (its mode is fixed when created).
#[utoipa::path(
    put,
    path = "/queues/{name}",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name.")),
    request_body = QueueBody,
    responses(
        (status = 200, description = "The queue.", body = QueueView),
        (status = 400, description = "Not a queue name, or a setting that does not parse (`invalid_queue`).", body = ErrorBody),
        (status = 409, description = "Its mode cannot change.", body = ErrorBody),
    )
)]
pub(crate) async fn put_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", &name, 100)?;
    let body = body_bytes(body, app.config.max_body_bytes)?;
    let def = parse_json::<QueueBody>(&body)?.into_def()?;
    let created = app
        .store
        .queue_put(&name, &def.fields(), app.clock.now_ms())
        .await?;
    tracing::info!(queue = %name, created, "queue defined");
    let q = load_queue(&app, &name).await?;
    Ok(Json(queue_json(&app, &name, &q).await?))
}

#[utoipa::path(
    get,
    path = "/queues/{name}",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name.")),
    responses(
        (status = 200, description = "The queue and its task counts.", body = QueueView),
        (status = 400, description = "Not a queue name.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
    )
)]
pub(crate) async fn show_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let q = load_queue(&app, &name).await?;
    Ok(Json(queue_json(&app, &name, &q).await?))
}

#[utoipa::path(
    get,
    path = "/queues",
    tag = "queues",
    responses((status = 200, description = "Every queue (`default` always).", body = QueueList))
)]
pub(crate) async fn list_queues(State(app): State<Shared>) -> Result<Json<Value>, ApiError> {
    load_queue(&app, DEFAULT_QUEUE).await?;
    let mut items = Vec::new();
    for name in app.store.queue_names().await? {
        if let Some(q) = app.store.queue_load(&name).await? {
            items.push(queue_json(&app, &name, &q).await?);
        }
    }
    Ok(Json(json!({"items": items})))
}

/// Deletes a queue and its tasks (not `default`).
#[utoipa::path(
    delete,
    path = "/queues/{name}",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name.")),
    responses(
        (status = 200, description = "Deleted.", body = Deleted),
        (status = 400, description = "Not a queue name.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
        (status = 409, description = "The default queue, or tasks still running (`tasks_running`).", body = ErrorBody),
    )
)]
pub(crate) async fn delete_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_name("queue name", &name, 100)?;
    if name == DEFAULT_QUEUE {
        return Err(ApiError::conflict(
            "default_queue",
            "the default queue always exists; purge it instead",
        ));
    }
    if app.store.queue_load(&name).await?.is_none() {
        return Err(not_found(&name));
    }
    let (removed, left) = app
        .store
        .queue_purge(&name, true, app.clock.now_ms(), TASK_TOMBSTONE_MS)
        .await?;
    if left > 0 {
        return Err(ApiError::conflict(
            "tasks_running",
            format!("{removed} tasks removed; {left} are running now: try again when they return"),
        ));
    }
    Ok(Json(
        json!({"name": name, "deleted": true, "tasks_removed": removed}),
    ))
}

pub(crate) async fn set_state(app: &App, name: &str, state: &str) -> Result<Json<Value>, ApiError> {
    load_queue(app, name).await?;
    let found = if state == "running" {
        let now_ms = app.clock.now_ms();
        app.store
            .queue_resume(name, app.notify_before_ms(now_ms))
            .await?
    } else {
        app.store.queue_set_state(name, state).await?
    };
    if !found {
        return Err(not_found(name));
    }
    tracing::info!(queue = %name, state, "queue state changed");
    let q = load_queue(app, name).await?;
    Ok(Json(queue_json(app, name, &q).await?))
}

#[utoipa::path(
    post,
    path = "/queues/{name}/pause",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name.")),
    responses(
        (status = 200, description = "Paused: its tasks wait.", body = QueueView),
        (status = 400, description = "Not a queue name.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
    )
)]
pub(crate) async fn pause_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_state(&app, &name, "paused").await
}

#[utoipa::path(
    post,
    path = "/queues/{name}/resume",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name.")),
    responses(
        (status = 200, description = "Running again.", body = QueueView),
        (status = 400, description = "Not a queue name.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
    )
)]
pub(crate) async fn resume_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_state(&app, &name, "running").await
}

/// Removes every task of a queue but those running.
#[utoipa::path(
    post,
    path = "/queues/{name}/purge",
    tag = "queues",
    params(("name" = String, Path, description = "The queue's name.")),
    responses(
        (status = 200, description = "Purged.", body = Purged),
        (status = 400, description = "Not a queue name.", body = ErrorBody),
        (status = 404, description = "No such queue.", body = ErrorBody),
    )
)]
pub(crate) async fn purge_queue(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    load_queue(&app, &name).await?;
    let (removed, left) = app
        .store
        .queue_purge(&name, false, app.clock.now_ms(), TASK_TOMBSTONE_MS)
        .await?;
    Ok(Json(
        json!({"name": name, "tasks_removed": removed, "tasks_running": left}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_paths_need_the_book_scope() {
        assert!(is_task_path("/queues/q/tasks"));
        assert!(is_task_path("/queues/q/tasks/t/run"));
        assert!(!is_task_path("/queues/q"));
        assert!(!is_task_path("/queues/q/purge"));
    }
}
