//! Reading and validating bookings (SPEC section 2).
//!
//! A `POST /schedules` body becomes a [`NewLife`] here, or an [`ApiError`] with the spec's
//! status and code. Checks run in the order of the spec's validation table: shape, times
//! and required fields (400), term order and minimum term (400), the execution guard
//! (406). The checks that need Redis (resource overlap, duplicate id: 409) run atomically
//! in the store's booking script.

use std::collections::BTreeMap;

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;
use http::{Method, Uri};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::model::{Action, Callbacks, NewLife, PluginAction, ScheduleType, WebhookAction};
pub use crate::plugins::registry::KnownPlugins;
use crate::store::IdOrigin;

/// What validation needs from the host's configuration and the moment.
pub struct Rules<'a> {
    pub timezone: Tz,
    pub minimum_life_term_ms: i64,
    pub execution_guard_ms: i64,
    pub now_ms: i64,
    pub gateway_configured: bool,
    /// The registered plugins the request names (`name` or `name@version`), with their
    /// input schemas.
    pub plugins: &'a KnownPlugins,
    /// The outbound policy, for URLs whose host is a literal address it refuses (None:
    /// not checked here).
    pub policy: Option<&'a crate::outbound::OutboundPolicy>,
    /// Where Lives are stored: a generated id lands in its resource's shard.
    pub placement: crate::store::Placement,
}

/// `term` of a booking: its two times (or give them flat, not both).
#[derive(Debug, Default, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TermTimes {
    /// `YYYY-MM-DD HH:MM:SS` in the host's timezone, or RFC 3339 with an offset.
    #[schema(example = "2026-12-15 15:05:00")]
    birth_time: Option<String>,
    #[schema(example = "2026-12-15 15:08:00")]
    death_time: Option<String>,
}

// The body of `POST /schedules` and `PATCH /schedules/{id}` (documented as
// `api::views::BookingChange` there). The doc comment below is the OpenAPI document's
// description of a new booking.
/// A booking, in either spelling: times in `term` or flat (`birth_time`, `death_time`),
/// actions as `birth`/`death` or `birth_action`/`death_action` (one field in both
/// spellings is refused). A birth action is required, and a birth time unless the
/// booking is debounced; a death time and action make a term. An unknown field is
/// refused (400 `unknown_field`): a typo such as `resource_idd` must never book a Life
/// without its conflict guard.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = BookingCreate, example = json!({
    "life_uuid": "6f69aeb63e9b11eb93a8acde48001122",
    "schedule_type": "term",
    "resource_id": "conn-42",
    "term":  {"birth_time": "2026-12-15 15:05:00", "death_time": "2026-12-15 15:08:00"},
    "birth": {"path": "/tasks", "method": "POST", "body": {"id": "a0", "method": "activate"}},
    "death": {"path": "/tasks", "method": "POST", "body": {"id": "a0", "method": "deactivate"}}
}))]
pub struct BookingRequest {
    /// 1 to 64 letters, digits, `-` or `_`, not `batch` (a route of its own); generated (32
    /// hex characters) when absent.
    #[schema(example = "6f69aeb63e9b11eb93a8acde48001122")]
    life_uuid: Option<String>,
    /// `point` (one action) or `term` (a birth and a death); `term` when a death time is
    /// given, else `point`.
    #[schema(value_type = Option<ScheduleTypeName>, example = "term")]
    schedule_type: Option<String>,
    /// Lives of one resource never overlap (409) and never run at once.
    #[schema(example = "conn-42")]
    resource_id: Option<String>,
    term: Option<TermTimes>,
    /// `YYYY-MM-DD HH:MM:SS` in the host's timezone, or RFC 3339 with an offset.
    #[schema(example = "2026-12-15 15:05:00")]
    birth_time: Option<String>,
    /// A term's end, written as `birth_time`.
    #[schema(example = "2026-12-15 15:08:00")]
    death_time: Option<String>,
    /// The birth action (also spelled `birth_action`).
    #[schema(value_type = Option<RawAction>)]
    birth: Option<Value>,
    /// A term's death action (also spelled `death_action`).
    #[schema(value_type = Option<RawAction>)]
    death: Option<Value>,
    #[schema(value_type = Option<RawAction>)]
    birth_action: Option<Value>,
    #[schema(value_type = Option<RawAction>)]
    death_action: Option<Value>,
    /// Point bookings only: bookings under one key within `period` make one Life.
    #[schema(value_type = Option<DebounceBody>)]
    debounce: Option<Value>,
}

/// `debounce` of a point booking, as written.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DebounceBody {
    /// 1 to 256 characters.
    key: String,
    /// The Life fires this long after the last booking of its key.
    #[schema(value_type = DurationValue)]
    period: Value,
    /// ...but never later than this after the first (default: an hour, or `period`).
    #[schema(value_type = Option<DurationValue>)]
    max_wait: Option<Value>,
}

/// A duration as the API reads it: a number of seconds (fractions allowed) or a string
/// with units (`"500ms"`, `"30s"`, `"3m"`, `"1h 30m"`).
pub struct DurationValue;

impl utoipa::PartialSchema for DurationValue {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Number)
                    .minimum(Some(0))
                    .description(Some("seconds")),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .examples([serde_json::json!("500ms")])
                    .description(Some("a number with units, e.g. 500ms, 30s, 3m")),
            )
            .description(Some(
                "A number of seconds, or a string with units such as \"500ms\", \"30s\", \"3m\".",
            ))
            .into()
    }
}

impl utoipa::ToSchema for DurationValue {
    fn name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
}

/// Any JSON value (an object, a list, a string, a number, a boolean or null): shown as
/// the empty schema `{}`, which generated clients type as "any", where `type: object`
/// would make them refuse everything but an object without fields.
pub struct AnyJson;

impl utoipa::PartialSchema for AnyJson {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, SchemaType};
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some("Any JSON value."))
            .into()
    }
}

impl utoipa::ToSchema for AnyJson {
    fn name() -> std::borrow::Cow<'static, str> {
        "AnyJson".into()
    }
}

/// `point` (one action) or `term` (a birth and a death).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = ScheduleType)]
#[allow(dead_code)]
pub enum ScheduleTypeName {
    Point,
    Term,
}

/// The HTTP methods an action or a deferred request may use (read in any case).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[allow(dead_code, clippy::upper_case_acronyms)]
pub enum HttpMethod {
    GET,
    HEAD,
    POST,
    PUT,
    PATCH,
    DELETE,
    OPTIONS,
}

/// The methods of [`HttpMethod`], as the API reads them (upper case).
pub const HTTP_METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// A booking's debounce window (Inngest's and Trigger.dev's semantics): while a Life
/// booked under `key` has not started, a booking under the same key replaces its action
/// and moves it to now + `period_ms`, but never past its first booking + `max_wait_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debounce {
    pub key: String,
    pub period_ms: i64,
    pub max_wait_ms: i64,
}

/// The longest debounce period or max_wait.
const MAX_DEBOUNCE_MS: u64 = 30 * 86_400_000;
/// max_wait when none is given: an hour, or the period when that is longer.
const DEFAULT_MAX_WAIT_MS: i64 = 3_600_000;

// Action fields as written by a client; `deny_unknown_fields` turns a typo such as
// `retry_cont` into a 400 instead of a silently ignored setting. The doc comment below
// is the OpenAPI document's description.
/// An action. A webhook: `path` (under the host's gateway URL) or `url`, `method`, and
/// optionally `headers`, `body`, timeouts and retries. A plugin: `plugin` (`name` or
/// `name@version`), `input`, `timeout` and retries. Either may carry `on_success` /
/// `on_failure` callbacks. An unknown field is refused (400 `unknown_field`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Action, example = json!({"path": "/tasks", "method": "POST", "body": {"id": "a0", "method": "activate"}}))]
pub struct RawAction {
    /// Webhook: a path under the host's `gateway_url`, starting with `/`.
    #[schema(example = "/tasks")]
    path: Option<String>,
    /// Webhook: an absolute http(s) URL that the outbound policy allows.
    url: Option<String>,
    /// Webhook: the HTTP method (required for a webhook; read in any case).
    #[schema(value_type = Option<HttpMethod>, example = "POST")]
    method: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    /// Webhook: the body, any JSON value (a string is sent as it is).
    #[schema(value_type = AnyJson, required = false)]
    body: Option<Value>,
    #[schema(value_type = Option<DurationValue>)]
    connect_timeout: Option<Value>,
    #[schema(value_type = Option<DurationValue>)]
    request_timeout: Option<Value>,
    /// Retries after a failed attempt (at most 1000).
    #[schema(maximum = 1000)]
    retry_count: Option<u32>,
    #[schema(value_type = Option<DurationValue>)]
    retry_interval: Option<Value>,
    /// Plugin: `name` or `name@version` of a registered plugin.
    plugin: Option<String>,
    /// Plugin: its input, any JSON value.
    #[schema(value_type = AnyJson, required = false)]
    input: Option<Value>,
    /// Plugin: its wall-time limit.
    #[schema(value_type = Option<DurationValue>)]
    timeout: Option<Value>,
    /// An action run once when this one finishes for good after a success, with the
    /// outcome as its body or input (so it takes neither, nor callbacks of its own).
    #[schema(value_type = Option<RawAction>, no_recursion)]
    on_success: Option<Value>,
    /// An action run once when this one fails for good, with the outcome as its body or
    /// input.
    #[schema(value_type = Option<RawAction>, no_recursion)]
    on_failure: Option<Value>,
}

/// Longest retry_count accepted: more is almost certainly a mistake.
const MAX_RETRY_COUNT: u32 = 1000;

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(code, message)
}

/// Parses a request body as JSON into a [`BookingRequest`].
impl BookingRequest {
    /// The plugin specs (`name` or `name@version`) the request's actions name.
    pub fn plugin_specs(&self) -> Vec<String> {
        [
            &self.birth,
            &self.death,
            &self.birth_action,
            &self.death_action,
        ]
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("plugin").and_then(Value::as_str).map(String::from))
        .collect()
    }
}

pub fn parse_request(body: &[u8]) -> Result<BookingRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| bad("invalid_json", format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(bad("invalid_body", "the body must be a JSON object"));
    }
    let request: BookingRequest =
        serde_json::from_value(value).map_err(|e| body_error("the body", "invalid_body", e))?;
    request.one_spelling_each()?;
    Ok(request)
}

/// A body that does not fit its type: 400 `unknown_field` naming a field the type does
/// not have, else `code` (a field of the wrong type, a missing one).
pub fn body_error(what: &str, code: &'static str, e: serde_json::Error) -> ApiError {
    let text = e.to_string();
    if let Some(rest) = text.strip_prefix("unknown field `") {
        let field = rest.split('`').next().unwrap_or_default();
        let known = rest
            .split_once("expected one of ")
            .or_else(|| rest.split_once("expected "))
            .map(|(_, k)| format!(" (known fields: {})", k.replace('`', "")))
            .unwrap_or_default();
        return bad(
            "unknown_field",
            format!("{what} has an unknown field `{field}`{known}"),
        );
    }
    bad(code, format!("{what} does not fit: {text}"))
}

/// Reads a time as `%Y-%m-%d %H:%M:%S` in `tz`, or as RFC 3339 with an offset.
pub fn parse_time(text: &str, tz: Tz) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").map_err(|_| {
        format!("`{text}` is not a time: use `YYYY-MM-DD HH:MM:SS` (in {tz}) or RFC 3339 with an offset")
    })?;
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(t) => Ok(t.with_timezone(&Utc)),
        // An autumn hour that happens twice: the first one, as a person reading a clock
        // would first reach it.
        LocalResult::Ambiguous(first, _) => Ok(first.with_timezone(&Utc)),
        LocalResult::None => Err(format!(
            "`{text}` does not exist in {tz} (it falls in a daylight-saving gap); give an RFC 3339 time with an offset"
        )),
    }
}

/// Longest duration an action field accepts: anything longer is a mistake, and bounding
/// it keeps every sum of times and lock expiries in range.
const MAX_ACTION_DURATION_SECS: u64 = 86_400;

/// Reads a duration given as seconds (fractions allowed) or a string such as `500ms`;
/// at most a day.
fn parse_seconds(field: &str, value: &Value) -> Result<u64, ApiError> {
    let duration = parse_duration_value(field, value)?;
    if duration.as_secs() > MAX_ACTION_DURATION_SECS
        || (duration.as_secs() == MAX_ACTION_DURATION_SECS && duration.subsec_nanos() > 0)
    {
        return Err(bad(
            "invalid_duration",
            format!("{field} must be at most {MAX_ACTION_DURATION_SECS} seconds (one day)"),
        ));
    }
    Ok(duration.as_millis() as u64)
}

/// Reads a duration given as seconds (fractions allowed) or a string such as `500ms`,
/// with no upper bound (400 `invalid_duration` otherwise).
pub(crate) fn parse_duration_value(
    field: &str,
    value: &Value,
) -> Result<std::time::Duration, ApiError> {
    let text = match value {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        _ => {
            return Err(bad(
                "invalid_duration",
                format!("{field} must be a number of seconds or a string such as \"500ms\""),
            ))
        }
    };
    crate::config::parse_duration(&text, std::time::Duration::from_secs(1))
        .map_err(|e| bad("invalid_duration", format!("{field}: {e}")))
}

fn opt_seconds(field: &str, value: &Option<Value>) -> Result<Option<u64>, ApiError> {
    value.as_ref().map(|v| parse_seconds(field, v)).transpose()
}

/// Checks and normalizes one action. `which` is `birth` or `death`, for messages.
pub fn parse_action(which: &str, value: &Value, rules: &Rules) -> Result<Action, ApiError> {
    if !value.is_object() {
        return Err(bad("invalid_action", format!("{which} must be an object")));
    }
    let raw: RawAction = serde_json::from_value(value.clone())
        .map_err(|e| body_error(which, "invalid_action", e))?;
    let retry_count = raw.retry_count.unwrap_or(0);
    if retry_count > MAX_RETRY_COUNT {
        return Err(bad(
            "invalid_action",
            format!("{which}.retry_count must be at most {MAX_RETRY_COUNT}"),
        ));
    }
    let retry_interval_ms =
        opt_seconds(&format!("{which}.retry_interval"), &raw.retry_interval)?.unwrap_or(0);
    let callbacks = Callbacks {
        on_success: parse_callback(
            &format!("{which}.on_success"),
            raw.on_success.as_ref(),
            rules,
        )?,
        on_failure: parse_callback(
            &format!("{which}.on_failure"),
            raw.on_failure.as_ref(),
            rules,
        )?,
    };

    if let Some(plugin) = raw.plugin {
        if raw.path.is_some() || raw.url.is_some() || raw.method.is_some() || raw.body.is_some() {
            return Err(bad(
                "invalid_action",
                format!("{which}: a plugin action takes plugin, input, timeout, retry_count and retry_interval, not webhook fields"),
            ));
        }
        if !rules.plugins.contains(&plugin) {
            return Err(bad(
                "unknown_plugin",
                format!("{which}: no plugin `{plugin}` is registered (see GET /plugins)"),
            ));
        }
        let input = raw.input.unwrap_or(Value::Null);
        if let Err(v) = rules.plugins.check_input(&plugin, &input) {
            return Err(bad(
                "invalid_input",
                v.sentence(&format!("{which}.input"), &plugin),
            ));
        }
        return Ok(Action::Plugin(PluginAction {
            plugin,
            input,
            timeout_ms: opt_seconds(&format!("{which}.timeout"), &raw.timeout)?,
            retry_count,
            retry_interval_ms,
            callbacks,
        }));
    }
    if raw.input.is_some() || raw.timeout.is_some() {
        return Err(bad(
            "invalid_action",
            format!("{which}: input and timeout belong to plugin actions; a webhook takes path or url, method, headers, body"),
        ));
    }
    let method = raw
        .method
        .ok_or_else(|| bad("invalid_action", format!("{which}.method is required")))?;
    let method = method.to_ascii_uppercase();
    if Method::from_bytes(method.as_bytes()).is_err() || !HTTP_METHODS.contains(&method.as_str()) {
        return Err(bad(
            "invalid_action",
            format!(
                "{which}.method `{method}` is not one of {}",
                HTTP_METHODS.join(", ")
            ),
        ));
    }
    match (&raw.path, &raw.url) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "invalid_action",
                format!("{which}: give path or url, not both"),
            ))
        }
        (None, None) => {
            return Err(bad(
                "invalid_action",
                format!("{which}: path (relative to the gateway) or url is required"),
            ))
        }
        (Some(path), None) => {
            if !path.starts_with('/') {
                return Err(bad(
                    "invalid_action",
                    format!("{which}.path must start with /"),
                ));
            }
            if path.parse::<http::uri::PathAndQuery>().is_err() || path.contains(' ') {
                return Err(bad(
                    "invalid_action",
                    format!("{which}.path `{path}` is not a URL path (percent-encode spaces and other special characters)"),
                ));
            }
            if !rules.gateway_configured {
                return Err(bad(
                    "no_gateway",
                    format!("{which}.path needs the host's gateway_url, which is not configured; give an absolute url instead"),
                ));
            }
        }
        (None, Some(url)) => {
            let uri: Uri = url.parse().map_err(|_| {
                bad(
                    "invalid_action",
                    format!("{which}.url `{url}` is not a URL"),
                )
            })?;
            let scheme_ok = matches!(uri.scheme_str(), Some("http") | Some("https"));
            if !scheme_ok || uri.host().is_none() {
                return Err(bad(
                    "invalid_action",
                    format!("{which}.url `{url}` must be an absolute http:// or https:// URL"),
                ));
            }
            // The port as written: `http::Uri` reads an out-of-range one as none at all,
            // and the call would then go to the scheme's default port.
            let written_port = uri
                .authority()
                .map(|a| a.as_str())
                .and_then(|a| a.rsplit_once(':'))
                .filter(|(_, p)| !p.contains(']'))
                .map(|(_, p)| p);
            if written_port.is_some_and(|p| !matches!(p.parse::<u16>(), Ok(1..))) {
                return Err(bad(
                    "invalid_action",
                    format!("{which}.url `{url}`: the port must be 1 to 65535"),
                ));
            }
            if let Some(policy) = rules.policy {
                policy
                    .check_literal(&uri)
                    .map_err(|denied| bad("blocked_target", format!("{which}.url: {denied}")))?;
            }
        }
    }
    // Only the host sets X-Kairos-* and Idempotency-Key (targets trust them): a copy in
    // the action's headers is dropped, never stored or forwarded.
    let headers: BTreeMap<String, String> = raw
        .headers
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| !crate::actions::webhook::is_host_header(name))
        .collect();
    for (name, value) in &headers {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || http::HeaderValue::from_str(value).is_err()
        {
            return Err(bad(
                "invalid_action",
                format!("{which}.headers: `{name}` is not a valid header"),
            ));
        }
    }
    Ok(Action::Webhook(WebhookAction {
        path: raw.path,
        url: raw.url,
        method,
        headers,
        body: raw.body,
        connect_timeout_ms: opt_seconds(&format!("{which}.connect_timeout"), &raw.connect_timeout)?,
        request_timeout_ms: opt_seconds(&format!("{which}.request_timeout"), &raw.request_timeout)?,
        retry_count,
        retry_interval_ms,
        callbacks,
    }))
}

/// A callback action (see [`Callbacks`]): any action but one with callbacks of its own,
/// or with a body or input, which the outcome takes the place of.
fn parse_callback(
    which: &str,
    value: Option<&Value>,
    rules: &Rules,
) -> Result<Option<Box<Action>>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    for field in ["on_success", "on_failure", "body", "input"] {
        if value.get(field).is_some() {
            return Err(bad(
                "invalid_action",
                format!("{which}: a callback takes no {field} (its body or input is the outcome, and it has no callbacks of its own)"),
            ));
        }
    }
    Ok(Some(Box::new(parse_action(which, value, rules)?)))
}

/// Ids no Life may take: `/schedules/{id}` would name a route of its own
/// (`POST /schedules/batch`), so the Life could be booked but never read, changed or
/// cancelled.
const RESERVED_LIFE_IDS: &[&str] = &["batch"];

/// Checks a life id: 1 to 64 characters of letters, digits, `-` and `_` (it is part of
/// Redis keys, where `:` separates), and not one of the reserved ids.
pub fn check_life_uuid(id: &str) -> Result<(), ApiError> {
    if RESERVED_LIFE_IDS.contains(&id) {
        return Err(bad(
            "invalid_life_uuid",
            format!("life_uuid `{id}` is reserved: /schedules/{id} is a route of its own"),
        ));
    }
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(bad(
            "invalid_life_uuid",
            "life_uuid must be 1 to 64 letters, digits, '-' or '_'",
        ))
    }
}

/// A fresh life id: 32 lower-case hex characters.
pub fn new_life_uuid() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// A fresh life id whose home shard is `resource_id`'s shard, so that the Life is found
/// by id without a pointer (about as many tries of a cheap hash as there are shards).
pub fn new_life_uuid_for(placement: crate::store::Placement, resource_id: Option<&str>) -> String {
    match resource_id {
        Some(rid) => new_life_uuid_in(placement, placement.resource(rid)),
        None => new_life_uuid(),
    }
}

/// A fresh Life id whose home is shard `want` (so that the Life needs no pointer there).
pub(crate) fn new_life_uuid_in(placement: crate::store::Placement, want: u32) -> String {
    for _ in 0..100_000 {
        let uuid = new_life_uuid();
        if placement.home(&uuid) == want {
            return uuid;
        }
    }
    new_life_uuid()
}

/// A point Life with a fresh id, firing `action` at `time` (either time format), checked
/// against the execution guard. For bookings made by the host itself (`/defer`).
/// With an `Idempotency-Key` (`key`), the id comes from the key.
pub fn point_life(
    time: &str,
    action: Action,
    rules: &Rules,
    key: Option<&str>,
) -> Result<NewLife, ApiError> {
    let birth_at_ms = parse_time(time, rules.timezone)
        .map_err(|e| bad("invalid_time", format!("schedule time: {e}")))?
        .timestamp_millis();
    check_guard("the schedule time", birth_at_ms, rules)?;
    Ok(NewLife {
        life_uuid: match key {
            Some(key) => super::idempotency::derived_id(key, 0),
            None => new_life_uuid(),
        },
        schedule_type: ScheduleType::Point,
        resource_id: None,
        birth_at_ms,
        death_at_ms: None,
        birth_action: action,
        death_action: None,
    })
}

/// 406 when `at_ms` is not more than execution_guard_time after now.
fn check_guard(name: &str, at_ms: i64, rules: &Rules) -> Result<(), ApiError> {
    if at_ms <= rules.now_ms + rules.execution_guard_ms {
        return Err(ApiError::new(
            http::StatusCode::NOT_ACCEPTABLE,
            "too_soon",
            format!(
                "{name} must be more than execution_guard_time ({} s) from now",
                rules.execution_guard_ms as f64 / 1000.0
            ),
        ));
    }
    Ok(())
}

impl BookingRequest {
    /// Refuses a field given in both spellings: which one was meant is a guess, and a
    /// wrong guess books another time or action than the client thinks.
    fn one_spelling_each(&self) -> Result<(), ApiError> {
        let term = self.term.as_ref();
        let pairs = [
            (
                term.is_some_and(|t| t.birth_time.is_some()),
                self.birth_time.is_some(),
                "term.birth_time",
                "birth_time",
            ),
            (
                term.is_some_and(|t| t.death_time.is_some()),
                self.death_time.is_some(),
                "term.death_time",
                "death_time",
            ),
            (
                self.birth.is_some(),
                self.birth_action.is_some(),
                "birth",
                "birth_action",
            ),
            (
                self.death.is_some(),
                self.death_action.is_some(),
                "death",
                "death_action",
            ),
        ];
        for (first, second, a, b) in pairs {
            if first && second {
                return Err(bad(
                    "invalid_body",
                    format!(
                        "the body gives both {a} and {b}, two spellings of one field: give one"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn birth_time(&self) -> Option<&String> {
        self.term
            .as_ref()
            .and_then(|t| t.birth_time.as_ref())
            .or(self.birth_time.as_ref())
    }

    fn death_time(&self) -> Option<&String> {
        self.term
            .as_ref()
            .and_then(|t| t.death_time.as_ref())
            .or(self.death_time.as_ref())
    }

    fn birth_action(&self) -> Option<&Value> {
        self.birth.as_ref().or(self.birth_action.as_ref())
    }

    fn death_action(&self) -> Option<&Value> {
        self.death.as_ref().or(self.death_action.as_ref())
    }

    /// Reads `debounce`: 400 `invalid_debounce` unless it is a point booking with no
    /// resource, no birth time (the window sets it) and no life_uuid (the host picks one
    /// in the key's shard).
    fn debounce(&self) -> Result<Option<Debounce>, ApiError> {
        let Some(value) = &self.debounce else {
            return Ok(None);
        };
        let body: DebounceBody = serde_json::from_value(value.clone())
            .map_err(|e| body_error("debounce", "invalid_debounce", e))?;
        if body.key.is_empty() || body.key.len() > 256 || body.key.chars().any(char::is_control) {
            return Err(bad(
                "invalid_debounce",
                "debounce.key must be 1 to 256 characters without control characters",
            ));
        }
        let ms = |field: &str, v: &Value| -> Result<i64, ApiError> {
            let d = parse_duration_value(field, v)?;
            let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            if ms == 0 || ms > MAX_DEBOUNCE_MS {
                return Err(bad(
                    "invalid_debounce",
                    format!("{field} must be more than 0 and at most 30 days"),
                ));
            }
            Ok(ms as i64)
        };
        let period_ms = ms("debounce.period", &body.period)?;
        let max_wait_ms = match &body.max_wait {
            Some(v) => ms("debounce.max_wait", v)?,
            None => DEFAULT_MAX_WAIT_MS.max(period_ms),
        };
        if max_wait_ms < period_ms {
            return Err(bad(
                "invalid_debounce",
                "debounce.max_wait must not be shorter than debounce.period",
            ));
        }
        let refuse = |what: &str| {
            Err(bad(
                "invalid_debounce",
                format!("a debounced booking {what}"),
            ))
        };
        if self.schedule_type.as_deref().is_some_and(|t| t != "point")
            || self.death_time().is_some()
            || self.death_action().is_some()
        {
            return refuse("is a point booking");
        }
        if self.resource_id.is_some() {
            return refuse("has no resource_id");
        }
        if self.birth_time().is_some() {
            return refuse(
                "has no birth_time: it fires debounce.period after the last booking of its key",
            );
        }
        if self.life_uuid.is_some() {
            return refuse("has no life_uuid: the answer names the Life that will fire");
        }
        Ok(Some(Debounce {
            key: body.key,
            period_ms,
            max_wait_ms,
        }))
    }

    /// Whether [`Self::into_booking`] draws the booking's id at random (no id in the body,
    /// no key to derive it from) or takes one a caller named.
    pub fn id_origin(&self, key: Option<&str>) -> IdOrigin {
        match self.life_uuid {
            Some(_) => IdOrigin::Given,
            None => IdOrigin::of_key(key),
        }
    }

    /// Validates a new booking (all checks of the table that need no Redis).
    /// A call made with an `Idempotency-Key` (`key`) draws the id the body leaves out
    /// from the key, so that every repeat of the call names the same Life.
    /// A debounced booking (see [`Debounce`]) is born now + period, and its id, new, is in
    /// the debounce key's shard.
    pub fn into_booking(
        self,
        rules: &Rules,
        key: Option<&str>,
    ) -> Result<(NewLife, Option<Debounce>), ApiError> {
        if let Some(debounce) = self.debounce()? {
            let life_uuid =
                new_life_uuid_in(rules.placement, rules.placement.debounce(&debounce.key));
            let birth_at_ms = rules.now_ms + debounce.period_ms;
            let life = self.build(life_uuid, None, Some(birth_at_ms), rules)?;
            return Ok((life, Some(debounce)));
        }
        let life_uuid = match (&self.life_uuid, key) {
            (Some(id), _) => {
                check_life_uuid(id)?;
                id.clone()
            }
            (None, Some(key)) => super::idempotency::derived_life_id(
                key,
                rules.placement,
                self.resource_id.as_deref(),
            ),
            (None, None) => new_life_uuid_for(rules.placement, self.resource_id.as_deref()),
        };
        Ok((self.build(life_uuid, None, None, rules)?, None))
    }

    /// Applies a PATCH to an existing booking and validates the result as a whole.
    pub fn merge_into(self, current: &NewLife, rules: &Rules) -> Result<NewLife, ApiError> {
        if let Some(id) = &self.life_uuid {
            if id != &current.life_uuid {
                return Err(bad("invalid_body", "life_uuid cannot be changed"));
            }
        }
        if self.debounce.is_some() {
            return Err(bad(
                "invalid_debounce",
                "debounce is given when booking, not when changing a Life",
            ));
        }
        let id = current.life_uuid.clone();
        self.build(id, Some(current), None, rules)
    }

    /// The Life the request describes; `birth_at_ms`, when given, stands for a birth
    /// time the body does not give.
    fn build(
        self,
        life_uuid: String,
        current: Option<&NewLife>,
        birth_at_ms: Option<i64>,
        rules: &Rules,
    ) -> Result<NewLife, ApiError> {
        let schedule_type = match (&self.schedule_type, current) {
            (Some(t), cur) => {
                let parsed = match t.as_str() {
                    "point" => ScheduleType::Point,
                    "term" => ScheduleType::Term,
                    other => {
                        return Err(bad(
                            "invalid_schedule_type",
                            format!("schedule_type `{other}` is not point or term"),
                        ))
                    }
                };
                if let Some(cur) = cur {
                    if cur.schedule_type != parsed {
                        return Err(bad("invalid_body", "schedule_type cannot be changed"));
                    }
                }
                parsed
            }
            (None, Some(cur)) => cur.schedule_type,
            (None, None) if self.death_time().is_some() => ScheduleType::Term,
            (None, None) => ScheduleType::Point,
        };
        let resource_id = match (&self.resource_id, current) {
            (Some(r), _) => {
                if r.is_empty() || r.len() > 256 || r.chars().any(char::is_control) {
                    return Err(bad(
                        "invalid_resource_id",
                        "resource_id must be 1 to 256 characters without control characters",
                    ));
                }
                Some(r.clone())
            }
            (None, Some(cur)) => cur.resource_id.clone(),
            (None, None) => None,
        };
        let birth_at_ms = match (self.birth_time(), current) {
            (Some(text), _) => parse_time(text, rules.timezone)
                .map_err(|e| bad("invalid_time", format!("birth_time: {e}")))?
                .timestamp_millis(),
            (None, Some(cur)) => cur.birth_at_ms,
            (None, None) => match birth_at_ms {
                Some(ms) => ms,
                None => return Err(bad("missing_field", "birth_time is required")),
            },
        };
        let birth_action = match (self.birth_action(), current) {
            (Some(v), _) => parse_action("birth", v, rules)?,
            (None, Some(cur)) => cur.birth_action.clone(),
            (None, None) => {
                return Err(bad("missing_field", "birth (the birth action) is required"))
            }
        };
        let (death_at_ms, death_action) = match schedule_type {
            ScheduleType::Point => {
                if self.death_time().is_some() || self.death_action().is_some() {
                    return Err(bad(
                        "invalid_body",
                        "a point Life has no death_time or death action; use schedule_type term",
                    ));
                }
                (None, None)
            }
            ScheduleType::Term => {
                let death_at_ms = match (self.death_time(), current.and_then(|c| c.death_at_ms)) {
                    (Some(text), _) => parse_time(text, rules.timezone)
                        .map_err(|e| bad("invalid_time", format!("death_time: {e}")))?
                        .timestamp_millis(),
                    (None, Some(ms)) => ms,
                    (None, None) => {
                        return Err(bad(
                            "missing_field",
                            "death_time is required for a term Life",
                        ))
                    }
                };
                let death_action = match (
                    self.death_action(),
                    current.and_then(|c| c.death_action.as_ref()),
                ) {
                    (Some(v), _) => parse_action("death", v, rules)?,
                    (None, Some(a)) => a.clone(),
                    (None, None) => {
                        return Err(bad(
                            "missing_field",
                            "death (the death action) is required for a term Life",
                        ))
                    }
                };
                if birth_at_ms >= death_at_ms {
                    return Err(bad(
                        "birth_not_before_death",
                        "birth_time must be before death_time",
                    ));
                }
                if birth_at_ms + rules.minimum_life_term_ms > death_at_ms {
                    return Err(bad(
                        "term_too_short",
                        format!(
                            "the term is shorter than minimum_life_term ({} s)",
                            rules.minimum_life_term_ms as f64 / 1000.0
                        ),
                    ));
                }
                (Some(death_at_ms), Some(death_action))
            }
        };
        // A PATCH is checked against the guard only for the times it moves: the birth of
        // an Alive Life is in the past and stays there when its death is moved.
        let birth_moved = current.is_none_or(|c| c.birth_at_ms != birth_at_ms);
        let death_moved = current.is_none_or(|c| c.death_at_ms != death_at_ms);
        if birth_moved {
            check_guard("birth_time", birth_at_ms, rules)?;
        }
        if let (true, Some(death_at_ms)) = (death_moved, death_at_ms) {
            check_guard("death_time", death_at_ms, rules)?;
        }
        Ok(NewLife {
            life_uuid,
            schedule_type,
            resource_id,
            birth_at_ms,
            death_at_ms,
            birth_action,
            death_action,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    static KNOWN: std::sync::LazyLock<KnownPlugins> =
        std::sync::LazyLock::new(|| KnownPlugins::named(["known"]));

    fn rules(now_ms: i64) -> Rules<'static> {
        Rules {
            timezone: chrono_tz::Asia::Tokyo,
            minimum_life_term_ms: 180_000,
            execution_guard_ms: 30_000,
            now_ms,
            gateway_configured: true,
            plugins: &KNOWN,
            policy: None,
            placement: crate::store::Placement { shards: 32 },
        }
    }

    fn book(body: Value, now_ms: i64) -> Result<NewLife, ApiError> {
        parse_request(body.to_string().as_bytes())?
            .into_booking(&rules(now_ms), None)
            .map(|(life, _)| life)
    }

    const NOW: i64 = 1_765_000_000_000; // 2025-12-06

    #[test]
    fn local_times_use_the_zone_and_rfc3339_its_offset() {
        let tokyo = parse_time("2026-12-15 15:05:00", chrono_tz::Asia::Tokyo).unwrap();
        assert_eq!(tokyo.to_rfc3339(), "2026-12-15T06:05:00+00:00");
        let rfc = parse_time("2026-12-15T15:05:00+09:00", chrono_tz::UTC).unwrap();
        assert_eq!(rfc, tokyo);
        let gap = parse_time("2026-03-29 01:30:00", chrono_tz::Europe::London);
        assert!(gap.unwrap_err().contains("daylight-saving gap"));
        let twice = parse_time("2026-10-25 01:30:00", chrono_tz::Europe::London).unwrap();
        assert_eq!(twice.to_rfc3339(), "2026-10-25T00:30:00+00:00");
        assert!(parse_time("tomorrow", chrono_tz::UTC).is_err());
    }

    #[test]
    fn nested_and_flat_spellings_are_the_same_booking() {
        let nested = book(
            json!({"life_uuid": "a1", "schedule_type": "term", "resource_id": "r",
                   "term": {"birth_time": "2026-12-15 15:05:00", "death_time": "2026-12-15 15:08:00"},
                   "birth": {"path": "/t", "method": "post"}, "death": {"path": "/t", "method": "POST"}}),
            NOW,
        )
        .unwrap();
        let flat = book(
            json!({"life_uuid": "a1", "schedule_type": "term", "resource_id": "r",
                   "birth_time": "2026-12-15 15:05:00", "death_time": "2026-12-15 15:08:00",
                   "birth_action": {"path": "/t", "method": "POST"}, "death_action": {"path": "/t", "method": "POST"}}),
            NOW,
        )
        .unwrap();
        assert_eq!(nested, flat);
        assert_eq!(nested.death_at_ms.unwrap() - nested.birth_at_ms, 180_000);
    }

    #[test]
    fn the_validation_table_in_order() {
        let code = |body: Value| book(body, NOW).unwrap_err().code;
        let action = json!({"path": "/t", "method": "POST"});
        assert_eq!(code(json!({"birth": action})), "missing_field");
        assert_eq!(
            code(json!({"birth_time": "soon", "birth": action})),
            "invalid_time"
        );
        assert_eq!(
            code(json!({"birth_time": "2026-12-15 15:05:00", "birth": {"plugin": "nope"}})),
            "unknown_plugin"
        );
        assert_eq!(
            code(
                json!({"birth_time": "2026-12-15 15:05:00", "birth": {"path": "/t", "method": "POST", "retry_cont": 3}})
            ),
            "unknown_field"
        );
        assert_eq!(
            code(
                json!({"schedule_type": "term", "birth_time": "2026-12-15 15:08:00", "death_time": "2026-12-15 15:05:00", "birth": action, "death": action})
            ),
            "birth_not_before_death"
        );
        assert_eq!(
            code(
                json!({"schedule_type": "term", "birth_time": "2026-12-15 15:05:00", "death_time": "2026-12-15 15:07:59", "birth": action, "death": action})
            ),
            "term_too_short"
        );
        let err = book(
            json!({"birth_time": chrono::DateTime::from_timestamp_millis(NOW + 30_000).unwrap().to_rfc3339(), "birth": action}),
            NOW,
        )
        .unwrap_err();
        assert_eq!((err.status.as_u16(), err.code), (406, "too_soon"));
        assert!(book(
            json!({"birth_time": chrono::DateTime::from_timestamp_millis(NOW + 30_001).unwrap().to_rfc3339(), "birth": action}),
            NOW
        )
        .is_ok());
    }

    #[test]
    fn action_durations_take_seconds_or_strings() {
        let life = book(
            json!({"birth_time": "2026-12-15 15:05:00",
                   "birth": {"url": "http://example.com/x", "method": "GET", "retry_count": 2,
                             "retry_interval": 1.5, "request_timeout": "250ms", "connect_timeout": 2}}),
            NOW,
        )
        .unwrap();
        let Action::Webhook(w) = life.birth_action else {
            panic!("webhook expected")
        };
        assert_eq!(w.retry_interval_ms, 1500);
        assert_eq!(w.request_timeout_ms, Some(250));
        assert_eq!(w.connect_timeout_ms, Some(2000));
        assert_eq!(life.life_uuid.len(), 32);
    }

    #[test]
    fn durations_over_a_day_are_refused() {
        for value in [json!(1e20), json!(86_401), json!("25h"), json!(1e16)] {
            let err = book(
                json!({"birth_time": "2026-12-15 15:05:00", "birth": {"path": "/t", "method": "GET", "request_timeout": value}}),
                NOW,
            )
            .unwrap_err();
            assert_eq!(err.code, "invalid_duration", "{value}");
        }
        assert!(book(
            json!({"birth_time": "2026-12-15 15:05:00", "birth": {"path": "/t", "method": "GET", "retry_interval": 86_400}}),
            NOW
        )
        .is_ok());
    }

    #[test]
    fn patch_merges_then_revalidates() {
        let action = json!({"path": "/t", "method": "POST"});
        let current = book(
            json!({"life_uuid": "p1", "schedule_type": "term", "birth_time": "2026-12-15 15:05:00",
                   "death_time": "2026-12-15 16:00:00", "birth": action, "death": action}),
            NOW,
        )
        .unwrap();
        let moved = parse_request(br#"{"death_time": "2026-12-15 17:00:00"}"#)
            .unwrap()
            .merge_into(&current, &rules(NOW))
            .unwrap();
        assert_eq!(
            moved.death_at_ms.unwrap() - current.death_at_ms.unwrap(),
            3_600_000
        );
        assert_eq!(moved.birth_at_ms, current.birth_at_ms);
        let err = parse_request(br#"{"death_time": "2026-12-15 15:06:00"}"#)
            .unwrap()
            .merge_into(&current, &rules(NOW))
            .unwrap_err();
        assert_eq!(err.code, "term_too_short");
        // Moving only the death of a Life whose birth has passed is not refused for the
        // birth's time; moving a time into the guard still is.
        let later = current.death_at_ms.unwrap() + 3_600_000;
        let moved = parse_request(
            format!(
                r#"{{"death_time": "{}"}}"#,
                chrono::DateTime::from_timestamp_millis(later)
                    .unwrap()
                    .to_rfc3339()
            )
            .as_bytes(),
        )
        .unwrap()
        .merge_into(&current, &rules(current.birth_at_ms + 1))
        .unwrap();
        assert_eq!(moved.death_at_ms, Some(later));
        let soon_ms = current.birth_at_ms + 200_000;
        let soon = chrono::DateTime::from_timestamp_millis(soon_ms)
            .unwrap()
            .to_rfc3339();
        let err = parse_request(format!(r#"{{"death_time": "{soon}"}}"#).as_bytes())
            .unwrap()
            .merge_into(&current, &rules(soon_ms - 100))
            .unwrap_err();
        assert_eq!(err.code, "too_soon");
    }
}
