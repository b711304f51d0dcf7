//! Changing a Life in Redis (layout 4): reading it with its Plans' claims, PATCH,
//! DELETE. Each change is decided in Rust (`lifecycle.rs`) from what was read and
//! written by `scripts/life_apply.lua` only if nothing changed meanwhile.

use super::lifecycle::{self, Cancel, PatchRefusal};
use super::lives::{life_plugins, parse_pointer};
use super::record::{Inflight, LifeRecord};
use super::replicas::Proof;
use super::Store;
use crate::error::ApiError;
use crate::model::{NewLife, PlanKind, ScheduleType};

/// How many times a change read from a Life that changed meanwhile is made again.
pub(super) const CHANGE_TRIES: usize = 8;

/// What `DELETE /schedules/{id}` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The Life's state afterwards.
    Done(String),
    Missing,
    Finished(String),
    Running,
}

/// A Life as read to change or show it: its shard, its record (and that record's text,
/// which a change must find unchanged), and its Plans' `inflight` entries.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub shard: u32,
    pub text: String,
    pub record: LifeRecord,
    pub inflight_text: [String; 2],
    pub inflight: [Option<Inflight>; 2],
}

impl Loaded {
    /// The Life from `life_load.lua`'s answer.
    fn parse(
        shard: u32,
        [text, birth, death]: [String; 3],
    ) -> Result<Option<Loaded>, serde_json::Error> {
        if text.is_empty() {
            return Ok(None);
        }
        let record = LifeRecord::from_json(&text)?;
        let inflight = [Inflight::parse(&birth), Inflight::parse(&death)];
        Ok(Some(Loaded {
            shard,
            text,
            record,
            inflight_text: [birth, death],
            inflight,
        }))
    }

    pub fn inflight_refs(&self) -> [Option<&Inflight>; 2] {
        [self.inflight[0].as_ref(), self.inflight[1].as_ref()]
    }

    /// The Life as a booking (for PATCH).
    pub fn booking(&self, uuid: &str) -> NewLife {
        let r = &self.record;
        NewLife {
            life_uuid: uuid.to_string(),
            schedule_type: if r.is_term() {
                ScheduleType::Term
            } else {
                ScheduleType::Point
            },
            resource_id: r.resource_id.clone(),
            birth_at_ms: r.birth_ms,
            death_at_ms: r.death_ms,
            birth_action: r.birth_action.clone(),
            death_action: r.death_action.clone(),
        }
    }
}

fn unreadable(uuid: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable(format!(
        "the stored record of Life `{uuid}` is unreadable: {e}"
    ))
}

impl Store {
    /// Whether a Life's record is in `shard`.
    pub(crate) async fn record_exists(&self, shard: u32, uuid: &str) -> Result<bool, ApiError> {
        Ok(self.load_in(shard, uuid).await?.is_some())
    }

    /// The shard a Life is in, found from its id alone; None when there is no such Life.
    pub async fn locate(&self, uuid: &str) -> Result<Option<u32>, ApiError> {
        Ok(self.load(uuid).await?.map(|l| l.shard))
    }

    /// A Life as it is in `shard` (`scripts/life_load.lua`), if it is there.
    pub(crate) async fn load_in(&self, shard: u32, uuid: &str) -> Result<Option<Loaded>, ApiError> {
        let texts = self.load_texts(shard, uuid).await?;
        Loaded::parse(shard, texts).map_err(|e| unreadable(uuid, e))
    }

    /// A Life's record and its Plans' `inflight` entries as stored ('' = none).
    async fn load_texts(&self, shard: u32, uuid: &str) -> redis::RedisResult<[String; 3]> {
        let k = self.shard(shard);
        let (text, birth, death): (String, String, String) = self
            .scripts
            .life_load
            .key(k.inflight())
            .arg(&k.prefix)
            .arg(uuid)
            .invoke_async(&mut self.conn())
            .await?;
        Ok([text, birth, death])
    }

    /// A Life, from wherever it is: its home shard, or the shard its pointer there names.
    pub async fn load(&self, uuid: &str) -> Result<Option<Loaded>, ApiError> {
        let home = self.placement.home(uuid);
        if let Some(found) = self.load_in(home, uuid).await? {
            return Ok(Some(found));
        }
        let pointer: Option<String> = redis::cmd("GET")
            .arg(self.shard(home).pointer(uuid))
            .query_async(&mut self.conn())
            .await?;
        match pointer.as_deref().and_then(parse_pointer) {
            Some((to, _)) if to != home && to < self.shard_count() => self.load_in(to, uuid).await,
            _ => Ok(None),
        }
    }

    /// Loads a Life as a booking (for PATCH) with its version and state.
    pub async fn load_booking(
        &self,
        uuid: &str,
    ) -> Result<Option<(NewLife, String, String)>, ApiError> {
        let Some(loaded) = self.load(uuid).await? else {
            return Ok(None);
        };
        Ok(Some((
            loaded.booking(uuid),
            loaded.record.version.to_string(),
            loaded.record.state.clone(),
        )))
    }

    /// Writes a change of one Life (`scripts/life_apply.lua`): its new record (None:
    /// deleted) and `ops`, if its record and its Plans' `inflight` entries are still as
    /// `loaded` read them.
    pub(crate) async fn apply_change(
        &self,
        uuid: &str,
        loaded: &Loaded,
        new: Option<&LifeRecord>,
        ops: &[String],
        notify_before_ms: i64,
        now_ms: i64,
    ) -> Result<Applied, ApiError> {
        let read = Read {
            shard: loaded.shard,
            text: &loaded.text,
            inflight: [&loaded.inflight_text[0], &loaded.inflight_text[1]],
        };
        let new = new.map(LifeRecord::to_json).unwrap_or_default();
        self.apply_raw(uuid, read, &new, ops, notify_before_ms, now_ms)
            .await
            .map_err(ApiError::write_unknown)
    }

    /// `apply_change` on texts as read.
    async fn apply_raw(
        &self,
        uuid: &str,
        read: Read<'_>,
        new: &str,
        ops: &[String],
        notify_before_ms: i64,
        now_ms: i64,
    ) -> redis::RedisResult<Applied> {
        let k = self.shard(read.shard);
        let mut invocation = self.scripts.life_apply.prepare_invoke();
        invocation
            .key(k.due())
            .key(k.lives())
            .key(k.finished())
            .key(k.inflight())
            .key(k.runs())
            .arg(&k.prefix)
            .arg(uuid)
            .arg(read.text)
            .arg(new)
            .arg(now_ms)
            .arg(notify_before_ms)
            .arg(self.runs_max_len)
            .arg(read.inflight[0])
            .arg(read.inflight[1]);
        for op in ops {
            invocation.arg(op);
        }
        let reply: Vec<String> = invocation.invoke_async(&mut self.conn()).await?;
        match reply.first().map(String::as_str) {
            Some("ok") => Ok(Applied::Done),
            Some("changed") => Ok(Applied::Changed),
            Some("resource_conflict") => {
                Ok(Applied::Conflict(reply.get(1).cloned().unwrap_or_default()))
            }
            other => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "unexpected reply from life_apply",
                format!("{other:?}"),
            ))),
        }
    }

    /// Records Lives' runs cut off by their host (a crash, a lost lease), as the shard's
    /// release scripts answer them (`{plan_id, inflight entry, ...}`): each run into its
    /// Life's history as interrupted, and its Plan due again at its time. A run whose
    /// entry changed meanwhile (its host finished it after all) is left alone. Returns
    /// how many Plans went back.
    pub(crate) async fn record_cut_off(
        &self,
        shard: u32,
        entries: &[String],
        notify_before_ms: i64,
        now_ms: i64,
    ) -> redis::RedisResult<i64> {
        let mut moved = 0;
        for pair in entries.chunks_exact(2) {
            let (plan_id, entry) = (&pair[0], &pair[1]);
            let Some((uuid, kind)) = plan_id
                .rsplit_once(':')
                .and_then(|(u, k)| Some((u, k.parse::<PlanKind>().ok()?)))
            else {
                continue;
            };
            let Some(f) = Inflight::parse(entry) else {
                continue;
            };
            let slot = usize::from(kind == PlanKind::Death);
            for _ in 0..CHANGE_TRIES {
                let loaded = match Loaded::parse(shard, self.load_texts(shard, uuid).await?) {
                    Ok(loaded) => loaded,
                    Err(e) => {
                        tracing::error!(life = %uuid, error = %e, "the record of a Life whose run was cut off is unreadable; its claim stays");
                        break;
                    }
                };
                let mut inflight = ["-", "-"];
                inflight[slot] = entry;
                let mut ops: Vec<String> = vec!["infl-".into(), plan_id.clone()];
                let (text, new) = match &loaded {
                    Some(loaded) if loaded.inflight_text[slot] != *entry => break,
                    Some(loaded) => {
                        let (record, run) =
                            lifecycle::interrupted(&loaded.record, kind, &f, now_ms);
                        ops.extend([
                            "due+".into(),
                            plan_id.clone(),
                            f.fire_ms.to_string(),
                            "runs".into(),
                            kind.as_str().into(),
                            "interrupted".into(),
                            run.view().to_string(),
                        ]);
                        (loaded.text.clone(), record.to_json())
                    }
                    // The Life is gone: only its claim is left.
                    None => (String::new(), String::new()),
                };
                let read = Read {
                    shard,
                    text: &text,
                    inflight,
                };
                match self
                    .apply_raw(uuid, read, &new, &ops, notify_before_ms, now_ms)
                    .await?
                {
                    Applied::Done => {
                        moved += i64::from(!new.is_empty());
                        break;
                    }
                    _ => continue,
                }
            }
        }
        Ok(moved)
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
        let uuid = &merged.life_uuid;
        let Some(loaded) = self.load_in(shard, uuid).await? else {
            return Ok(false);
        };
        let expected: u64 = version.parse().unwrap_or(0);
        let change = lifecycle::patch(
            &loaded.record,
            uuid,
            loaded.inflight_refs(),
            expected,
            merged,
            guard_ms,
            now_ms,
        );
        let (record, mut ops) = match change {
            Ok(change) => change,
            Err(PatchRefusal::Changed) => return Ok(false),
            Err(PatchRefusal::Cancelled) => {
                return Err(ApiError::conflict(
                    "life_cancelled",
                    "this Life was cancelled (DELETE) and its death runs now; it cannot change",
                ))
            }
            Err(PatchRefusal::NotPending(kind)) => {
                return Err(ApiError::conflict(
                    "plan_not_pending",
                    format!(
                        "the {} Plan has already started or finished; only Plans still Standby can change",
                        kind.as_str()
                    ),
                ))
            }
        };
        for name in life_plugins(merged) {
            ops.0.push("plugin+".into());
            ops.0.push(name);
        }
        match self
            .apply_change(
                uuid,
                &loaded,
                Some(&record),
                &ops.0,
                notify_before_ms,
                now_ms,
            )
            .await?
        {
            Applied::Done => {
                let proof =
                    Proof::record_at_least(self.shard(shard), uuid, "v", record.version as i64);
                self.confirm_replicas(shard, proof).await?;
                Ok(true)
            }
            Applied::Changed => Ok(false),
            Applied::Conflict(other) => Err(super::conflict_error(
                merged.resource_id.as_deref().unwrap_or(""),
                Some(&other),
            )),
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
        for _ in 0..CHANGE_TRIES {
            let Some(loaded) = self.load(uuid).await? else {
                return Ok(CancelOutcome::Missing);
            };
            let (record, ops, to) = match lifecycle::cancel(
                &loaded.record,
                uuid,
                loaded.inflight_refs(),
                force,
                now_ms,
            ) {
                Cancel::Apply(record, ops, to) => (record, ops, to),
                Cancel::Finished(state) => {
                    return Ok(CancelOutcome::Finished(state.as_str().into()))
                }
                Cancel::Running => return Ok(CancelOutcome::Running),
            };
            match self
                .apply_change(
                    uuid,
                    &loaded,
                    Some(&record),
                    &ops.0,
                    notify_before_ms,
                    now_ms,
                )
                .await?
            {
                Applied::Done => {
                    // Every way a cancel is applied stamps the Life with now (`u` or `f`).
                    let proof =
                        Proof::record_at_least(self.shard(loaded.shard), uuid, "uf", now_ms);
                    self.confirm_replicas(loaded.shard, proof).await?;
                    return Ok(CancelOutcome::Done(to.as_str().into()));
                }
                Applied::Changed => continue,
                Applied::Conflict(_) => unreachable!("a cancel checks no resource"),
            }
        }
        Err(ApiError::unavailable(
            "the Life kept changing while this DELETE was applied; try again",
        ))
    }
}

/// A Life as a change read it: its shard, its record's text, its Plans' `inflight`
/// entries ('-' = not checked).
#[derive(Clone, Copy)]
struct Read<'a> {
    shard: u32,
    text: &'a str,
    inflight: [&'a str; 2],
}

/// What `life_apply.lua` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Applied {
    Done,
    /// The Life changed since it was read: read it again.
    Changed,
    /// Another Life on the resource is in the way.
    Conflict(String),
}
