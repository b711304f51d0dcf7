//! `kairos migrate` from layout 3 to layout 4: each Life's hash (`life:{uuid}`, its Plans'
//! fields under `b.` and `d.`, its runs as `run:{plan}:{attempt}`) becomes one compact
//! record (`record/`), and the shard's `due`, `lives` and `finished` sorted sets become
//! trees; timers' Plans move to `timers_due`. The host builds each record from the hash
//! (the host owns the record's format); `scripts/fold4.lua` writes it with its index
//! entries and deletes the hash, one Life per call, so that a migration cut off
//! anywhere is finished by running it again. A Plan that a host of the old version still
//! held (one killed before it could hand back) is handed back on the way, a run it had
//! under way recorded as interrupted, as a takeover would.

use std::collections::HashMap;

use futures_util::{StreamExt, TryStreamExt};

use super::lifecycle;
use super::record::{Inflight, LifeRecord, PlanRecord, RunEntry};
use super::{lives_member, Store};
use crate::model::{Action, PlanKind};

/// Lives read per page.
const PAGE: isize = 500;
/// Fold calls in flight at once (pipelined on the one connection).
const IN_FLIGHT: usize = 64;
/// Timers' Plans moved to `timers_due` per call.
const END_BATCH: usize = 1_000;

type Hash = HashMap<String, String>;
type RedisResult<T> = Result<T, redis::RedisError>;

/// A Life of layout 3, as layout 4 keeps it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Folded {
    pub record: LifeRecord,
    /// Plans a host of the old version held (Preset or Running), handed back: due at
    /// these times.
    pub handed_back: Vec<(String, i64)>,
}

fn num<T: std::str::FromStr>(h: &Hash, field: &str) -> Option<T> {
    h.get(field).and_then(|v| v.parse().ok())
}

fn flag(h: &Hash, field: &str) -> bool {
    h.get(field).is_some_and(|v| v == "1")
}

fn action(h: &Hash, field: &str) -> Result<Option<Action>, String> {
    h.get(field)
        .map(|text| serde_json::from_str(text).map_err(|e| format!("`{field}`: {e}")))
        .transpose()
}

/// Builds the record of Life `uuid` from its layout-3 hash `h`, handing back any Plan a
/// host held at `now_ms`.
pub(crate) fn from_layout3(uuid: &str, h: &Hash, now_ms: i64) -> Result<Folded, String> {
    let birth_ms: i64 = num(h, "birth_at_ms").ok_or("no birth_at_ms")?;
    let death_ms: Option<i64> = num(h, "death_at_ms");
    let finished_ms: Option<i64> = num(h, "finished_at_ms");
    let updated_ms: Option<i64> = num(h, "updated_at_ms");
    let mut record = LifeRecord {
        state: h
            .get("state")
            .cloned()
            .unwrap_or_else(|| "Inexistent".into()),
        birth_ms,
        death_ms,
        resource_id: h.get("resource_id").cloned(),
        // A Life written before 0.2 has its creation time as RFC 3339 only.
        created_ms: num(h, "created_at_ms")
            .or_else(|| {
                let text = h.get("created_at")?;
                Some(
                    chrono::DateTime::parse_from_rfc3339(text)
                        .ok()?
                        .timestamp_millis(),
                )
            })
            .unwrap_or(birth_ms),
        // Layout 3 stamped a finished Life's `updated_at_ms` with its finish time too.
        updated_ms: updated_ms.filter(|u| Some(*u) != finished_ms),
        finished_ms,
        version: num(h, "version").unwrap_or(0),
        cancel_requested: flag(h, "cancel_requested"),
        birth_uncertain: flag(h, "birth_uncertain"),
        callback_of: h.get("callback_of").cloned(),
        debounce_key: h.get("debounce_key").cloned(),
        debounced: num(h, "debounced").unwrap_or(0),
        done_by: None,
        birth: PlanRecord::default(),
        death: PlanRecord::default(),
        birth_action: action(h, "b.action")?.ok_or("no b.action")?,
        death_action: action(h, "d.action")?,
        runs: Vec::new(),
    };
    let mut runs: Vec<RunEntry> = h
        .iter()
        .filter(|(k, _)| k.starts_with("run:"))
        .filter_map(|(_, v)| RunEntry::from_view(&serde_json::from_str(v).ok()?))
        .collect();
    runs.sort_by_key(|r| (r.started_at_ms, r.attempt));
    for run in runs {
        record.push_run(run);
    }
    let mut held = Vec::new();
    let kinds: &[(PlanKind, &str)] = if death_ms.is_some() {
        &[(PlanKind::Birth, "b."), (PlanKind::Death, "d.")]
    } else {
        &[(PlanKind::Birth, "b.")]
    };
    for &(kind, p) in kinds {
        let death = kind == PlanKind::Death;
        let field = |name: &str| format!("{p}{name}");
        let state = h
            .get(&field("state"))
            .map(String::as_str)
            .unwrap_or("Standby");
        let own = if death {
            death_ms.unwrap_or(birth_ms)
        } else {
            birth_ms
        };
        let fire: i64 = num(h, &field("fire_at_ms")).unwrap_or(own);
        let plan = record.plan_mut(death);
        plan.state = matches!(state, "Done" | "Failed" | "Invalidated" | "Cancelled")
            .then(|| state.to_string());
        plan.fire_ms = (fire != own).then_some(fire);
        plan.attempts = num(h, &field("attempts")).unwrap_or(0);
        plan.last_status = num(h, &field("last_status"));
        plan.last_error = h.get(&field("last_error")).cloned();
        plan.interrupted = flag(h, &field("interrupted"));
        let plan_id = format!("{uuid}:{}", kind.as_str());
        match state {
            "Preset" => held.push((plan_id, fire)),
            "Running" => {
                let f = Inflight {
                    claim: h.get(&field("claims")).cloned().unwrap_or_default(),
                    fire_ms: fire,
                    host: h.get(&field("lease_owner")).cloned().unwrap_or_default(),
                    running: Some((
                        num(h, &field("started_at_ms")).unwrap_or(now_ms),
                        num(h, &field("attempts")).unwrap_or(1),
                    )),
                };
                record = lifecycle::interrupted(&record, kind, &f, now_ms).0;
                held.push((plan_id, fire));
            }
            _ => {}
        }
    }
    Ok(Folded {
        record,
        handed_back: held,
    })
}

impl Store {
    /// Folds every shard's Lives into records (layout 3 to 4); returns how many Lives,
    /// and how many Plans were handed back.
    pub(crate) async fn fold_records(&self, now_ms: i64) -> RedisResult<(u64, u64)> {
        let (mut lives, mut handed) = (0, 0);
        for shard in 0..self.shard_count() {
            let (l, h) = self.fold_shard(shard, now_ms).await?;
            lives += l;
            handed += h;
        }
        Ok((lives, handed))
    }

    /// Drops the shards' fold markers, once the keyspace says layout 4.
    pub(crate) async fn drop_fold_markers(&self) -> RedisResult<()> {
        for shard in 0..self.shard_count() {
            let _: () = redis::cmd("DEL")
                .arg(self.shard(shard).key_of("fold4"))
                .query_async(&mut self.conn())
                .await?;
        }
        Ok(())
    }

    async fn fold_call(&self, shard: u32, args: &[String]) -> RedisResult<i64> {
        let k = self.shard(shard);
        let mut invocation = self.scripts.fold4.prepare_invoke();
        // The marker names the shard's slot, so that a cluster routes the call there.
        invocation.key(k.key_of("fold4")).arg(&k.prefix);
        for a in args {
            invocation.arg(a);
        }
        invocation.invoke_async(&mut self.conn()).await
    }

    async fn fold_shard(&self, shard: u32, now_ms: i64) -> RedisResult<(u64, u64)> {
        let k = self.shard(shard).clone();
        self.fold_call(shard, &["begin".into()]).await?;
        let lives3 = k.key_of("lives3");
        let (mut lives, mut handed) = (0u64, 0u64);
        // Each Life folded leaves `lives3`, so its head is always what is left.
        for _ in 0..100_000_000 / PAGE {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&lives3)
                .arg(0)
                .arg(PAGE - 1)
                .query_async(&mut self.conn())
                .await?;
            if members.is_empty() {
                break;
            }
            let done: Vec<(u64, u64)> = futures_util::stream::iter(&members)
                .map(|member| self.fold_life(shard, member, now_ms))
                .buffer_unordered(IN_FLIGHT)
                .try_collect()
                .await?;
            for (l, h) in done {
                lives += l;
                handed += h;
            }
        }
        if !self.target.is_cluster() {
            // Lives no index named (left by a bug, or half-deleted by hand).
            for key in self.scan_keys(&k.key_of("life:*")).await? {
                let uuid = &key[k.key_of("life:").len()..];
                let birth: Option<i64> = redis::cmd("HGET")
                    .arg(&key)
                    .arg("birth_at_ms")
                    .query_async(&mut self.conn())
                    .await?;
                let member = lives_member(birth.unwrap_or(0), uuid);
                let (l, h) = self.fold_life(shard, &member, now_ms).await?;
                lives += l;
                handed += h;
            }
        }
        for _ in 0..100_000_000 / END_BATCH {
            if self
                .fold_call(shard, &["end".into(), END_BATCH.to_string()])
                .await?
                == 1
            {
                return Ok((lives, handed));
            }
        }
        Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "the shard's due set did not empty",
            k.prefix.clone(),
        )))
    }

    /// Folds the Life of `lives3` member `member`; returns (1, Plans handed back), or
    /// (0, 0) when its hash is gone or unreadable (its entries are dropped; an unreadable
    /// one is logged and kept under `life:` for a person to look at).
    async fn fold_life(&self, shard: u32, member: &str, now_ms: i64) -> RedisResult<(u64, u64)> {
        let k = self.shard(shard);
        let uuid = member.split_once(':').map_or(member, |(_, u)| u);
        let key = k.key_of(&format!("life:{uuid}"));
        let h: Hash = redis::cmd("HGETALL")
            .arg(&key)
            .query_async(&mut self.conn())
            .await?;
        let folded = if h.is_empty() {
            None
        } else {
            match from_layout3(uuid, &h, now_ms) {
                Ok(folded) => Some(folded),
                Err(e) => {
                    tracing::error!(life = %uuid, error = %e, "a Life's hash cannot be read; it stays as {key} and is left out of layout 4");
                    let _: () = redis::cmd("RENAME")
                        .arg(&key)
                        .arg(k.key_of(&format!("unreadable:{uuid}")))
                        .query_async(&mut self.conn())
                        .await?;
                    None
                }
            }
        };
        let mut args = vec!["life".to_string(), uuid.to_string()];
        match &folded {
            Some(f) => args.extend([
                f.record.to_json(),
                f.record.birth_ms.to_string(),
                match (f.record.finished_ms, super::outcome::Outcome::of(&f.record)) {
                    (Some(ms), Some((o, _))) if o.is_failure() => format!("{ms}|F"),
                    (Some(ms), _) => ms.to_string(),
                    (None, _) => String::new(),
                },
            ]),
            None => args.extend([String::new(), "0".into(), String::new()]),
        }
        args.push(member.to_string());
        for (plan, ms) in folded.iter().flat_map(|f| &f.handed_back) {
            args.extend([plan.clone(), ms.to_string()]);
        }
        self.fold_call(shard, &args).await?;
        Ok(folded.map_or((0, 0), |f| (1, f.handed_back.len() as u64)))
    }

    /// Keys matching `pattern` on a standalone Redis (SCAN).
    async fn scan_keys(&self, pattern: &str) -> RedisResult<Vec<String>> {
        let mut out = std::collections::BTreeSet::new();
        let mut cursor: u64 = 0;
        for _ in 0..10_000_000 {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn())
                .await?;
            out.extend(keys);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(out.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(pairs: &[(&str, &str)]) -> Hash {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const HOOK: &str = r#"{"path":"/hook","method":"POST"}"#;

    #[test]
    fn a_pending_point_folds_to_its_smallest_record() {
        let h = hash(&[
            ("schedule_type", "point"),
            ("state", "Inexistent"),
            ("birth_at_ms", "1923577500000"),
            ("created_at_ms", "1764300000000"),
            ("b.state", "Standby"),
            ("b.fire_at_ms", "1923577500000"),
            ("b.action", HOOK),
        ]);
        let f = from_layout3("u", &h, 0).unwrap();
        assert!(f.handed_back.is_empty());
        let back = f.record.hashes([None, None]);
        assert_eq!(back.0["state"], "Inexistent");
        assert_eq!(back.1["state"], "Standby");
        assert_eq!(back.1["fire_at_ms"], "1923577500000");
        assert!(f
            .record
            .to_json()
            .starts_with(r#"{"b":1923577500000,"c":1764300000000,"a":"#));
    }

    #[test]
    fn a_term_mid_way_keeps_its_runs_and_its_death_time() {
        let run = r#"{"plan":"birth","attempt":1,"should_run_at":1000,"started_at":1001,"duration_ms":5,"host":"h","outcome":"success","status":200}"#;
        let h = hash(&[
            ("schedule_type", "term"),
            ("state", "Alive"),
            ("birth_at_ms", "1000"),
            ("death_at_ms", "9000"),
            ("created_at_ms", "500"),
            ("updated_at_ms", "1006"),
            ("resource_id", "room-1"),
            ("b.state", "Done"),
            ("b.fire_at_ms", "1000"),
            ("b.attempts", "1"),
            ("b.last_status", "200"),
            ("b.action", HOOK),
            ("d.state", "Standby"),
            ("d.fire_at_ms", "9000"),
            ("d.action", HOOK),
            ("run:birth:1", run),
        ]);
        let f = from_layout3("u", &h, 0).unwrap();
        let r = &f.record;
        assert_eq!(r.birth.state.as_deref(), Some("Done"));
        assert_eq!(r.death.state, None);
        assert_eq!(r.fire_ms(true), 9000);
        assert_eq!(r.updated_ms, Some(1006));
        assert_eq!(r.runs.len(), 1);
        assert_eq!(r.runs[0].status, Some(200));
        let (life, birth, death) = r.hashes([None, None]);
        assert_eq!(life["run:birth:1"], r.runs[0].view().to_string());
        assert_eq!(life["resource_id"], "room-1");
        assert_eq!(birth["attempts"], "1");
        assert_eq!(death["state"], "Standby");
    }

    #[test]
    fn plans_a_stopped_host_held_are_handed_back() {
        let h = hash(&[
            ("schedule_type", "term"),
            ("state", "Alive"),
            ("birth_at_ms", "1000"),
            ("death_at_ms", "9000"),
            ("created_at_ms", "500"),
            ("b.state", "Done"),
            ("b.action", HOOK),
            ("d.state", "Running"),
            ("d.fire_at_ms", "9000"),
            ("d.attempts", "2"),
            ("d.lease_owner", "old-host"),
            ("d.claims", "41"),
            ("d.started_at_ms", "9010"),
            ("d.action", HOOK),
        ]);
        let f = from_layout3("u", &h, 9_500).unwrap();
        assert_eq!(f.handed_back, vec![("u:death".to_string(), 9000)]);
        let d = &f.record.death;
        assert!(d.interrupted);
        assert_eq!(d.attempts, 2);
        let run = f.record.runs.last().unwrap();
        assert_eq!(
            (run.outcome.as_str(), run.host.as_str()),
            ("interrupted", "old-host")
        );
        assert_eq!(run.duration_ms, 490);
        // A finished Life's update time is its finish time: not kept twice.
        let done = hash(&[
            ("state", "Dead"),
            ("birth_at_ms", "1000"),
            ("finished_at_ms", "1200"),
            ("updated_at_ms", "1200"),
            ("b.state", "Done"),
            ("b.action", HOOK),
        ]);
        let f = from_layout3("v", &done, 0).unwrap();
        assert_eq!(
            (f.record.updated_ms, f.record.finished_ms),
            (None, Some(1200))
        );
        assert!(from_layout3("w", &hash(&[("birth_at_ms", "1")]), 0).is_err());
        // Before 0.2 a Life's creation time was RFC 3339 only.
        let old = hash(&[
            ("birth_at_ms", "1000"),
            ("created_at", "2026-11-23T18:48:16.913Z"),
            ("b.action", HOOK),
        ]);
        let f = from_layout3("x", &old, 0).unwrap();
        assert_eq!(f.record.created_ms, 1_795_459_696_913);
    }
}
