//! What the API shows of Lives (layout 4): the detail view and the summary a listing
//! shows (`life_list.rs`), rendered from each Life's record as layout 3's hash was
//! (`LifeRecord::hashes`), so both layouts read alike.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::outcome::Outcome;
use super::record::LifeRecord;
use super::{rfc3339, Store};
use crate::error::ApiError;
use crate::model::{NewLife, PlanKind};

type Hash = HashMap<String, String>;

impl Store {
    /// The Life as the API shows it: fields, Plans and recent history (newest first).
    pub async fn life_view(
        &self,
        uuid: &str,
        history_count: usize,
    ) -> Result<Option<Value>, ApiError> {
        let Some(loaded) = self.load(uuid).await? else {
            return Ok(None);
        };
        let mut view = life_summary(uuid, &loaded.record, self.timezone);
        let (life, birth, death) = loaded.record.hashes(loaded.inflight_refs());
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

    /// The Lives' records (None: gone), in the order asked: one script call per shard (`scripts/records_get.lua`),
    /// all shards at once, or one call in all on a standalone Redis.
    pub(crate) async fn summaries_by_shard(
        &self,
        lives: Vec<(u32, String)>,
    ) -> Result<Vec<Option<LifeRecord>>, ApiError> {
        let mut by_shard: HashMap<u32, Vec<(usize, String)>> = HashMap::new();
        for (i, (shard, uuid)) in lives.into_iter().enumerate() {
            by_shard.entry(shard).or_default().push((i, uuid));
        }
        let total = by_shard.values().map(Vec::len).sum();
        if !self.target.is_cluster() && by_shard.len() > 1 {
            return self.summaries_at_once(by_shard, total).await;
        }
        let reads = by_shard.into_iter().map(|(shard, items)| {
            let mut conn = self.conn();
            let k = self.shard(shard);
            let script = &self.scripts.records_get;
            async move {
                let mut invocation = script.prepare_invoke();
                invocation.key(k.inflight()).arg(&k.prefix);
                for (_, uuid) in &items {
                    invocation.arg(uuid);
                }
                let found: Vec<String> = invocation.invoke_async(&mut conn).await?;
                Ok::<_, redis::RedisError>(items.into_iter().map(|(i, _)| i).zip(found))
            }
        });
        let found = futures_util::future::try_join_all(reads).await?;
        Ok(summaries(total, found.into_iter().flatten()))
    }

    /// `summaries_by_shard` on a standalone Redis, which holds every shard: one call
    /// (`records_get_all`) for them all.
    async fn summaries_at_once(
        &self,
        by_shard: HashMap<u32, Vec<(usize, String)>>,
        total: usize,
    ) -> Result<Vec<Option<LifeRecord>>, ApiError> {
        let mut invocation = self.scripts.records_get_all.prepare_invoke();
        // No one shard's prefix: each shard's comes with its ids (`enter_shard`).
        invocation.arg("");
        let mut order = Vec::with_capacity(total);
        for (shard, items) in &by_shard {
            let k = self.shard(*shard);
            invocation.arg(&k.prefix).arg(items.len());
            for (i, uuid) in items {
                invocation.arg(uuid);
                order.push(*i);
            }
        }
        let found: Vec<String> = invocation.invoke_async(&mut self.conn()).await?;
        Ok(summaries(total, order.into_iter().zip(found)))
    }
}

/// The Lives read for a page, each at its place: `found` gives each place its record
/// ('' for none).
fn summaries(
    total: usize,
    found: impl Iterator<Item = (usize, String)>,
) -> Vec<Option<LifeRecord>> {
    let mut out = vec![None; total];
    for (i, text) in found {
        if text.is_empty() {
            continue;
        }
        out[i] = LifeRecord::from_json(&text).ok();
    }
    out
}

/// The fields of a Life common to the list and the detail view, straight from its
/// record; times are kept in ms and rendered here in `tz`.
pub(super) fn life_summary(uuid: &str, rec: &LifeRecord, tz: chrono_tz::Tz) -> Map<String, Value> {
    let mut out = Map::new();
    let text = |v: Option<&str>| v.map_or(Value::Null, |s| Value::String(s.to_string()));
    let num = |ms: Option<i64>| ms.map_or(Value::Null, Value::from);
    let time = |ms: Option<i64>| ms.map_or(Value::Null, |ms| Value::String(rfc3339(ms, tz)));
    out.insert("life_uuid".into(), Value::String(uuid.to_string()));
    let schedule_type = if rec.is_term() { "term" } else { "point" };
    out.insert("schedule_type".into(), Value::String(schedule_type.into()));
    out.insert("state".into(), Value::String(rec.state.clone()));
    out.insert("resource_id".into(), text(rec.resource_id.as_deref()));
    out.insert("birth_time".into(), time(Some(rec.birth_ms)));
    out.insert("birth_time_ms".into(), num(Some(rec.birth_ms)));
    out.insert("death_time".into(), time(rec.death_ms));
    out.insert("death_time_ms".into(), num(rec.death_ms));
    out.insert("created_at".into(), time(Some(rec.created_ms)));
    out.insert(
        "updated_at_ms".into(),
        num(rec.updated_ms.or(rec.finished_ms)),
    );
    if rec.finished_ms.is_some() {
        out.insert("finished_at".into(), time(rec.finished_ms));
        out.insert("finished_at_ms".into(), num(rec.finished_ms));
    }
    // What a finished Life came to (store::outcome); null while it is unfinished.
    let outcome = Outcome::of(rec);
    out.insert(
        "outcome".into(),
        text(outcome.as_ref().map(|(o, _)| o.as_str())),
    );
    if let Some((_, Some(reason))) = outcome {
        out.insert("outcome_reason".into(), Value::String(reason));
    }
    if rec.cancel_requested {
        out.insert("cancel_requested".into(), Value::Bool(true));
    }
    if let Some(of) = &rec.callback_of {
        // The Plan whose outcome this Life reports (see model::Callbacks).
        out.insert("callback_of".into(), Value::String(of.clone()));
    }
    if let Some(key) = &rec.debounce_key {
        // Bookings of its debounce key merged into it, besides the one that opened it.
        out.insert(
            "debounce".into(),
            json!({"key": key, "bookings": 1 + rec.debounced}),
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
