//! What the API shows of Lives (layout 4): the detail view and the listing, rendered from
//! each Life's record as layout 3's hash was (`LifeRecord::hashes`), so both layouts read
//! alike.
//!
//! Listing goes by birth time across every shard: each shard's `lives` tree gives its
//! Lives in (birth, id) order (`scripts/lives_page.lua`), and the pages of all shards are
//! merged, each member `{birth_ms:013}:{uuid}` an exact cursor in the one order of them
//! all.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::lives::ListFilter;
use super::record::{Inflight, LifeRecord};
use super::{lives_member, rfc3339, Store};
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
        let (life, birth, death) = loaded.record.hashes(loaded.inflight_refs());
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
    /// The cursor is the last member returned (`{birth_ms:013}:{uuid}`), an exact
    /// position in the one order of every shard's Lives together: each pass reads a few
    /// Lives past it from every shard and merges them, keeping only those below the
    /// first shard's horizon (the last of a shard that had more), so that nothing is ever
    /// skipped or repeated.
    pub async fn list(
        &self,
        filter: &ListFilter,
    ) -> Result<(Vec<Value>, Option<String>), ApiError> {
        let mut from: (i64, String) = match (&filter.cursor, filter.from_ms) {
            (Some(cursor), _) => parse_member(cursor).ok_or_else(|| {
                ApiError::bad_request("invalid_cursor", "the cursor is not one this listing gave")
            })?,
            (None, Some(from)) => (from.max(0), String::new()),
            (None, None) => (0, String::new()),
        };
        let to = filter.to_ms;
        // With a resource filter the candidates come from that resource's index, in its
        // one shard, which is small.
        let resource: Option<(u32, Vec<(i64, String)>)> = match &filter.resource_id {
            Some(rid) => {
                let shard = self.placement.resource(rid);
                let items: Vec<(String, i64)> = redis::cmd("ZRANGE")
                    .arg(self.shard(shard).resource(rid))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(&mut self.conn())
                    .await?;
                let mut members: Vec<(i64, String)> =
                    items.into_iter().map(|(id, ms)| (ms, id)).collect();
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
        // Lives read per shard and pass: the page spread over the shards, with room.
        let per_shard = (2 * want / shards.len() + 4).min(1000);
        let max_scanned = want * 20;
        let mut scanned = 0usize;
        let mut page = Vec::new();
        let mut last: Option<(i64, String)> = None;
        let mut exhausted = false;

        while page.len() < filter.limit && scanned < max_scanned {
            let (mut members, mut complete) = match &resource {
                Some((shard, all)) => {
                    let batch: Vec<(u32, i64, String)> = all
                        .iter()
                        .filter(|m| **m > from && to.is_none_or(|t| m.0 <= t))
                        .take(per_shard.max(want))
                        .map(|(ms, id)| (*shard, *ms, id.clone()))
                        .collect();
                    let complete = batch.len() < per_shard.max(want);
                    (batch, complete)
                }
                None => self.merge_lives(&shards, &from, to, per_shard).await?,
            };
            if members.is_empty() {
                exhausted = true;
                break;
            }
            // Without a state filter every Life read fills the page: read only as many as
            // it still lacks (a pass may merge a few hundred ids), and go on from there.
            let lacking = filter.limit - page.len();
            if filter.state.is_none() && members.len() > lacking {
                members.truncate(lacking);
                complete = false;
            }
            let lives = self
                .summaries_by_shard(
                    members
                        .iter()
                        .map(|(shard, _, uuid)| (*shard, uuid.clone()))
                        .collect(),
                )
                .await?;
            let mut full = false;
            for ((_, birth_ms, uuid), life) in members.into_iter().zip(lives) {
                scanned += 1;
                from = (birth_ms, uuid.clone());
                last = Some((birth_ms, uuid.clone()));
                let Some(life) = life else { continue };
                if let Some(state) = &filter.state {
                    if life.get("state") != Some(state) {
                        continue;
                    }
                }
                page.push(Value::Object(life_summary(&uuid, &life, self.timezone)));
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
        let next_cursor = if exhausted {
            None
        } else {
            last.map(|(ms, uuid)| lives_member(ms, &uuid))
        };
        Ok((page, next_cursor))
    }

    /// The next Lives after `from` (exclusive; an empty id: everything at its time) up
    /// to `to` from every shard's `lives` tree, merged in (birth, id) order, and whether
    /// that was all.
    async fn merge_lives(
        &self,
        shards: &[u32],
        from: &(i64, String),
        to: Option<i64>,
        per_shard: usize,
    ) -> Result<(Vec<(u32, i64, String)>, bool), ApiError> {
        let reads = shards.iter().map(|&shard| {
            let mut conn = self.conn();
            let k = self.shard(shard);
            let script = &self.scripts.lives_page;
            async move {
                let items: Vec<(String, i64)> = script
                    .key(k.lives())
                    .arg(&k.prefix)
                    .arg(from.0)
                    .arg(&from.1)
                    .arg(to.map_or_else(|| "+inf".to_string(), |t| t.to_string()))
                    .arg(per_shard)
                    .invoke_async(&mut conn)
                    .await?;
                let members: Vec<(i64, String)> =
                    items.into_iter().map(|(id, ms)| (ms, id)).collect();
                Ok::<_, redis::RedisError>((shard, members))
            }
        });
        let results = futures_util::future::try_join_all(reads).await?;
        // A shard that returned a full batch may have more after its last member: only
        // what sorts before the smallest such last member is known to be complete.
        let horizon: Option<(i64, String)> = results
            .iter()
            .filter(|(_, m)| m.len() == per_shard)
            .filter_map(|(_, m)| m.last().cloned())
            .min();
        let mut merged: Vec<(u32, i64, String)> = results
            .into_iter()
            .flat_map(|(shard, members)| members.into_iter().map(move |(ms, id)| (shard, ms, id)))
            .filter(|(_, ms, id)| horizon.as_ref().is_none_or(|h| (*ms, id.clone()) <= *h))
            .collect();
        merged.sort_by(|a, b| (a.1, &a.2).cmp(&(b.1, &b.2)));
        Ok((merged, horizon.is_none()))
    }

    /// The Lives' fields as layout 3's hash held them (None: gone), one script call per
    /// shard (`scripts/records_get.lua`), all shards at once; in the order asked.
    pub(crate) async fn summaries_by_shard(
        &self,
        lives: Vec<(u32, String)>,
    ) -> Result<Vec<Option<Hash>>, ApiError> {
        let mut by_shard: HashMap<u32, Vec<(usize, String)>> = HashMap::new();
        for (i, (shard, uuid)) in lives.into_iter().enumerate() {
            by_shard.entry(shard).or_default().push((i, uuid));
        }
        let total = by_shard.values().map(Vec::len).sum();
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
                let found: Vec<(String, String, String)> =
                    invocation.invoke_async(&mut conn).await?;
                Ok::<_, redis::RedisError>(items.into_iter().map(|(i, _)| i).zip(found))
            }
        });
        let mut out = vec![None; total];
        for part in futures_util::future::try_join_all(reads).await? {
            for (i, (text, birth, death)) in part {
                if text.is_empty() {
                    continue;
                }
                let Ok(record) = LifeRecord::from_json(&text) else {
                    continue;
                };
                let (birth, death) = (Inflight::parse(&birth), Inflight::parse(&death));
                out[i] = Some(record.hashes([birth.as_ref(), death.as_ref()]).0);
            }
        }
        Ok(out)
    }
}

/// A listing cursor (`{birth_ms:013}:{uuid}`) read back.
fn parse_member(member: &str) -> Option<(i64, String)> {
    let (ms, uuid) = member.split_once(':')?;
    Some((ms.parse().ok()?, uuid.to_string()))
}

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
    fn cursors_read_back_as_a_time_and_an_id() {
        assert_eq!(
            parse_member(&lives_member(1_765_811_100_000, "aa")),
            Some((1_765_811_100_000, "aa".to_string()))
        );
        assert_eq!(parse_member("0000000000999:zz"), Some((999, "zz".into())));
        assert_eq!(parse_member("nonsense"), None);
    }
}
