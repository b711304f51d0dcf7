//! `PUT /plugins/{name}`, `GET /plugins`, `GET /plugins/{name}`, `DELETE /plugins/{name}`.
//!
//! An upload is the component's bytes as the body, with its limits as query parameters:
//! `allowed_hosts=host:port,host` (the hosts it may call; none when absent), `memory_mb`
//! (1..=1024, default `plugin_memory_mb`) and `timeout` (seconds or `500ms`, at most
//! 5 minutes, default `plugin_timeout`); a new version of a plugin keeps the limits of
//! the version before for what its query leaves out (`allowed_hosts=` clears the list). It is compiled and linked against the
//! `kairos:plugin/action` world before it is stored, so a file that could never run is
//! a 400 at upload rather than a failed Plan later.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use super::schedules::ForceQuery;
use super::views::{Deleted, PluginList, PluginUsage, PluginView};
use super::{body_bytes, Shared};
use crate::config::parse_duration;
use crate::error::{ApiError, ErrorBody};
use crate::plugins::registry::PluginMeta;
use crate::plugins::registry::{valid_name, DeleteOutcome, PluginState, UploadLimits};
use crate::plugins::runtime::MAX_MEMORY_MB;

/// How long an upload waits for its component to compile before it answers: past it
/// the version is registered `compiling` (202) and its compile goes on. A component
/// under [`SMALL_COMPONENT`] (a Rust plugin: well under a second to compile) is waited
/// for up to [`SMALL_UPLOAD_WAIT`] instead, so that on a loaded machine an unusable one
/// is still refused with a 400 rather than registered and marked `failed`.
const UPLOAD_WAIT: Duration = Duration::from_millis(1000);
const SMALL_COMPONENT: usize = 4 << 20;
const SMALL_UPLOAD_WAIT: Duration = Duration::from_secs(20);

/// The longest `timeout` a plugin may have.
pub const MAX_PLUGIN_TIMEOUT: Duration = Duration::from_secs(300);

pub fn routes(max_plugin_bytes: usize) -> OpenApiRouter<Shared> {
    OpenApiRouter::new().routes(routes!(list_plugins)).routes(
        routes!(show_plugin, upload_plugin, delete_plugin)
            .layer(DefaultBodyLimit::max(max_plugin_bytes)),
    )
}

fn check_name(name: &str) -> Result<(), ApiError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "invalid_plugin_name",
            format!("`{name}`: a plugin name is 1 to 64 of a-z, 0-9, - and _, starting with a letter or digit"),
        ))
    }
}

/// Reads an upload's query (`allowed_hosts`, `memory_mb`, `timeout`) over the host's
/// defaults; 400 `invalid_query` naming what is wrong.
pub fn upload_limits(
    query: &HashMap<String, String>,
    default_memory_mb: u32,
    default_timeout: Duration,
) -> Result<UploadLimits, ApiError> {
    let base = UploadLimits {
        allowed_hosts: Vec::new(),
        memory_mb: default_memory_mb,
        timeout_ms: default_timeout.as_millis() as u64,
    };
    upload_limits_over(query, base)
}

/// Reads an upload's query over `base`: what the query leaves out stays as it was.
fn upload_limits_over(
    query: &HashMap<String, String>,
    mut limits: UploadLimits,
) -> Result<UploadLimits, ApiError> {
    let invalid = |m: String| ApiError::bad_request("invalid_query", m);
    for (name, value) in query {
        match name.as_str() {
            "allowed_hosts" => {
                crate::config::parse_allowed_hosts(value).map_err(|e| invalid(e.0))?;
                limits.allowed_hosts = value
                    .split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty())
                    .collect();
            }
            "memory_mb" => {
                limits.memory_mb = value
                    .parse::<u32>()
                    .ok()
                    .filter(|m| (1..=MAX_MEMORY_MB).contains(m))
                    .ok_or_else(|| {
                        invalid(format!(
                            "memory_mb `{value}` is not a number from 1 to {MAX_MEMORY_MB}"
                        ))
                    })?;
            }
            "timeout" => {
                let t = parse_duration(value, Duration::from_secs(1))
                    .map_err(|e| invalid(format!("timeout: {e}")))?;
                if t.is_zero() || t > MAX_PLUGIN_TIMEOUT {
                    return Err(invalid(format!(
                        "timeout `{value}` must be more than 0 and at most {} s",
                        MAX_PLUGIN_TIMEOUT.as_secs()
                    )));
                }
                limits.timeout_ms = t.as_millis() as u64;
            }
            other => {
                return Err(invalid(format!(
                "unknown parameter `{other}`; an upload takes allowed_hosts, memory_mb and timeout"
            )))
            }
        }
    }
    Ok(limits)
}

/// Uploads a new version of a plugin: the component's bytes as the body, its limits as
/// query parameters (a new version keeps the last one's for what the query leaves out).
#[utoipa::path(
    put,
    path = "/plugins/{name}",
    tag = "plugins",
    params(
        ("name" = String, Path, description = "1 to 64 of a-z, 0-9, - and _, starting with a letter or digit."),
        ("allowed_hosts" = Option<String>, Query, description = "`host:port,host`: the hosts it may call (none when absent; empty clears)."),
        ("memory_mb" = Option<u32>, Query, minimum = 1, maximum = 1024, description = "Its memory limit (default plugin_memory_mb)."),
        ("timeout" = Option<String>, Query, description = "Its wall-time limit, seconds or e.g. `500ms`, at most 5 minutes (default plugin_timeout)."),
    ),
    request_body(content = inline(super::views::ComponentBytes), content_type = "application/octet-stream", description = "A WebAssembly component (any content type is read as bytes) built for wasm32-wasip2 against the kairos:plugin/action world."),
    responses(
        (status = 201, description = "Stored as a new version, compiled and ready.", body = PluginMeta),
        (status = 202, description = "Stored as a new version still compiling (`state`: `compiling`; a large component compiles for several seconds): it becomes the latest once compiled, or `failed` with its `error`; bookings naming it wait for it.", body = PluginMeta),
        (status = 400, description = "A bad name or query, or bytes that are not a component of the world, or whose declared input schema is not JSON Schema (`invalid_plugin`).", body = ErrorBody),
    )
)]
async fn upload_plugin(
    State(app): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<axum::response::Response, ApiError> {
    check_name(&name)?;
    // A new version keeps the limits of the one before unless the query changes them,
    // so that a re-upload of new code does not silently reset them to the host's
    // defaults.
    let previous = app.plugins.registry().versions(&name).await?.pop();
    let limits = match previous {
        Some(p) => upload_limits_over(
            &query,
            UploadLimits {
                allowed_hosts: p.allowed_hosts,
                memory_mb: p.memory_mb,
                timeout_ms: p.timeout_ms,
            },
        )?,
        None => upload_limits(
            &query,
            app.config.plugin_memory_mb,
            app.config.plugin_timeout,
        )?,
    };
    let body = body_bytes(body, app.config.max_plugin_bytes)?;
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_plugin",
            "the body must be the component's bytes (a .wasm file built for wasm32-wasip2)",
        ));
    }
    // Compiled code is reused by digest (another name, an upload before a restart), and
    // what is compiled here is kept prepared before the version is registered. A large
    // component (a JavaScript or Python one: 13-19 MB, several seconds of compiling) is
    // registered `compiling` once UPLOAD_WAIT has passed and the answer goes out; its
    // compile goes on and promotes it (or marks it failed) when it ends.
    let digest = crate::plugins::registry::digest_of(&body);
    let mut compile = {
        let (plugins, digest, bytes) = (app.plugins.clone(), digest.clone(), body.to_vec());
        let (memory_mb, timeout_ms) = (limits.memory_mb, limits.timeout_ms);
        tokio::spawn(async move { plugins.check(&digest, bytes, memory_mb, timeout_ms).await })
    };
    let wait = if body.len() < SMALL_COMPONENT {
        SMALL_UPLOAD_WAIT
    } else {
        UPLOAD_WAIT
    };
    let compiled = match tokio::time::timeout(wait, &mut compile).await {
        Ok(joined) => Some(
            joined
                .unwrap_or_else(|e| Err(format!("the compile stopped: {e}")))
                .map_err(|why| ApiError::bad_request("invalid_plugin", why))?,
        ),
        Err(_) => None,
    };
    let state = match compiled {
        Some(_) => PluginState::Ready,
        None => PluginState::Compiling,
    };
    let now_ms = app.clock.now_ms();
    let uploaded_at = app.store.fmt_time(now_ms);
    let meta = app
        .plugins
        .registry()
        .put(
            &name,
            &body,
            compiled.as_ref().and_then(|c| c.input_schema.as_deref()),
            state,
            &limits,
            &uploaded_at,
            now_ms,
        )
        .await?;
    tracing::info!(
        plugin = %name,
        version = meta.version,
        digest = %meta.digest,
        code = compiled.as_ref().map_or("compiling", |c| c.how.as_str()),
        "plugin uploaded"
    );
    if state == PluginState::Compiling {
        let (app, name, version, digest) = (app.clone(), name.clone(), meta.version, digest);
        tokio::spawn(async move {
            let outcome = compile
                .await
                .unwrap_or_else(|e| Err(format!("the compile stopped: {e}")))
                .map(|c| c.input_schema);
            let written = app
                .plugins
                .registry()
                .promote(
                    &name,
                    version,
                    &digest,
                    outcome
                        .as_ref()
                        .map(|s| s.as_deref())
                        .map_err(String::as_str),
                )
                .await;
            match (&outcome, written) {
                (_, Ok(false)) => {}
                (Ok(_), Ok(true)) => {
                    tracing::info!(plugin = %name, version, "plugin compiled; ready")
                }
                (Err(why), Ok(true)) => {
                    tracing::warn!(plugin = %name, version, error = %why, "an uploaded plugin cannot be used")
                }
                (_, Err(e)) => {
                    tracing::warn!(plugin = %name, version, error = %e.message, "cannot record a plugin's compile; another host will")
                }
            }
        });
    }
    let object = format!(
        "plugin={name} version={} digest={}",
        meta.version, meta.digest
    );
    let status = match state {
        PluginState::Ready => StatusCode::CREATED,
        _ => StatusCode::ACCEPTED,
    };
    let mut response = (status, Json(json!(meta))).into_response();
    response
        .extensions_mut()
        .insert(super::auth::Audited(object));
    Ok(response)
}

/// Who uses each of `names`: unfinished Lives and timers, read at once, inside Redis
/// (`plugin_users`: DELETE refuses on the two together).
async fn usage(app: &Shared, names: &[&str]) -> Result<Vec<PluginUsage>, ApiError> {
    let users =
        futures_util::future::try_join_all(names.iter().map(|n| app.store.plugin_users(n))).await?;
    Ok(users
        .into_iter()
        .map(|(unfinished_lives, timers)| PluginUsage {
            unfinished_lives,
            timers,
        })
        .collect())
}

/// Every plugin's latest version, with the unfinished Lives and timers that use it.
#[utoipa::path(
    get,
    path = "/plugins",
    tag = "plugins",
    responses((status = 200, description = "The plugins.", body = PluginList))
)]
async fn list_plugins(State(app): State<Shared>) -> Result<Json<Value>, ApiError> {
    let plugins = app.plugins.registry().list().await?;
    let names: Vec<&str> = plugins.iter().map(|p| p.name.as_str()).collect();
    let usage = usage(&app, &names).await?;
    let plugins: Vec<Value> = plugins
        .iter()
        .zip(usage)
        .map(|(p, u)| {
            let mut item = json!(p);
            item["unfinished_lives"] = json!(u.unfinished_lives);
            item["timers"] = json!(u.timers);
            item
        })
        .collect();
    Ok(Json(json!({ "plugins": plugins })))
}

/// A plugin's latest version, every version, and the unfinished Lives and timers that
/// use it.
#[utoipa::path(
    get,
    path = "/plugins/{name}",
    tag = "plugins",
    params(("name" = String, Path, description = "The plugin's name.")),
    responses(
        (status = 200, description = "The plugin.", body = PluginView),
        (status = 400, description = "Not a plugin name.", body = ErrorBody),
        (status = 404, description = "No such plugin.", body = ErrorBody),
    )
)]
async fn show_plugin(
    State(app): State<Shared>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_name(&name)?;
    let versions = app.plugins.registry().versions(&name).await?;
    let Some(latest) = versions.last() else {
        return Err(ApiError::not_found(format!("no plugin `{name}`")));
    };
    let mut view = json!(latest);
    view["versions"] = json!(versions);
    let u = usage(&app, &[&name]).await?.remove(0);
    view["unfinished_lives"] = json!(u.unfinished_lives);
    view["timers"] = json!(u.timers);
    Ok(Json(view))
}

/// Deletes a plugin, every version; refused while unfinished Lives or timers use it,
/// unless `force=true`.
#[utoipa::path(
    delete,
    path = "/plugins/{name}",
    tag = "plugins",
    params(("name" = String, Path, description = "The plugin's name."), ForceQuery),
    responses(
        (status = 200, description = "Deleted.", body = Deleted),
        (status = 400, description = "Not a plugin name, or a query that does not parse.", body = ErrorBody),
        (status = 404, description = "No such plugin.", body = ErrorBody),
        (status = 409, description = "Unfinished Lives or timers use it (`plugin_in_use`).", body = ErrorBody),
    )
)]
async fn delete_plugin(
    State(app): State<Shared>,
    Path(name): Path<String>,
    super::extractors::Query(query): super::extractors::Query<ForceQuery>,
) -> Result<Json<Value>, ApiError> {
    check_name(&name)?;
    let force = super::extractors::flag("force", query.force.as_deref())?;
    let (lives, timers) = app.store.plugin_users(&name).await?;
    let unfinished = lives + timers.len() as u64;
    match app
        .plugins
        .registry()
        .delete(&name, force, unfinished)
        .await?
    {
        DeleteOutcome::Missing => Err(ApiError::not_found(format!("no plugin `{name}`"))),
        DeleteOutcome::InUse { unfinished } => Err(ApiError::conflict(
            "plugin_in_use",
            format!("{unfinished} unfinished Lives or timers use plugin `{name}`; cancel or change them first, or delete with ?force=true (queue tasks are not counted)"),
        )),
        DeleteOutcome::Deleted { unfinished } => {
            tracing::info!(plugin = %name, unfinished, "plugin deleted");
            Ok(Json(json!({ "name": name, "deleted": true, "unfinished_lives": unfinished })))
        }
    }
}
