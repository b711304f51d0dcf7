//! Lives in Redis: booking, PATCH, DELETE, the detail view, listing and the sweep.
//!
//! A Life is stored in one shard (`Placement::life`): its resource's when it has one,
//! else its id's home shard. A Life stored outside its home shard leaves a pointer there
//! (`ptr:{uuid}`, `scripts/pointer.lua`), so GET, PATCH and DELETE find any Life by id in
//! at most two round trips, without looking at other shards.

use super::replicas::Proof;
use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::{lives_member, rfc3339, IdemBegin, Store};
use crate::error::ApiError;
use crate::model::NewLife;
use crate::model::{Action, PlanKind, ScheduleType};

/// A pointer older than this whose Life is not in the shard it names is left over from a
/// booking that did not complete (its host died between the pointer and the Life), and
/// may be replaced. A booking in flight writes both within far less.
const STALE_POINTER_MS: i64 = 60_000;

/// How long a debounce key's record outlives its window's cap: a Life that fires late
/// (a backlog, hosts down) still takes the bookings of its key until it starts.
const DEBOUNCE_RECORD_MARGIN_MS: i64 = 86_400_000;

/// What `DELETE /schedules/{id}` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The Life's state afterwards.
    Done(String),
    Missing,
    Finished(String),
    Running,
}

/// Filters of `GET /schedules`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<String>,
    pub resource_id: Option<String>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    pub limit: usize,
    pub cursor: Option<String>,
}

type Hash = HashMap<String, String>;

/// The plugin names (without `@version`) a booking's actions use.
fn plugin_names(life: &NewLife) -> Vec<&str> {
    let mut names: Vec<&str> = [Some(&life.birth_action), life.death_action.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|a| match a {
            Action::Plugin(p) => Some(p.plugin.split('@').next().unwrap_or("")),
            Action::Webhook(_) => None,
        })
        .collect();
    names.dedup();
    names
}

fn duplicate(uuid: &str) -> ApiError {
    ApiError::conflict(
        "duplicate_life_uuid",
        format!("a Life with life_uuid `{uuid}` already exists"),
    )
}

/// A pointer's shard and the time it was written.
fn parse_pointer(value: &str) -> Option<(u32, i64)> {
    let (shard, ms) = value.split_once(':')?;
    Some((shard.parse().ok()?, ms.parse().ok()?))
}

/// Splits a Life's hash into its own fields and its birth and death Plans' (`b.` and `d.`
/// fields, the prefix taken off); each Plan present gets the Life's `resource_id`.
fn split_plans(hash: Hash) -> (Hash, Hash, Hash) {
    let (mut life, mut birth, mut death) = (Hash::new(), Hash::new(), Hash::new());
    for (field, value) in hash {
        if let Some(name) = field.strip_prefix("b.") {
            birth.insert(name.to_string(), value);
        } else if let Some(name) = field.strip_prefix("d.") {
            death.insert(name.to_string(), value);
        } else {
            life.insert(field, value);
        }
    }
    if let Some(rid) = life.get("resource_id") {
        for plan in [&mut birth, &mut death] {
            if !plan.is_empty() {
                plan.insert("resource_id".into(), rid.clone());
            }
        }
    }
    (life, birth, death)
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
        let mut result = self
            .book_in(shard, life, now_ms, guard_ms, notify_before_ms)
            .await;
        if let Err(Refusal::Pointer(value)) = &result {
            // Booked in its home shard, which points elsewhere: a Life there, a booking
            // in flight, or a pointer left over.
            if self.pointer_is_stale(home, uuid, value, now_ms).await? {
                self.unpoint(home, uuid, value).await?;
                result = self
                    .book_in(shard, life, now_ms, guard_ms, notify_before_ms)
                    .await;
            }
        }
        let refused = match result {
            Ok(()) => {
                let proof = Proof::Exists(self.shard(shard).life(uuid));
                self.confirm_replicas(shard, proof).await?;
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
        let mut invocation = self.scripts.debounce.prepare_invoke();
        invocation
            .key(k.debounce(key))
            .key(k.life(&uuid))
            .key(k.due())
            .key(k.lives());
        for name in plugin_names(&life) {
            invocation.key(k.plugin_lives(name));
        }
        let reply: Vec<String> = invocation
            .arg(&k.prefix)
            .arg(&uuid)
            .arg(life.birth_at_ms)
            .arg(serde_json::to_string(&life.birth_action).expect("actions serialize"))
            .arg(cap_ms)
            .arg(now_ms)
            .arg(notify_before_ms)
            .arg(key)
            .arg(max_wait_ms + DEBOUNCE_RECORD_MARGIN_MS)
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
            Some("duplicate") => return Err(duplicate(&uuid)),
            other => {
                return Err(ApiError::unavailable(format!(
                    "unexpected reply from debounce: {other:?}"
                )))
            }
        };
        // The Life the booking went into is there (a merge that a failover lost before a
        // replica had it is not told apart from the booking it merged into).
        let proof = Proof::Exists(k.life(&life.life_uuid));
        self.confirm_replicas(shard, proof).await?;
        Ok((life, debounced))
    }

    async fn book_in(
        &self,
        shard: u32,
        life: &NewLife,
        now_ms: i64,
        guard_ms: i64,
        notify_before_ms: i64,
    ) -> Result<(), Refusal> {
        let mut invocation = self.scripts.book.prepare_invoke();
        self.book_invocation(
            &mut invocation,
            shard,
            life,
            now_ms,
            guard_ms,
            notify_before_ms,
            None,
        );
        let reply: Vec<String> = invocation
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| Refusal::Api(ApiError::write_unknown(e)))?;
        book_reply(life, &reply)
    }

    /// The keys and arguments of `book_life` (common.lua) for `life` in `shard`, with
    /// the record of an `Idempotency-Key` after the fixed keys when one is given.
    #[allow(clippy::too_many_arguments)]
    fn book_invocation(
        &self,
        invocation: &mut redis::ScriptInvocation<'_>,
        shard: u32,
        life: &NewLife,
        now_ms: i64,
        guard_ms: i64,
        notify_before_ms: i64,
        idem_record: Option<&str>,
    ) {
        let k = self.shard(shard);
        let uuid = &life.life_uuid;
        let rid = life.resource_id.as_deref().unwrap_or("");
        let birth_action = serde_json::to_string(&life.birth_action).expect("actions serialize");
        let death_action = life
            .death_action
            .as_ref()
            .map(|a| serde_json::to_string(a).expect("actions serialize"))
            .unwrap_or_default();
        invocation
            .key(k.life(uuid))
            .key(k.due())
            .key(k.lives())
            .key(k.resource(rid));
        if let Some(record) = idem_record {
            invocation.key(record);
        }
        for name in plugin_names(life) {
            invocation.key(k.plugin_lives(name));
        }
        invocation
            .arg(&k.prefix)
            .arg(uuid)
            .arg(life.schedule_type.as_str())
            .arg(rid)
            .arg(life.birth_at_ms)
            .arg(life.death_at_ms.map(|m| m.to_string()).unwrap_or_default())
            .arg(birth_action)
            .arg(death_action)
            .arg(now_ms)
            .arg(guard_ms)
            .arg(notify_before_ms);
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
        let record = self.shard(shard).idempotency(key);
        let mut invocation = self.scripts.book_idem.prepare_invoke();
        self.book_invocation(
            &mut invocation,
            shard,
            life,
            now_ms,
            guard_ms,
            notify_before_ms,
            Some(&record),
        );
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
                let proof = Proof::Exists(self.shard(shard).life(&life.life_uuid));
                self.confirm_replicas(shard, proof).await?;
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
                .key(k.life(uuid))
                .arg(&k.prefix)
                .arg(mode)
                .arg(&value)
                .arg(&expected)
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
        let exists: bool = redis::cmd("EXISTS")
            .arg(self.shard(shard).life(uuid))
            .query_async(&mut self.conn())
            .await?;
        Ok(!exists && now_ms - written_ms > STALE_POINTER_MS)
    }

    /// Deletes a pointer if it is still `expected` (a value, or `{shard}:` for any
    /// pointer to that shard).
    async fn unpoint(&self, home: u32, uuid: &str, expected: &str) -> Result<(), ApiError> {
        let k = self.shard(home);
        let _: Vec<String> = self
            .scripts
            .pointer
            .key(k.pointer(uuid))
            .key(k.life(uuid))
            .arg(&k.prefix)
            .arg("drop")
            .arg("")
            .arg(expected)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// The shard a Life is in, found from its id alone; None when there is no such Life.
    pub async fn locate(&self, uuid: &str) -> Result<Option<u32>, ApiError> {
        let home = self.placement.home(uuid);
        let k = self.shard(home);
        let (exists, pointer): (bool, Option<String>) = redis::pipe()
            .exists(k.life(uuid))
            .get(k.pointer(uuid))
            .query_async(&mut self.conn())
            .await?;
        if exists {
            return Ok(Some(home));
        }
        Ok(pointer
            .as_deref()
            .and_then(parse_pointer)
            .map(|(shard, _)| shard)
            .filter(|&s| s < self.shard_count()))
    }

    /// A Life's fields and its Plans' (the Life's `b.` and `d.` fields, without the
    /// prefix, each with the Life's `resource_id`), from wherever it is.
    async fn life_hashes(&self, uuid: &str) -> Result<Option<(u32, Hash, Hash, Hash)>, ApiError> {
        let home = self.placement.home(uuid);
        let mut shard = home;
        for _ in 0..2 {
            let k = self.shard(shard);
            let (life, pointer): (Hash, Option<String>) = redis::pipe()
                .hgetall(k.life(uuid))
                .get(k.pointer(uuid))
                .query_async(&mut self.conn())
                .await?;
            if !life.is_empty() {
                let (life, birth, death) = split_plans(life);
                return Ok(Some((shard, life, birth, death)));
            }
            match pointer.as_deref().and_then(parse_pointer) {
                Some((to, _)) if shard == home && to != home && to < self.shard_count() => {
                    shard = to
                }
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Loads a Life as a booking (for PATCH) with its version and state.
    pub async fn load_booking(
        &self,
        uuid: &str,
    ) -> Result<Option<(NewLife, String, String)>, ApiError> {
        let Some((_, life, birth, death)) = self.life_hashes(uuid).await? else {
            return Ok(None);
        };
        let parse_action = |plan: &Hash| -> Option<Action> {
            plan.get("action")
                .and_then(|a| serde_json::from_str(a).ok())
        };
        let schedule_type = match life.get("schedule_type").map(String::as_str) {
            Some("term") => ScheduleType::Term,
            _ => ScheduleType::Point,
        };
        let booking = NewLife {
            life_uuid: uuid.to_string(),
            schedule_type,
            resource_id: life.get("resource_id").cloned(),
            birth_at_ms: life
                .get("birth_at_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            death_at_ms: life.get("death_at_ms").and_then(|v| v.parse().ok()),
            birth_action: parse_action(&birth)
                .ok_or_else(|| ApiError::unavailable("stored birth action unreadable"))?,
            death_action: parse_action(&death),
        };
        Ok(Some((
            booking,
            life.get("version").cloned().unwrap_or_else(|| "0".into()),
            life.get("state").cloned().unwrap_or_default(),
        )))
    }

    /// Applies a merged PATCH atomically if the Life is still at `version`.
    /// Returns Ok(false) when the Life changed meanwhile (the caller retries).
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        current: &NewLife,
        version: &str,
        merged: &NewLife,
        now_ms: i64,
        guard_ms: i64,
        notify_before_ms: i64,
    ) -> Result<bool, ApiError> {
        let shard = self.life_shard(current);
        if self.life_shard(merged) != shard {
            return Err(ApiError::conflict(
                "resource_shard_change",
                format!(
                    "resource `{}` is kept in another shard than this Life's; to move the Life there, delete it and book it again",
                    merged.resource_id.as_deref().unwrap_or("")
                ),
            ));
        }
        let k = self.shard(shard);
        let uuid = &merged.life_uuid;
        let birth_changed = current.birth_at_ms != merged.birth_at_ms
            || current.birth_action != merged.birth_action;
        let death_changed = current.death_at_ms != merged.death_at_ms
            || current.death_action != merged.death_action;
        let resource_changed = current.resource_id != merged.resource_id;
        let new_rid = merged.resource_id.as_deref().unwrap_or("");
        let mut invocation = self.scripts.patch.prepare_invoke();
        invocation
            .key(k.life(uuid))
            .key(k.due())
            .key(k.lives())
            .key(k.resource(current.resource_id.as_deref().unwrap_or("")))
            .key(k.resource(new_rid));
        for name in plugin_names(merged) {
            invocation.key(k.plugin_lives(name));
        }
        let reply: Vec<String> = invocation
            .arg(&k.prefix)
            .arg(uuid)
            .arg(version)
            .arg(new_rid)
            .arg(merged.birth_at_ms)
            .arg(
                merged
                    .death_at_ms
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            )
            .arg(serde_json::to_string(&merged.birth_action).expect("actions serialize"))
            .arg(
                merged
                    .death_action
                    .as_ref()
                    .map(|a| serde_json::to_string(a).expect("actions serialize"))
                    .unwrap_or_default(),
            )
            .arg(now_ms)
            .arg(guard_ms)
            .arg(notify_before_ms)
            .arg(if birth_changed { "1" } else { "0" })
            .arg(if death_changed { "1" } else { "0" })
            .arg(if resource_changed { "1" } else { "0" })
            .invoke_async(&mut self.conn())
            .await
            .map_err(ApiError::write_unknown)?;
        match reply.first().map(String::as_str) {
            Some("ok") => {
                // The PATCH bumped the Life's version past the one it was made against.
                let made_on: i64 = version.parse().unwrap_or(0);
                let proof = Proof::AtLeast(k.life(uuid), "version", made_on + 1);
                self.confirm_replicas(shard, proof).await?;
                Ok(true)
            }
            Some("changed") => Ok(false),
            Some("cancelled") => Err(ApiError::conflict(
                "life_cancelled",
                "this Life was cancelled (DELETE) and its death runs now; it cannot change",
            )),
            Some("not_pending") => Err(ApiError::conflict(
                "plan_not_pending",
                format!(
                    "the {} Plan has already started or finished; only Plans still Standby can change",
                    reply.get(1).map(String::as_str).unwrap_or("birth")
                ),
            )),
            Some("resource_conflict") => Err(super::conflict_error(new_rid, reply.get(1))),
            other => Err(ApiError::unavailable(format!("unexpected reply from patch: {other:?}"))),
        }
    }

    /// Cancels a Life (DELETE).
    pub async fn cancel(
        &self,
        uuid: &str,
        force: bool,
        now_ms: i64,
        notify_before_ms: i64,
    ) -> Result<CancelOutcome, ApiError> {
        let Some(shard) = self.locate(uuid).await? else {
            return Ok(CancelOutcome::Missing);
        };
        let k = self.shard(shard);
        let reply: Vec<String> = self
            .scripts
            .cancel
            .key(k.life(uuid))
            .key(k.due())
            .arg(&k.prefix)
            .arg(uuid)
            .arg(now_ms)
            .arg(if force { "1" } else { "0" })
            .arg(notify_before_ms)
            .invoke_async(&mut self.conn())
            .await
            .map_err(ApiError::write_unknown)?;
        let second = reply.get(1).cloned().unwrap_or_default();
        Ok(match reply.first().map(String::as_str) {
            Some("ok") => {
                // Every way a cancel is applied stamps the Life's updated_at_ms with now.
                let proof = Proof::AtLeast(k.life(uuid), "updated_at_ms", now_ms);
                self.confirm_replicas(shard, proof).await?;
                CancelOutcome::Done(second)
            }
            Some("missing") => CancelOutcome::Missing,
            Some("finished") => CancelOutcome::Finished(second),
            Some("running") => CancelOutcome::Running,
            other => {
                return Err(ApiError::unavailable(format!(
                    "unexpected reply from cancel: {other:?}"
                )))
            }
        })
    }

    /// The Life as the API shows it: fields, Plans and recent history (newest first).
    pub async fn life_view(
        &self,
        uuid: &str,
        history_count: usize,
    ) -> Result<Option<Value>, ApiError> {
        let Some((_, life, birth, death)) = self.life_hashes(uuid).await? else {
            return Ok(None);
        };
        let mut view = life_summary(uuid, &life, self.timezone);
        let plans: Vec<Value> = [(PlanKind::Birth, birth), (PlanKind::Death, death)]
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .map(|(kind, p)| self.plan_view(*kind, p))
            .collect();
        view.insert("plans".into(), Value::Array(plans));
        view.insert(
            "history".into(),
            Value::Array(self.history_view(&life, history_count)),
        );
        Ok(Some(Value::Object(view)))
    }

    fn plan_view(&self, kind: PlanKind, p: &Hash) -> Value {
        let mut out = Map::new();
        let text = |k: &str| p.get(k).cloned().map(Value::String).unwrap_or(Value::Null);
        let num = |k: &str| {
            p.get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .map(Value::from)
                .unwrap_or(Value::Null)
        };
        out.insert("kind".into(), Value::String(kind.as_str().into()));
        out.insert("state".into(), text("state"));
        let fire_at_ms = p.get("fire_at_ms").and_then(|v| v.parse::<i64>().ok());
        out.insert(
            "fire_at".into(),
            fire_at_ms
                .map(|ms| Value::String(self.fmt(ms)))
                .unwrap_or(Value::Null),
        );
        out.insert("fire_at_ms".into(), num("fire_at_ms"));
        // `attempts` is written with the first run.
        let attempts = p.get("attempts").and_then(|v| v.parse::<i64>().ok());
        out.insert("attempts".into(), attempts.unwrap_or(0).into());
        out.insert("last_status".into(), num("last_status"));
        out.insert("last_error".into(), text("last_error"));
        let next = match p.get("state").map(String::as_str) {
            Some("Standby") | Some("Preset") => {
                p.get("fire_at_ms").and_then(|v| v.parse::<i64>().ok())
            }
            _ => None,
        };
        out.insert(
            "next_attempt_at".into(),
            next.map(|ms| Value::String(self.fmt(ms)))
                .unwrap_or(Value::Null),
        );
        out.insert(
            "next_attempt_at_ms".into(),
            next.map(Value::from).unwrap_or(Value::Null),
        );
        if let (Some("Preset" | "Running"), Some(owner)) =
            (p.get("state").map(String::as_str), p.get("lease_owner"))
        {
            out.insert("held_by".into(), Value::String(owner.clone()));
        }
        out.insert(
            "action".into(),
            p.get("action")
                .and_then(|a| serde_json::from_str(a).ok())
                .unwrap_or(Value::Null),
        );
        Value::Object(out)
    }

    /// The run records kept in the Life hash (`run:{plan}:{attempt}`), newest first, with
    /// RFC 3339 times next to the epoch ms.
    fn history_view(&self, life: &Hash, count: usize) -> Vec<Value> {
        let mut runs: Vec<Map<String, Value>> = life
            .iter()
            .filter(|(field, _)| field.starts_with("run:"))
            .filter_map(|(_, record)| match serde_json::from_str(record) {
                Ok(Value::Object(map)) => Some(map),
                _ => None,
            })
            .collect();
        let started =
            |r: &Map<String, Value>| r.get("started_at").and_then(Value::as_i64).unwrap_or(0);
        runs.sort_by_key(|r| std::cmp::Reverse(started(r)));
        runs.truncate(count);
        runs.into_iter()
            .map(|mut run| {
                for name in ["should_run_at", "started_at"] {
                    if let Some(ms) = run.get(name).and_then(Value::as_i64) {
                        run.insert(format!("{name}_ms"), Value::from(ms));
                        run.insert(name.into(), Value::String(self.fmt(ms)));
                    }
                }
                Value::Object(run)
            })
            .collect()
    }

    /// Lists Lives by birth time with filters; returns the page and the next cursor.
    ///
    /// The cursor is the last `lives` member returned (`{birth_ms:013}:{uuid}`), an exact
    /// position in the one order of every shard's Lives together: each pass reads a few
    /// members past it from every shard and merges them, keeping only those below the
    /// first shard's horizon (the last member of a shard that had more), so that nothing
    /// is ever skipped or repeated.
    pub async fn list(
        &self,
        filter: &ListFilter,
    ) -> Result<(Vec<Value>, Option<String>), ApiError> {
        let min_member = match (&filter.cursor, filter.from_ms) {
            (Some(cursor), _) => format!("({cursor}"),
            (None, Some(from)) => format!("[{from:013}"),
            (None, None) => "-".to_string(),
        };
        let max_member = match filter.to_ms {
            Some(to) => format!("[{to:013}:\u{7f}"),
            None => "+".to_string(),
        };
        // With a resource filter the candidates come from that resource's index, in
        // its one shard, which is small.
        let resource: Option<(u32, Vec<String>)> = match &filter.resource_id {
            Some(rid) => {
                let shard = self.placement.resource(rid);
                let items: Vec<(String, i64)> = redis::cmd("ZRANGE")
                    .arg(self.shard(shard).resource(rid))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(&mut self.conn())
                    .await?;
                let mut members: Vec<String> = items
                    .into_iter()
                    .map(|(id, ms)| lives_member(ms, &id))
                    .collect();
                members.sort();
                Some((shard, members))
            }
            None => None,
        };
        let shards: Vec<u32> = match &resource {
            Some((shard, _)) => vec![*shard],
            None => (0..self.shard_count()).collect(),
        };
        let want = filter.limit.max(1);
        // Members read per shard and pass: the page spread over the shards, with room.
        let per_shard = (2 * want / shards.len() + 4).min(1000);
        let max_scanned = want * 20;
        let mut scanned = 0usize;
        let mut page = Vec::new();
        let mut next_min = min_member;
        let mut last_member: Option<String> = None;
        let mut exhausted = false;

        while page.len() < filter.limit && scanned < max_scanned {
            // (shard, member) in one order, up to the horizon.
            let (members, complete) = match &resource {
                Some((shard, all)) => {
                    let batch: Vec<(u32, String)> = all
                        .iter()
                        .filter(|m| lex_in_range(m, &next_min, &max_member))
                        .take(per_shard.max(want))
                        .map(|m| (*shard, m.clone()))
                        .collect();
                    let complete = batch.len() < per_shard.max(want);
                    (batch, complete)
                }
                None => {
                    self.merge_lives(&shards, &next_min, &max_member, per_shard)
                        .await?
                }
            };
            if members.is_empty() {
                exhausted = true;
                break;
            }
            let uuid_of = |member: &str| {
                member
                    .split_once(':')
                    .map(|(_, u)| u.to_string())
                    .unwrap_or_default()
            };
            let lives = self
                .summaries_by_shard(
                    members
                        .iter()
                        .map(|(shard, m)| (*shard, self.shard(*shard).life(&uuid_of(m))))
                        .collect(),
                )
                .await?;
            let mut full = false;
            for ((_, member), life) in members.into_iter().zip(lives) {
                scanned += 1;
                next_min = format!("({member}");
                last_member = Some(member.clone());
                if life.is_empty() {
                    continue;
                }
                if let Some(state) = &filter.state {
                    if life.get("state") != Some(state) {
                        continue;
                    }
                }
                page.push(Value::Object(life_summary(
                    &uuid_of(&member),
                    &life,
                    self.timezone,
                )));
                if page.len() == filter.limit {
                    full = true;
                    break;
                }
            }
            if complete && !full {
                exhausted = true;
                break;
            }
        }
        let next_cursor = if exhausted { None } else { last_member };
        Ok((page, next_cursor))
    }

    /// Up to `per_shard` members after `min` from each shard's `lives`, merged in order
    /// and cut at the horizon; true when every shard has been read to its end.
    async fn merge_lives(
        &self,
        shards: &[u32],
        min: &str,
        max: &str,
        per_shard: usize,
    ) -> Result<(Vec<(u32, String)>, bool), ApiError> {
        let reads = shards.iter().map(|&shard| {
            let mut conn = self.conn();
            let key = self.shard(shard).lives();
            async move {
                let members: Vec<String> = redis::cmd("ZRANGEBYLEX")
                    .arg(key)
                    .arg(min)
                    .arg(max)
                    .arg("LIMIT")
                    .arg(0)
                    .arg(per_shard)
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>((shard, members))
            }
        });
        let results = futures_util::future::try_join_all(reads).await?;
        // A shard that returned a full batch may have more after its last member: only
        // what sorts before the smallest such last member is known to be complete.
        let horizon: Option<String> = results
            .iter()
            .filter(|(_, m)| m.len() == per_shard)
            .filter_map(|(_, m)| m.last().cloned())
            .min();
        let mut merged: Vec<(u32, String)> = results
            .into_iter()
            .flat_map(|(shard, members)| members.into_iter().map(move |m| (shard, m)))
            .filter(|(_, m)| horizon.as_ref().is_none_or(|h| m <= h))
            .collect();
        merged.sort_by(|a, b| a.1.cmp(&b.1));
        Ok((merged, horizon.is_none()))
    }

    /// The fields [`life_summary`] shows of many Lives, one pipeline per shard (a cluster
    /// takes no pipeline across slots), all shards at once; results in the order asked.
    /// HMGET, not HGETALL: a Life's hash also holds its Plans' actions and its run
    /// history, which a listing does not show.
    pub(crate) async fn summaries_by_shard(
        &self,
        keys: Vec<(u32, String)>,
    ) -> Result<Vec<Hash>, redis::RedisError> {
        let mut by_shard: HashMap<u32, Vec<(usize, String)>> = HashMap::new();
        for (i, (shard, key)) in keys.into_iter().enumerate() {
            by_shard.entry(shard).or_default().push((i, key));
        }
        let total = by_shard.values().map(Vec::len).sum();
        let reads = by_shard.into_values().map(|items| {
            let mut conn = self.conn();
            async move {
                let mut pipe = redis::pipe();
                for (_, key) in &items {
                    pipe.cmd("HMGET").arg(key).arg(&SUMMARY_FIELDS);
                }
                let values: Vec<Vec<Option<String>>> = pipe.query_async(&mut conn).await?;
                let hashes = values.into_iter().map(|v| {
                    SUMMARY_FIELDS
                        .iter()
                        .zip(v)
                        .filter_map(|(f, v)| Some((f.to_string(), v?)))
                        .collect::<Hash>()
                });
                Ok::<_, redis::RedisError>(items.into_iter().map(|(i, _)| i).zip(hashes))
            }
        });
        let mut out = vec![Hash::new(); total];
        for part in futures_util::future::try_join_all(reads).await? {
            for (i, hash) in part {
                out[i] = hash;
            }
        }
        Ok(out)
    }

    /// Deletes up to `batch` Lives of a shard finished before `cutoff_ms`, with their
    /// pointers in other shards; returns how many.
    pub async fn sweep(&self, shard: u32, cutoff_ms: i64, batch: usize) -> redis::RedisResult<i64> {
        let k = self.shard(shard);
        let swept: Vec<String> = self
            .scripts
            .sweep
            .key(k.finished())
            .key(k.lives())
            .key(k.runs())
            .arg(&k.prefix)
            .arg(cutoff_ms)
            .arg(batch)
            .invoke_async(&mut self.conn())
            .await?;
        for uuid in &swept {
            let home = self.placement.home(uuid);
            if home != shard {
                if let Err(e) = self.unpoint(home, uuid, &format!("{shard}:")).await {
                    tracing::debug!(life = %uuid, error = %e, "cannot remove a swept Life's pointer");
                }
            }
        }
        Ok(swept.len() as i64)
    }
}

impl Store {
    /// How many finished Lives a shard keeps and an estimate of the bytes of Redis they
    /// take (`scripts/history_size.lua`, from a sample of `sample` of them).
    pub async fn history_size(&self, shard: u32, sample: usize) -> redis::RedisResult<(u64, u64)> {
        let k = self.shard(shard);
        self.scripts
            .history_size
            .key(k.finished())
            .arg(&k.prefix)
            .arg(sample)
            .invoke_async(&mut self.conn())
            .await
    }

    /// When a shard keeps more than `keep` finished Lives: how many of the oldest to
    /// delete (at most `batch`) and the finish time of the last of them, the cutoff to
    /// `sweep` them with.
    pub async fn history_excess(
        &self,
        shard: u32,
        keep: u64,
        batch: usize,
    ) -> redis::RedisResult<Option<(i64, usize)>> {
        let finished = self.shard(shard).finished();
        let mut conn = self.conn();
        let count: u64 = redis::cmd("ZCARD")
            .arg(&finished)
            .query_async(&mut conn)
            .await?;
        if count <= keep {
            return Ok(None);
        }
        let excess = ((count - keep) as usize).min(batch);
        let last: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&finished)
            .arg(excess - 1)
            .arg(excess - 1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        Ok(last.first().map(|(_, at)| (*at as i64, excess)))
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

/// Whether `member` lies within a ZRANGEBYLEX-style range (`-`, `+`, `[x`, `(x`).
pub(crate) fn lex_in_range(member: &str, min: &str, max: &str) -> bool {
    let above = match min {
        "-" => true,
        _ if min.starts_with('(') => member > &min[1..],
        _ => member >= min.trim_start_matches('['),
    };
    let below = match max {
        "+" => true,
        _ if max.starts_with('(') => member < &max[1..],
        _ => member <= max.trim_start_matches('['),
    };
    above && below
}

/// Every field of a Life's hash that [`life_summary`] reads.
const SUMMARY_FIELDS: [&str; 13] = [
    "schedule_type",
    "state",
    "resource_id",
    "birth_at_ms",
    "death_at_ms",
    "created_at_ms",
    "created_at",
    "updated_at_ms",
    "finished_at_ms",
    "cancel_requested",
    "callback_of",
    "debounce_key",
    "debounced",
];

/// The fields of a Life common to the list and the detail view.
/// What the API shows of a Life, from its hash; times are kept in ms and rendered here
/// in `tz` (hashes written before 0.2 also kept an RFC 3339 `created_at`).
fn life_summary(uuid: &str, life: &Hash, tz: chrono_tz::Tz) -> Map<String, Value> {
    let mut out = Map::new();
    let text = |k: &str| {
        life.get(k)
            .cloned()
            .map(Value::String)
            .unwrap_or(Value::Null)
    };
    let num = |k: &str| {
        life.get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .map(Value::from)
            .unwrap_or(Value::Null)
    };
    out.insert("life_uuid".into(), Value::String(uuid.to_string()));
    out.insert("schedule_type".into(), text("schedule_type"));
    out.insert("state".into(), text("state"));
    out.insert("resource_id".into(), text("resource_id"));
    let time = |k: &str| {
        life.get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .map(|ms| Value::String(rfc3339(ms, tz)))
            .unwrap_or(Value::Null)
    };
    out.insert("birth_time".into(), time("birth_at_ms"));
    out.insert("birth_time_ms".into(), num("birth_at_ms"));
    out.insert("death_time".into(), time("death_at_ms"));
    out.insert("death_time_ms".into(), num("death_at_ms"));
    let created = match time("created_at_ms") {
        Value::Null => text("created_at"),
        at => at,
    };
    out.insert("created_at".into(), created);
    out.insert("updated_at_ms".into(), num("updated_at_ms"));
    if life.contains_key("finished_at_ms") {
        out.insert("finished_at_ms".into(), num("finished_at_ms"));
    }
    if life.get("cancel_requested").map(String::as_str) == Some("1") {
        out.insert("cancel_requested".into(), Value::Bool(true));
    }
    if life.contains_key("callback_of") {
        // The Plan whose outcome this Life reports (see model::Callbacks).
        out.insert("callback_of".into(), text("callback_of"));
    }
    if life.contains_key("debounce_key") {
        // Bookings of its debounce key merged into it, besides the one that opened it.
        let merged = life.get("debounced").and_then(|n| n.parse::<i64>().ok());
        out.insert(
            "debounce".into(),
            json!({"key": text("debounce_key"), "bookings": 1 + merged.unwrap_or(0)}),
        );
    }
    out
}

/// A JSON summary of a freshly booked Life, for the POST response.
pub fn booked_view(life: &NewLife, tz: chrono_tz::Tz) -> Value {
    json!({
        "life_uuid": life.life_uuid,
        "schedule_type": life.schedule_type.as_str(),
        "state": "Inexistent",
        "resource_id": life.resource_id,
        "birth_time": rfc3339(life.birth_at_ms, tz),
        "birth_time_ms": life.birth_at_ms,
        "death_time": life.death_at_ms.map(|m| rfc3339(m, tz)),
        "death_time_ms": life.death_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lives_members_sort_by_time() {
        let a = lives_member(999, "zz");
        let b = lives_member(1_765_811_100_000, "aa");
        assert!(a < b);
        assert_eq!(b, "1765811100000:aa");
        assert!(lex_in_range(&b, "(0000000000999:zz", "+"));
        assert!(!lex_in_range(&a, "(0000000000999:zz", "+"));
        assert!(lex_in_range(&b, "[1765811100000", "[1765811100000:\u{7f}"));
    }

    #[test]
    fn a_listing_reads_every_field_a_summary_shows() {
        // Every field a Life's hash may hold, its Plans' and history included.
        let full: Hash = [
            ("schedule_type", "term"),
            ("state", "Dead"),
            ("resource_id", "conn-1"),
            ("birth_at_ms", "1765811100000"),
            ("death_at_ms", "1765811200000"),
            ("created_at_ms", "1765811000000"),
            ("created_at", "2025-12-15T15:03:20Z"),
            ("updated_at_ms", "1765811300000"),
            ("finished_at_ms", "1765811300000"),
            ("cancel_requested", "1"),
            ("callback_of", "x:birth"),
            ("debounce_key", "k"),
            ("debounced", "3"),
            ("version", "2"),
            ("birth_uncertain", "1"),
            ("b.state", "Done"),
            ("b.action", "{}"),
            ("d.state", "Done"),
            ("run:birth:1", "{}"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let listed: Hash = full
            .iter()
            .filter(|(k, _)| SUMMARY_FIELDS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(
            life_summary("x", &listed, chrono_tz::UTC),
            life_summary("x", &full, chrono_tz::UTC)
        );
        // Without created_at_ms, the older RFC 3339 field shows.
        let mut old = listed.clone();
        old.remove("created_at_ms");
        assert_eq!(
            life_summary("x", &old, chrono_tz::UTC)["created_at"],
            "2025-12-15T15:03:20Z"
        );
    }

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
