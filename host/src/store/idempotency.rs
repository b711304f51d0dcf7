//! Records of booking calls made with an `Idempotency-Key` (`idem:{key}` in the key's
//! shard, `scripts/idem_begin.lua` and `scripts/idem_finish.lua`): what the first call
//! answered, replayed to its repeats.

use super::Store;
use crate::error::ApiError;

/// What `idem_begin` found for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemBegin {
    /// No call with this key yet: this one goes ahead (and is now `pending`).
    New,
    /// A call with this key and request was answered: answer the same.
    Replay { status: u16, body: String },
    /// The key was used for another request.
    Reused,
    /// A call with this key and request is under way right now.
    InProgress,
    /// A call with this key and request began long ago and never recorded its answer
    /// (its host died, or Redis went away): this one takes its place.
    Retake,
}

impl Store {
    fn idem_key(&self, key: &str) -> (u32, String) {
        let shard = self.placement.idempotency(key);
        (shard, self.shard(shard).idempotency(key))
    }

    /// Begins a call with `key` for the request whose fingerprint is `fingerprint`.
    pub async fn idem_begin(
        &self,
        key: &str,
        fingerprint: &str,
        pending_ms: i64,
        ttl_ms: i64,
    ) -> Result<IdemBegin, ApiError> {
        let (shard, record) = self.idem_key(key);
        self.memory.check_room(shard)?;
        let reply: Vec<String> = self
            .scripts
            .idem_begin
            .key(record)
            .arg(&self.shard(shard).prefix)
            .arg(fingerprint)
            .arg(pending_ms)
            .arg(ttl_ms)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(match reply.first().map(String::as_str) {
            Some("new") => IdemBegin::New,
            Some("replay") if reply.len() == 3 => IdemBegin::Replay {
                status: reply[1].parse().unwrap_or(200),
                body: reply[2].clone(),
            },
            Some("reused") => IdemBegin::Reused,
            Some("in_progress") => IdemBegin::InProgress,
            Some("retake") => IdemBegin::Retake,
            _ => {
                return Err(ApiError::unavailable(format!(
                    "idem_begin answered {reply:?}"
                )))
            }
        })
    }

    /// Records the answer of the call begun with `key` (`None`: forget the record, so
    /// that the call may be made again).
    pub async fn idem_finish(
        &self,
        key: &str,
        fingerprint: &str,
        answer: Option<(u16, &str)>,
    ) -> Result<(), ApiError> {
        let (shard, record) = self.idem_key(key);
        let (status, body) = match answer {
            Some((status, body)) => (status.to_string(), body),
            None => (String::new(), ""),
        };
        let _: i64 = self
            .scripts
            .idem_finish
            .key(record)
            .arg(&self.shard(shard).prefix)
            .arg(fingerprint)
            .arg(status)
            .arg(body)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }
}
