//! Lives in Redis (layout 4): booking, PATCH, DELETE, the sweep. Views and listing are
//! in `life_views.rs`, the record's format in `record/`, the state machine in
//! `lifecycle.rs`.
//!
//! A Life is stored in one shard (`Placement::life`): its resource's when it has one,
//! else its id's home shard. A Life stored outside its home shard leaves a pointer there
//! (`ptr:{uuid}`, `scripts/pointer.lua`), so GET, PATCH and DELETE find any Life by id in
//! at most two round trips, without looking at other shards.

use super::book_batch::Booking;
use super::life_changes::CHANGE_TRIES;
use super::lifecycle;
use super::replicas::Proof;
use super::{IdemBegin, Store};
use crate::error::ApiError;
use crate::model::{Action, NewLife};

/// A pointer older than this whose Life is not in the shard it names is left over from a
/// booking that did not complete (its host died between the pointer and the Life), and
/// may be replaced. A booking in flight writes both within far less.
const STALE_POINTER_MS: i64 = 60_000;

/// How long a debounce key's record outlives its window's cap: a Life that fires late
/// (a backlog, hosts down) still takes the bookings of its key until it starts.
const DEBOUNCE_RECORD_MARGIN_MS: i64 = 86_400_000;

/// The plugin names (without `@version`) a booking's actions use.
pub(crate) fn plugin_names(actions: &[Option<&Action>]) -> Vec<String> {
    let mut names: Vec<String> = actions
        .iter()
        .flatten()
        .filter_map(|a| match a {
            Action::Plugin(p) => Some(p.plugin.split('@').next().unwrap_or("").to_string()),
            Action::Webhook(_) => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

pub(super) fn life_plugins(life: &NewLife) -> Vec<String> {
    plugin_names(&[Some(&life.birth_action), life.death_action.as_ref()])
}

/// Where a booking's id came from. A pointer to another shard (written when a Life with
/// a resource is stored outside its id's home shard) can stand in the home shard only
/// for an id some other booking named, so a booking whose id this host drew for it
/// need not look for one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdOrigin {
    /// Drawn at random by this host for this booking (no id in the body, no key).
    Drawn,
    /// Named by the client, or derived from an `Idempotency-Key`.
    Given,
}

impl IdOrigin {
    /// The origin of the id a booking that names none gets: derived from its
    /// `Idempotency-Key` when it has one, else drawn.
    pub fn of_key(key: Option<&str>) -> Self {
        match key {
            Some(_) => IdOrigin::Given,
            None => IdOrigin::Drawn,
        }
    }
}

/// One booking's arguments, as `book.lua` takes each of its bookings and `book_idem.lua`
/// its one (common.lua's `book_argv`): the shard's prefix, the id, the resource ('' for
/// none), birth and death ms (death '' for a point), the record, the guard and the
/// look-ahead's end (ms), whether to look for a pointer ('1' or ''), then the count of
/// plugins the actions use and their names.
fn book_args(
    prefix: &str,
    life: &NewLife,
    look_for_pointer: bool,
    now_ms: i64,
    guard_ms: i64,
    notify_before_ms: i64,
) -> Vec<String> {
    let plugins = life_plugins(life);
    let mut args = Vec::with_capacity(10 + plugins.len());
    args.extend([
        prefix.to_string(),
        life.life_uuid.clone(),
        life.resource_id.clone().unwrap_or_default(),
        life.birth_at_ms.to_string(),
        life.death_at_ms.map(|m| m.to_string()).unwrap_or_default(),
        lifecycle::booked(life, now_ms).to_json(),
        guard_ms.to_string(),
        notify_before_ms.to_string(),
        if look_for_pointer { "1" } else { "" }.to_string(),
        plugins.len().to_string(),
    ]);
    args.extend(plugins);
    args
}

fn duplicate(uuid: &str) -> ApiError {
    ApiError::conflict(
        "duplicate_life_uuid",
        format!("a Life with life_uuid `{uuid}` already exists"),
    )
}

/// A pointer's shard and the time it was written.
pub(super) fn parse_pointer(value: &str) -> Option<(u32, i64)> {
    let (shard, ms) = value.split_once(':')?;
    Some((shard.parse().ok()?, ms.parse().ok()?))
}

impl Store {
    /// The shard a Life is stored in: the shard of its resource, or its home shard.
    pub fn life_shard(&self, life: &NewLife) -> u32 {
        self.placement
            .life(&life.life_uuid, life.resource_id.as_deref())
    }

    /// Books a validated Life atomically; refuses with 409 on a resource overlap or an
    /// existing id.
    pub async fn book(
        &self,
        life: &NewLife,
        origin: IdOrigin,
        now_ms: i64,
        guard_ms: i64,
        notify_before_ms: i64,
    ) -> Result<(), ApiError> {
        let uuid = &life.life_uuid;
        let shard = self.life_shard(life);
        self.memory.check_room(shard)?;
        let home = self.placement.home(uuid);
        let own_pointer = if shard != home {
            self.point(home, uuid, shard, now_ms).await?
        } else {
            None
        };
        // Pointers stand only in an id's home shard, and only for ids another booking
        // named.
        let look = shard == home && origin == IdOrigin::Given;
        let mut result = self
            .book_in(shard, life, look, now_ms, guard_ms, notify_before_ms)
            .await;
        if let Err(Refusal::Pointer(value)) = &result {
            // Booked in its home shard, which points elsewhere: a Life there, a booking
            // in flight, or a pointer left over.
            if self.pointer_is_stale(home, uuid, value, now_ms).await? {
                self.unpoint(home, uuid, value).await?;
                result = self
                    .book_in(shard, life, look, now_ms, guard_ms, notify_before_ms)
                    .await;
            }
        }
        let refused = match result {
            Ok(()) => {
                self.confirm_replicas(shard, Proof::record(self.shard(shard), uuid))
                    .await?;
                return Ok(());
            }
            Err(Refusal::Api(e)) => e,
            Err(Refusal::Pointer(_)) => duplicate(uuid),
        };
        if let Some(value) = own_pointer {
            // The pointer this call wrote names no Life: take it back.
            let _ = self.unpoint(home, uuid, &value).await;
        }
        Err(refused)
    }

    /// Books a point Life under a debounce key (`scripts/debounce.lua`): into the
    /// pending Life of the key's open window, which takes `life`'s action and time (capped
    /// at its first booking + max_wait), or as a new Life opening a window. `life`'s id
    /// is in the key's shard (`into_booking`), so no pointer is needed.
    /// Answers the Life that will fire, and whether the booking went into a pending one.
    pub async fn book_debounced(
        &self,
        mut life: NewLife,
        key: &str,
        max_wait_ms: i64,
        now_ms: i64,
        notify_before_ms: i64,
    ) -> Result<(NewLife, bool), ApiError> {
        let shard = self.placement.debounce(key);
        debug_assert_eq!(self.placement.home(&life.life_uuid), shard);
        self.memory.check_room(shard)?;
        let k = self.shard(shard);
        let uuid = life.life_uuid.clone();
        let cap_ms = now_ms + max_wait_ms;
        let mut new_record = lifecycle::booked(&life, now_ms);
        new_record.debounce_key = Some(key.to_string());
        let new_record = new_record.to_json();
        for _ in 0..CHANGE_TRIES {
            // The Life of the key's open window, as it is now.
            let seen: Option<String> = redis::cmd("HGET")
                .arg(k.debounce(key))
                .arg("life")
                .query_async(&mut self.conn())
                .await?;
            let seen = seen.unwrap_or_default();
            let mut merge = None;
            if !seen.is_empty() {
                if let Some(loaded) = self.load_in(shard, &seen).await? {
                    let cap: i64 = redis::cmd("HGET")
                        .arg(k.debounce(key))
                        .arg("cap_ms")
                        .query_async::<Option<i64>>(&mut self.conn())
                        .await?
                        .unwrap_or(cap_ms);
                    if lifecycle::debounce_open(&loaded.record, loaded.inflight[0].as_ref()) {
                        let fire_ms = life.birth_at_ms.min(cap);
                        let merged =
                            lifecycle::debounce_merge(&loaded.record, &life, fire_ms, now_ms);
                        merge = Some((loaded, merged, fire_ms));
                    }
                }
            }
            let mut invocation = self.scripts.debounce.prepare_invoke();
            invocation
                .key(k.debounce(key))
                .key(k.due())
                .key(k.lives())
                .key(k.inflight());
            for name in life_plugins(&life) {
                invocation.key(k.plugin_lives(&name));
            }
            invocation
                .arg(&k.prefix)
                .arg(&uuid)
                .arg(life.birth_at_ms)
                .arg(&new_record)
                .arg(cap_ms)
                .arg(now_ms)
                .arg(notify_before_ms)
                .arg(key)
                .arg(max_wait_ms + DEBOUNCE_RECORD_MARGIN_MS)
                .arg(&seen);
            match &merge {
                Some((loaded, merged, fire_ms)) => invocation
                    .arg("1")
                    .arg(&loaded.text)
                    .arg(&loaded.inflight_text[0])
                    .arg(merged.to_json())
                    .arg(fire_ms)
                    .arg(loaded.record.fire_ms(false)),
                None => invocation.arg("0").arg("").arg("").arg("").arg("").arg(""),
            };
            let reply: Vec<String> = invocation
                .invoke_async(&mut self.conn())
                .await
                .map_err(ApiError::write_unknown)?;
            let debounced = match reply.first().map(String::as_str) {
                Some("booked") => false,
                Some("debounced") => {
                    life.life_uuid = reply.get(1).cloned().unwrap_or_default();
                    life.birth_at_ms = reply
                        .get(2)
                        .and_then(|ms| ms.parse().ok())
                        .unwrap_or(life.birth_at_ms);
                    true
                }
                Some("retry") => continue,
                Some("duplicate") => return Err(duplicate(&uuid)),
                other => {
                    return Err(ApiError::unavailable(format!(
                        "unexpected reply from debounce: {other:?}"
                    )))
                }
            };
            // The Life the booking went into is there (a merge that a failover lost
            // before a replica had it is not told apart from the booking it merged into).
            self.confirm_replicas(shard, Proof::record(self.shard(shard), &life.life_uuid))
                .await?;
            return Ok((life, debounced));
        }
        Err(ApiError::unavailable(
            "the debounce key's Life kept changing while this booking went into it; try again",
        ))
    }

    async fn book_in(
        &self,
        shard: u32,
        life: &NewLife,
        look_for_pointer: bool,
        now_ms: i64,
        guard_ms: i64,
        notify_before_ms: i64,
    ) -> Result<(), Refusal> {
        let k = self.shard(shard);
        let booking = Booking {
            due_key: k.due(),
            args: book_args(
                &k.prefix,
                life,
                look_for_pointer,
                now_ms,
                guard_ms,
                notify_before_ms,
            ),
        };
        let (verdict, detail) = self
            .booker(shard)
            .book(booking)
            .await
            .map_err(|e| Refusal::Api(ApiError::write_unknown(e)))?;
        book_reply(life, &[verdict, detail])
    }

    /// Books a Life under an `Idempotency-Key` in one script (`book_idem.lua`) when the
    /// key's record and the Life share a shard: a plain Life whose id was derived from
    /// the key ([`crate::bookings::idempotency::derived_life_id`]). `answer` is the body
    /// answered on success, recorded for repeats. [`IdemBooked::TwoSteps`] when the call
    /// must take the general way instead: another shard, a refusal (which that way
    /// records), or a record left by a call that died.
    #[allow(clippy::too_many_arguments)]
    pub async fn book_idempotent(
        &self,
        life: &NewLife,
        now_ms: i64,
        guard_ms: i64,
        notify_before_ms: i64,
        key: &str,
        fingerprint: &str,
        pending_ms: i64,
        ttl_ms: i64,
        answer: (u16, &str),
    ) -> Result<IdemBooked, ApiError> {
        let shard = self.life_shard(life);
        if shard != self.placement.idempotency(key) || shard != self.placement.home(&life.life_uuid)
        {
            return Ok(IdemBooked::TwoSteps);
        }
        self.memory.check_room(shard)?;
        let k = self.shard(shard);
        let record = k.idempotency(key);
        let rid = life.resource_id.as_deref().unwrap_or("");
        let mut invocation = self.scripts.book_idem.prepare_invoke();
        // Keys declared for a Redis Cluster's routing: the script builds them from the
        // prefix, as book.lua does.
        invocation
            .key(k.due())
            .key(k.lives())
            .key(k.resource(rid))
            .key(&record);
        for name in life_plugins(life) {
            invocation.key(k.plugin_lives(&name));
        }
        // The id was derived from the key: another call may have named it.
        for arg in book_args(&k.prefix, life, true, now_ms, guard_ms, notify_before_ms) {
            invocation.arg(arg);
        }
        let reply: Vec<String> = invocation
            .arg(fingerprint)
            .arg(pending_ms)
            .arg(ttl_ms)
            .arg(answer.0)
            .arg(answer.1)
            .invoke_async(&mut self.conn())
            .await
            .map_err(ApiError::write_unknown)?;
        Ok(match reply.first().map(String::as_str) {
            Some("ok") => {
                self.confirm_replicas(shard, Proof::record(self.shard(shard), &life.life_uuid))
                    .await?;
                IdemBooked::Booked
            }
            Some("replay") if reply.len() == 3 => IdemBooked::Found(IdemBegin::Replay {
                status: reply[1].parse().unwrap_or(200),
                body: reply[2].clone(),
            }),
            Some("reused") => IdemBooked::Found(IdemBegin::Reused),
            Some("in_progress") => IdemBooked::Found(IdemBegin::InProgress),
            _ => IdemBooked::TwoSteps,
        })
    }

    /// Writes the pointer from `uuid`'s home shard to `shard` before the Life is booked
    /// there; returns the value when this call wrote it (to take it back if the booking
    /// is refused). 409 when the id is taken.
    async fn point(
        &self,
        home: u32,
        uuid: &str,
        shard: u32,
        now_ms: i64,
    ) -> Result<Option<String>, ApiError> {
        let k = self.shard(home);
        let value = format!("{shard}:{now_ms}");
        let mut expected = String::new();
        for mode in ["set", "replace"] {
            if mode == "replace" && expected.is_empty() {
                break;
            }
            let reply: Vec<String> = self
                .scripts
                .pointer
                .key(k.pointer(uuid))
                .arg(&k.prefix)
                .arg(mode)
                .arg(&value)
                .arg(&expected)
                .arg(uuid)
                .invoke_async(&mut self.conn())
                .await
                .map_err(ApiError::write_unknown)?;
            match reply.first().map(String::as_str) {
                Some("set") => return Ok(Some(value)),
                // The same shard: its book script tells a duplicate from a left-over.
                Some("same") => return Ok(None),
                Some("other") => {
                    let current = reply.get(1).cloned().unwrap_or_default();
                    if mode == "replace"
                        || !self.pointer_is_stale(home, uuid, &current, now_ms).await?
                    {
                        return Err(duplicate(uuid));
                    }
                    expected = current;
                }
                _ => return Err(duplicate(uuid)),
            }
        }
        Err(duplicate(uuid))
    }

    /// Whether a pointer names a shard without the Life and is old enough not to belong
    /// to a booking in flight.
    async fn pointer_is_stale(
        &self,
        _home: u32,
        uuid: &str,
        value: &str,
        now_ms: i64,
    ) -> Result<bool, ApiError> {
        let Some((shard, written_ms)) = parse_pointer(value) else {
            return Ok(true);
        };
        if shard >= self.shard_count() {
            return Ok(true);
        }
        let exists = self.record_exists(shard, uuid).await?;
        Ok(!exists && now_ms - written_ms > STALE_POINTER_MS)
    }

    /// Deletes a pointer if it is still `expected` (a value, or `{shard}:` for any
    /// pointer to that shard).
    pub(super) async fn unpoint(
        &self,
        home: u32,
        uuid: &str,
        expected: &str,
    ) -> Result<(), ApiError> {
        let k = self.shard(home);
        let _: Vec<String> = self
            .scripts
            .pointer
            .key(k.pointer(uuid))
            .arg(&k.prefix)
            .arg("drop")
            .arg("")
            .arg(expected)
            .arg(uuid)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }
}

/// Why a booking script refused, before the caller decides what to answer.
enum Refusal {
    Api(ApiError),
    /// The id's home shard points elsewhere (the value).
    Pointer(String),
}

/// What `book_life` (common.lua) answered for `life`.
fn book_reply(life: &NewLife, reply: &[String]) -> Result<(), Refusal> {
    let rid = life.resource_id.as_deref().unwrap_or("");
    match reply.first().map(String::as_str) {
        Some("ok") => Ok(()),
        Some("resource_conflict") => Err(Refusal::Api(super::conflict_error(rid, reply.get(1)))),
        Some("duplicate") => Err(Refusal::Api(duplicate(&life.life_uuid))),
        Some("pointer") => Err(Refusal::Pointer(reply.get(1).cloned().unwrap_or_default())),
        // A command of this booking failed in Redis (the others of its call went on).
        Some("error") => Err(Refusal::Api(ApiError::unavailable(format!(
            "storage refused the booking: {}",
            reply.get(1).map_or("", String::as_str)
        )))),
        other => Err(Refusal::Api(ApiError::unavailable(format!(
            "unexpected reply from book: {other:?}"
        )))),
    }
}

/// What [`Store::book_idempotent`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemBooked {
    /// Booked, and the answer recorded for repeats.
    Booked,
    /// The key's record answered (a replay, a reused key, a call under way); nothing booked.
    Found(IdemBegin),
    /// Not done in one step: make the call the general way (idem_begin, call, idem_finish).
    TwoSteps,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_name_a_shard_and_a_time() {
        assert_eq!(
            parse_pointer("12:1765811100000"),
            Some((12, 1_765_811_100_000))
        );
        assert_eq!(parse_pointer("x:1"), None);
        assert_eq!(parse_pointer(""), None);
    }
}
