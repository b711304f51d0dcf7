//! The one error type that crosses the API boundary (its HTTP response is made in
//! `api/`).
//!
//! Every refusal carries the HTTP status and the snake_case `code` of SPEC section 2, so
//! that the booking rules, the store and the API all speak the same error body:
//! `{"error": {"code": "...", "message": "..."}}`.

use http::StatusCode;

/// A request that kairos refuses, or a failure it reports, with the spec's status and code.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// `"unknown"` when a write may have been applied although it failed (Redis went away
    /// after the request was sent): the body says so, so that a client looks before it
    /// books again.
    pub stored: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            stored: None,
        }
    }

    /// 400: the body is not of the right shape, a time does not parse, a field is missing.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// The spec's error body: `{"error": {"code", "message"}}`, plus `stored` when set.
    pub fn body(&self) -> serde_json::Value {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message.clone(),
                stored: self.stored,
            },
        };
        serde_json::to_value(body).expect("an error body serializes")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// 503: storage is unreachable. The message is logged, the client sees a hint.
    pub fn unavailable(err: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %err, "storage unavailable");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            format!("Redis is not answering ({err}); try again"),
        )
    }

    /// 503 for a write that failed on the way: when the request may have reached Redis
    /// before it went away, the write may have been applied, and the body says
    /// `"stored": "unknown"`. Retrying a booking with the same `Idempotency-Key` or the
    /// same `life_uuid` is safe (a second booking of one id is refused with 409).
    pub fn write_unknown(err: redis::RedisError) -> Self {
        if let Some(full) = out_of_memory(&err) {
            return full;
        }
        let lost_on_the_way = err.is_io_error() || err.is_connection_dropped() || err.is_timeout();
        if !lost_on_the_way || err.is_connection_refusal() {
            // Refused before it was sent, or answered with an error: a script checks
            // everything before it writes, so nothing was stored.
            return Self::unavailable(&err);
        }
        tracing::warn!(error = %err, "storage failed during a write; it may have been applied");
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_unavailable",
            format!("Redis went away during this write ({err}); it may or may not have been stored: book again with the same Idempotency-Key (or the same life_uuid: a duplicate is refused with 409), or look it up first"),
        );
        e.stored = Some("unknown");
        e
    }
}

// The body of every refusal and failure (the spec's error body); the doc comment below
// is the OpenAPI document's description of it.
/// The body of every refusal and failure: a snake_case `code` to branch on and a
/// `message` a person can act on.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(example = json!({"error": {"code": "resource_conflict", "message": "resource `conn-42` has another Life within execution_delay_guard_time"}}))]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// The reason, in snake_case (`invalid_time`, `resource_conflict`, `not_found`, ...).
    #[schema(value_type = String, example = "invalid_time")]
    pub code: &'static str,
    /// A sentence a person can act on.
    pub message: String,
    /// `"unknown"` when a write failed on the way and may or may not have been stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "unknown")]
    pub stored: Option<&'static str>,
}

impl ApiError {
    /// A write stored on the master that the replicas asked for did not confirm in
    /// time: a failover now could lose it.
    pub fn unconfirmed(message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "replicas_unconfirmed",
            message,
        );
        e.stored = Some("unknown");
        e
    }
}

impl ApiError {
    /// 507: Redis is nearly full (kairos's own limit below `maxmemory`) or refused the
    /// write for want of memory; nothing was stored.
    pub fn storage_full(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INSUFFICIENT_STORAGE, "storage_full", message)
    }
}

/// Redis's own refusal of a write when it has reached `maxmemory` (noeviction).
fn out_of_memory(err: &redis::RedisError) -> Option<ApiError> {
    (err.code() == Some("OOM")).then(|| {
        tracing::warn!(error = %err, "Redis refused a write: it has reached maxmemory");
        ApiError::storage_full(
            "Redis refused the write: it has reached maxmemory; nothing was stored",
        )
    })
}

impl From<redis::RedisError> for ApiError {
    fn from(err: redis::RedisError) -> Self {
        out_of_memory(&err).unwrap_or_else(|| ApiError::unavailable(err))
    }
}
