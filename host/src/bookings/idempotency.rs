//! Idempotent booking calls (SPEC section 11): a call made with an `Idempotency-Key`
//! header is answered once; the same key with the same request within
//! `idempotency_ttl` (24 h by default) gets the first answer again, status and body, and
//! writes nothing; the same key with another request is refused with 422
//! `idempotency_key_reused`.
//!
//! The answer is recorded in the key's shard (`store::IdemBegin`), apart from what the
//! call books, so a host can die between the booking and the record. A repeat then finds
//! the record `pending` and, once it is older than [`PENDING_MS`], books again: ids the
//! call generates (a Life's id, a task's name) come from the key ([`derived_id`]), so
//! that second booking meets the first one's object instead of making another, and the
//! route answers as if it had booked it (an identical Life under that id is the call's
//! own).

use http::StatusCode;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::store::{IdemBegin, Placement, Store};

/// A call with a key that is still `pending` after this long is taken to have died.
/// A booking call takes milliseconds; even one that waits for replicas
/// (`--min-replicas-ack`) ends well within it.
pub const PENDING_MS: i64 = 10_000;

/// The longest key taken (Stripe's limit, and the draft standard's advice that keys be
/// short random strings such as UUIDs).
pub const MAX_KEY_LEN: usize = 255;

/// What the call answers: its status and JSON body, and whether it is a replay.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
    /// The first call's answer, given again (`Idempotent-Replayed: true`).
    pub replayed: bool,
}

/// Reads an `Idempotency-Key` value: 1 to 255 visible ASCII characters, optionally as a
/// quoted string (the IETF draft writes it as a structured-field string, most APIs
/// unquoted; both mean the same key).
pub fn parse_key(raw: &[u8]) -> Result<String, ApiError> {
    let text = std::str::from_utf8(raw).unwrap_or("").trim();
    let key = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text);
    let ok = !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && key.bytes().all(|b| b.is_ascii_graphic() && b != b'"');
    if ok {
        Ok(key.to_string())
    } else {
        Err(ApiError::bad_request(
            "invalid_idempotency_key",
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters, such as a UUID"),
        ))
    }
}

/// The fingerprint of a request: SHA-256 over its parts, each prefixed by its length so
/// that no two lists of parts give the same bytes.
pub fn fingerprint(parts: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hex::encode(hash.finalize())
}

/// An id generated for the call made with `key`, the same on every repeat of it: the
/// `n`-th of a sequence, 32 lower-case hex characters like a fresh Life id.
pub fn derived_id(key: &str, n: u32) -> String {
    let mut hash = Sha256::new();
    hash.update(b"kairos idempotency-key id\0");
    hash.update(key.as_bytes());
    hash.update(n.to_be_bytes());
    hex::encode(&hash.finalize()[..16])
}

/// A Life id for the call made with `key`, the same on every repeat: in `resource_id`'s
/// shard when it has one (as `request::new_life_uuid_for` draws fresh ids), else in the
/// shard of the key's record, so that the booking and its record are written by one
/// script (`Store::book_idempotent`).
pub fn derived_life_id(key: &str, placement: Placement, resource_id: Option<&str>) -> String {
    let want = match resource_id {
        Some(rid) => placement.resource(rid),
        None => placement.idempotency(key),
    };
    // One hash of the key, then candidates that differ in their last four bytes: with
    // S shards about S tries, each a hex encoding and an FNV hash, not a SHA-256.
    let mut hash = Sha256::new();
    hash.update(b"kairos idempotency-key life id\0");
    hash.update(key.as_bytes());
    let base: [u8; 16] = hash.finalize()[..16].try_into().expect("16 bytes");
    let tail = u32::from_be_bytes(base[12..].try_into().expect("4 bytes"));
    let candidate = |n: u32| {
        let mut id = base;
        id[12..].copy_from_slice(&(tail ^ n).to_be_bytes());
        hex::encode(id)
    };
    (0..100_000)
        .map(candidate)
        .find(|id| placement.home(id) == want)
        .unwrap_or_else(|| candidate(0))
}

/// The answer to a call whose key's record answered: the first call's answer again, or
/// the refusal of a reused key or of a call under way. `New` and `Retake` (the call goes
/// ahead) are no answer and should not come here.
pub fn found_answer(found: IdemBegin) -> Result<Answer, ApiError> {
    match found {
        IdemBegin::Replay { status, body } => Ok(Answer {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
            body: serde_json::from_str(&body).unwrap_or(Value::Null),
            replayed: true,
        }),
        IdemBegin::Reused => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            "this Idempotency-Key was used for another request; use a new key for a new request",
        )),
        IdemBegin::InProgress => Err(ApiError::conflict(
            "idempotency_key_in_progress",
            "a request with this Idempotency-Key is under way; try again in a few seconds for its answer",
        )),
        IdemBegin::New | IdemBegin::Retake => Err(ApiError::unavailable(
            "an idempotency record answered neither a replay nor a refusal",
        )),
    }
}

/// Runs a booking call under an idempotency key, or plainly when `key` is None.
/// `call` receives the key (to derive the ids it generates) and whether this is a retake
/// of a call that never recorded its answer.
pub async fn run<F, Fut>(
    store: &Store,
    ttl_ms: i64,
    key: Option<&str>,
    fingerprint: &str,
    call: F,
) -> Result<Answer, ApiError>
where
    F: FnOnce(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<(StatusCode, Value), ApiError>>,
{
    let answer = |(status, body): (StatusCode, Value)| Answer {
        status,
        body,
        replayed: false,
    };
    let Some(key) = key else {
        return call(None).await.map(answer);
    };
    match store
        .idem_begin(key, fingerprint, PENDING_MS, ttl_ms)
        .await?
    {
        IdemBegin::New | IdemBegin::Retake => {}
        found => return found_answer(found),
    }
    let result = call(Some(key.to_string())).await;
    // What is recorded is replayed: a final answer, success or refusal. A 5xx is not
    // final (the call may succeed when tried again), so the record is dropped.
    let recorded = match &result {
        Ok((status, body)) => Some((status.as_u16(), body.to_string())),
        Err(e) if !e.status.is_server_error() => Some((e.status.as_u16(), e.body().to_string())),
        Err(_) => None,
    };
    let finish = store
        .idem_finish(
            key,
            fingerprint,
            recorded.as_ref().map(|(s, b)| (*s, b.as_str())),
        )
        .await;
    if let Err(e) = finish {
        // The booking stands; a repeat of the call retakes the pending record once it is
        // old and meets the same objects (see the module docs).
        tracing::warn!(error = %e, "could not record the answer of an idempotent call");
    }
    result.map(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_quoted_or_not() {
        assert_eq!(parse_key(b"abc-123").unwrap(), "abc-123");
        assert_eq!(parse_key(b"\"abc-123\"").unwrap(), "abc-123");
        for bad in [&b""[..], b"a b", b"\"\"", "ключ".as_bytes(), &[b'x'; 256]] {
            let e = parse_key(bad).unwrap_err();
            assert_eq!(e.code, "invalid_idempotency_key", "{bad:?}");
        }
    }

    #[test]
    fn fingerprints_tell_parts_apart() {
        assert_ne!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"a", b"bc"]));
        assert_eq!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"ab", b"c"]));
    }

    #[test]
    fn derived_ids_repeat_per_key_and_land_in_the_resources_shard() {
        let placement = Placement { shards: 32 };
        let a = derived_life_id("k1", placement, Some("conn-1"));
        assert_eq!(a, derived_life_id("k1", placement, Some("conn-1")));
        assert_ne!(a, derived_life_id("k2", placement, Some("conn-1")));
        assert_eq!(placement.home(&a), placement.resource("conn-1"));
        assert_eq!(a.len(), 32);
        assert_ne!(derived_id("k1", 0), derived_id("k1", 1));
        let plain = derived_life_id("k1", placement, None);
        assert_eq!(plain, derived_life_id("k1", placement, None));
        assert_eq!(placement.home(&plain), placement.idempotency("k1"));
    }
}
