//! Listing Lives (layout 4): `GET /schedules` by birth time, either way, and
//! `GET /failures`, the Lives that failed, most recent first.
//!
//! Listing goes by birth time across every shard: each shard's `lives` tree gives its
//! Lives in (birth, id) order, or the reverse, and the shards' trees are merged, each
//! member `{birth_ms:013}:{uuid}` an exact cursor in the one order of them all. On a
//! standalone Redis one call merges them inside Redis and reads the records of only the
//! Lives taken (`scripts/lives_merge.lua`); on a Redis Cluster each shard is read on its
//! own (`scripts/lives_page.lua`) and the host merges.
//!
//! A filter on state or outcome is checked on each Life read. The shards' census says
//! how many Lives each state has, so a filter that nothing can match ends at once, and a
//! page otherwise reads on until it is full or the Lives end, within [`PAGE_BUDGET`]:
//! only a rare match among very many Lives answers a short page with a cursor.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::life_views::life_summary;
use super::outcome::Outcome;
use super::record::LifeRecord;
use super::{lives_member, Store};
use crate::error::ApiError;

/// Sorted-set members with their scores, as Redis answers them.
type Scored = Vec<(String, i64)>;

/// A pass of the listing: the Lives it read (shard, birth ms, id), in the listing's
/// order, their records (None: gone since), and whether the range holds no more.
type Merged = (Vec<(u32, i64, String)>, Vec<Option<LifeRecord>>, bool);

/// How long one page may read Lives that a filter refuses before it answers what it has.
pub const PAGE_BUDGET: Duration = Duration::from_millis(300);

/// Filters of `GET /schedules`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub state: Option<String>,
    pub outcome: Option<Outcome>,
    pub resource_id: Option<String>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    pub limit: usize,
    pub cursor: Option<String>,
    /// Newest birth first.
    pub descending: bool,
}

/// A page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub items: Vec<Value>,
    pub next_cursor: Option<String>,
    /// How many the filters match in all, where that is known without reading them (on
    /// the first page).
    pub total: Option<u64>,
}

impl ListFilter {
    /// The one state a Life must be in to match, from `state` and `outcome`; Err when
    /// they name different ones (nothing matches).
    fn needed_state(&self) -> Result<Option<&str>, ()> {
        match (self.state.as_deref(), self.outcome.map(Outcome::state)) {
            (Some(a), Some(b)) if a != b => Err(()),
            (Some(a), _) => Ok(Some(a)),
            (None, b) => Ok(b),
        }
    }

    fn matches(&self, life: &LifeRecord) -> bool {
        self.state.as_deref().is_none_or(|s| life.state == s)
            && self
                .outcome
                .is_none_or(|o| Outcome::of(life).is_some_and(|(of, _)| of == o))
    }
}

/// A position in the listing's order: (birth ms, id); an empty id stands for every Life
/// at that time (before them all going up, after them all going down).
type Position = (i64, String);

/// A listing cursor (`{birth_ms:013}:{uuid}`) read back.
pub(super) fn parse_member(member: &str) -> Option<Position> {
    let (ms, uuid) = member.split_once(':')?;
    Some((ms.parse().ok()?, uuid.to_string()))
}

impl Store {
    /// The census of the given shards summed: Lives per state.
    async fn census_sum(&self, shards: &[u32]) -> Result<HashMap<String, u64>, ApiError> {
        let reads = shards.iter().map(|&shard| self.census_of(shard));
        let mut sum: HashMap<String, u64> = HashMap::new();
        for census in futures_util::future::try_join_all(reads).await? {
            for (state, n) in census {
                if state != "v" {
                    *sum.entry(state).or_default() += n.max(0) as u64;
                }
            }
        }
        Ok(sum)
    }

    /// Lists Lives by birth time with filters.
    ///
    /// The cursor is the last member returned (`{birth_ms:013}:{uuid}`), an exact
    /// position in the one order of every shard's Lives together: each pass reads a few
    /// Lives past it from every shard and merges them, keeping only those up to the
    /// first shard's horizon (the last of a shard that had more), so that nothing is ever
    /// skipped or repeated.
    pub async fn list(&self, filter: &ListFilter) -> Result<Page, ApiError> {
        let desc = filter.descending;
        let mut pos: Position = match &filter.cursor {
            Some(cursor) => parse_member(cursor).ok_or_else(|| {
                ApiError::bad_request("invalid_cursor", "the cursor is not one this listing gave")
            })?,
            None if desc => (filter.to_ms.unwrap_or(i64::MAX), String::new()),
            None => (filter.from_ms.unwrap_or(0).max(0), String::new()),
        };
        // With a resource filter the candidates come from that resource's index, in its
        // one shard, which is small.
        let resource: Option<(u32, Vec<Position>)> = match &filter.resource_id {
            Some(rid) => {
                let shard = self.placement.resource(rid);
                let items: Vec<(String, i64)> = redis::cmd("ZRANGE")
                    .arg(self.shard(shard).resource(rid))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(&mut self.conn())
                    .await?;
                let mut members: Vec<Position> =
                    items.into_iter().map(|(id, ms)| (ms, id)).collect();
                members.sort();
                if desc {
                    members.reverse();
                }
                Some((shard, members))
            }
            None => None,
        };
        let shards: Vec<u32> = match &resource {
            Some((shard, _)) => vec![*shard],
            None => (0..self.shard_count()).collect(),
        };
        let filtered = filter.state.is_some() || filter.outcome.is_some();
        // The census is read for the first page's total and for a filter; a next page
        // of the plain listing reads only the Lives.
        let first_page = filter.cursor.is_none();
        let census = if first_page || filtered {
            self.census_sum(&shards).await?
        } else {
            HashMap::new()
        };
        let count = |state: &str| census.get(state).copied().unwrap_or(0);
        let in_range = first_page && filter.from_ms.is_none() && filter.to_ms.is_none();
        let total = match (&resource, filter.state.as_deref(), filter.outcome) {
            (None, None, None) if in_range => Some(census.values().sum()),
            (None, Some(state), None) if in_range => Some(count(state)),
            (Some((_, all)), None, None) if in_range => Some(all.len() as u64),
            _ => None,
        };
        let hopeless = match filter.needed_state() {
            Err(()) => true,
            Ok(Some(state)) => count(state) == 0,
            Ok(None) => false,
        };
        if hopeless {
            return Ok(Page {
                items: Vec::new(),
                next_cursor: None,
                total: Some(0),
            });
        }
        let want = filter.limit.max(1);
        // Lives read per shard and pass: the page spread over the shards, with room.
        let per_shard = (2 * want / shards.len() + 4).min(1000);
        let started = Instant::now();
        let mut page = Vec::new();
        let mut last: Option<Position> = None;
        let mut exhausted = false;
        // Bounded by the budget; the count only guards against a clock that stands still.
        for _ in 0..100_000 {
            if page.len() >= filter.limit || started.elapsed() > PAGE_BUDGET {
                break;
            }
            let lacking = filter.limit - page.len();
            let (members, lives, complete) = match &resource {
                Some((shard, all)) => {
                    let past = |m: &Position| {
                        if desc {
                            (if pos.1.is_empty() {
                                m.0 <= pos.0
                            } else {
                                *m < pos
                            }) && filter.from_ms.is_none_or(|f| m.0 >= f)
                        } else {
                            *m > pos && filter.to_ms.is_none_or(|t| m.0 <= t)
                        }
                    };
                    let take = per_shard.max(want);
                    let batch: Vec<(u32, i64, String)> = all
                        .iter()
                        .filter(|m| past(m))
                        .take(take)
                        .map(|(ms, id)| (*shard, *ms, id.clone()))
                        .collect();
                    let complete = batch.len() < take;
                    self.with_records(batch, complete, filtered, lacking)
                        .await?
                }
                None if !self.target.is_cluster() => {
                    // Without a filter every Life read fills the page: take only as many
                    // as it still lacks.
                    let take = if filtered {
                        (per_shard * shards.len()).min(1000)
                    } else {
                        lacking
                    };
                    self.merge_in_redis(&shards, &pos, filter, take).await?
                }
                None => {
                    let (members, complete) =
                        self.merge_lives(&shards, &pos, filter, per_shard).await?;
                    self.with_records(members, complete, filtered, lacking)
                        .await?
                }
            };
            if members.is_empty() {
                exhausted = true;
                break;
            }
            let mut full = false;
            for ((_, birth_ms, uuid), life) in members.into_iter().zip(lives) {
                pos = (birth_ms, uuid.clone());
                last = Some(pos.clone());
                let Some(life) = life else { continue };
                if !filter.matches(&life) {
                    continue;
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
        Ok(Page {
            items: page,
            next_cursor,
            total,
        })
    }

    /// `members` with their records, read by shard. Without a filter every Life read
    /// fills the page: only as many as it still lacks are read (a pass may merge a few
    /// hundred ids), and the listing goes on from there.
    async fn with_records(
        &self,
        mut members: Vec<(u32, i64, String)>,
        mut complete: bool,
        filtered: bool,
        lacking: usize,
    ) -> Result<Merged, ApiError> {
        if !filtered && members.len() > lacking {
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
        Ok((members, lives, complete))
    }

    /// Up to `take` Lives past `pos` in the listing's order, with their records, from
    /// every shard of a standalone Redis in one call (`scripts/lives_merge.lua`: the
    /// shards' trees are merged inside Redis, and only the records taken are read), and
    /// whether the range holds no more.
    async fn merge_in_redis(
        &self,
        shards: &[u32],
        pos: &Position,
        filter: &ListFilter,
        take: usize,
    ) -> Result<Merged, ApiError> {
        let (from, to) = range_args(pos, filter);
        let mut invocation = self.scripts.lives_merge.prepare_invoke();
        for &shard in shards {
            invocation.key(self.shard(shard).lives());
        }
        let reply: Vec<String> = invocation
            .arg(&self.shard(shards[0]).prefix)
            .arg(from)
            .arg(&pos.1)
            .arg(to)
            .arg(take)
            .arg(if filter.descending { "desc" } else { "asc" })
            .invoke_async(&mut self.conn())
            .await?;
        let complete = reply.first().is_some_and(|c| c == "1");
        let mut members = Vec::with_capacity(reply.len() / 4);
        let mut lives = Vec::with_capacity(reply.len() / 4);
        for item in reply.get(1..).unwrap_or_default().chunks_exact(4) {
            let (Ok(ms), Some(&shard)) = (
                item[1].parse::<i64>(),
                item[2]
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| shards.get(i - 1)),
            ) else {
                return Err(ApiError::unavailable(
                    "lives_merge answered an item it should not",
                ));
            };
            members.push((shard, ms, item[0].clone()));
            lives.push(if item[3].is_empty() {
                None
            } else {
                LifeRecord::from_json(&item[3]).ok()
            });
        }
        Ok((members, lives, complete))
    }

    /// The next Lives past `pos` in the listing's order (exclusive; an empty id: every
    /// Life at its time) within the filter's times, from every shard's `lives` tree of a
    /// Redis Cluster, merged on the host, and whether that was all.
    async fn merge_lives(
        &self,
        shards: &[u32],
        pos: &Position,
        filter: &ListFilter,
        per_shard: usize,
    ) -> Result<(Vec<(u32, i64, String)>, bool), ApiError> {
        let desc = filter.descending;
        let (from, to) = range_args(pos, filter);
        let order = if desc { "desc" } else { "asc" };
        let members = |items: Vec<(String, i64)>| -> Vec<Position> {
            items.into_iter().map(|(id, ms)| (ms, id)).collect()
        };
        // Each shard in its own slot: a call per shard, all at once.
        let reads = shards.iter().map(|&shard| {
            let mut conn = self.conn();
            let k = self.shard(shard);
            let script = &self.scripts.lives_page;
            let to = &to;
            async move {
                let items: Vec<(String, i64)> = script
                    .key(k.lives())
                    .arg(&k.prefix)
                    .arg(from)
                    .arg(&pos.1)
                    .arg(to)
                    .arg(per_shard)
                    .arg(order)
                    .invoke_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>((shard, members(items)))
            }
        });
        let results: Vec<(u32, Vec<Position>)> = futures_util::future::try_join_all(reads).await?;
        // A shard that returned a full batch may have more past its last member: only
        // what comes before the nearest such last member is known to be complete.
        let lasts = results
            .iter()
            .filter(|(_, m)| m.len() == per_shard)
            .filter_map(|(_, m)| m.last().cloned());
        let horizon: Option<Position> = if desc { lasts.max() } else { lasts.min() };
        let mut merged: Vec<(u32, i64, String)> = results
            .into_iter()
            .flat_map(|(shard, members)| members.into_iter().map(move |(ms, id)| (shard, ms, id)))
            .filter(|(_, ms, id)| {
                horizon.as_ref().is_none_or(|h| {
                    let m = (*ms, id.clone());
                    if desc {
                        m >= *h
                    } else {
                        m <= *h
                    }
                })
            })
            .collect();
        merged.sort_by(|a, b| (a.1, &a.2).cmp(&(b.1, &b.2)));
        if desc {
            merged.reverse();
        }
        Ok((merged, horizon.is_none()))
    }

    /// The Lives that failed (`birth_failed`, `death_failed`, `invalidated`), most
    /// recently finished first, from every shard's `failed` index; `cursor` is the last
    /// one of the page before (`{finish_ms:013}:{uuid}`). With the count of them all.
    pub async fn failures(
        &self,
        outcome: Option<Outcome>,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<Page, ApiError> {
        let pos: Position = match cursor {
            Some(c) => parse_member(c).ok_or_else(|| {
                ApiError::bad_request("invalid_cursor", "the cursor is not one this listing gave")
            })?,
            None => (i64::MAX, String::new()),
        };
        let shards: Vec<u32> = (0..self.shard_count()).collect();
        let want = limit.max(1);
        let started = Instant::now();
        let mut pos = pos;
        let mut page = Vec::new();
        let mut exhausted = false;
        let mut total = 0u64;
        for pass in 0..10_000 {
            if page.len() >= want || started.elapsed() > PAGE_BUDGET {
                break;
            }
            // Every shard's next failures past the cursor: those at the cursor's own time
            // with a smaller id (a batch of runs finishes at one time), then a page's
            // worth below that time.
            let reads = shards.iter().map(|&shard| {
                let mut conn = self.conn();
                let key = self.shard(shard).failed();
                let pos = pos.clone();
                async move {
                    let mut pipe = redis::pipe();
                    let below = if pos.0 == i64::MAX {
                        "+inf".to_string()
                    } else if pos.1.is_empty() {
                        pos.0.to_string()
                    } else {
                        format!("({}", pos.0)
                    };
                    pipe.cmd("ZREVRANGEBYSCORE")
                        .arg(&key)
                        .arg(pos.0.to_string())
                        .arg(pos.0.to_string())
                        .arg("WITHSCORES");
                    pipe.cmd("ZREVRANGEBYSCORE")
                        .arg(&key)
                        .arg(below)
                        .arg("-inf")
                        .arg("WITHSCORES")
                        .arg("LIMIT")
                        .arg(0)
                        .arg(want);
                    // The total only on the first pass, which answers it.
                    let (ties, items, n): (Scored, Scored, u64) = if pass == 0 {
                        pipe.cmd("ZCARD").arg(&key);
                        pipe.query_async(&mut conn).await?
                    } else {
                        let (ties, items): (Scored, Scored) = pipe.query_async(&mut conn).await?;
                        (ties, items, 0)
                    };
                    let ties = ties
                        .into_iter()
                        .filter(|(id, _)| !pos.1.is_empty() && *id < pos.1);
                    let full = items.len() == want;
                    let members: Vec<Position> =
                        ties.chain(items).map(|(id, ms)| (ms, id)).collect();
                    Ok::<_, redis::RedisError>((shard, members, full, n))
                }
            });
            let results = futures_util::future::try_join_all(reads).await?;
            if pass == 0 {
                total = results.iter().map(|r| r.3).sum();
            }
            // A shard that gave a full page may have more below its last: only what comes
            // before the highest such last one is known to be complete.
            let horizon: Option<Position> = results
                .iter()
                .filter(|r| r.2)
                .filter_map(|r| r.1.last().cloned())
                .max();
            let mut merged: Vec<(u32, i64, String)> = results
                .into_iter()
                .flat_map(|(shard, members, _, _)| {
                    members.into_iter().map(move |(ms, id)| (shard, ms, id))
                })
                .filter(|(_, ms, id)| horizon.as_ref().is_none_or(|h| (*ms, id.clone()) >= *h))
                .collect();
            merged.sort_by(|a, b| (b.1, &b.2).cmp(&(a.1, &a.2)));
            let lacking = want - page.len();
            if horizon.is_none() && merged.len() <= lacking {
                exhausted = true;
            }
            merged.truncate(lacking);
            if merged.is_empty() {
                break;
            }
            let lives = self
                .summaries_by_shard(merged.iter().map(|(s, _, id)| (*s, id.clone())).collect())
                .await?;
            for ((_, ms, uuid), life) in merged.into_iter().zip(lives) {
                pos = (ms, uuid.clone());
                let Some(life) = life else { continue };
                if outcome.is_some_and(|o| Outcome::of(&life).is_none_or(|(of, _)| of != o)) {
                    continue;
                }
                page.push(Value::Object(life_summary(&uuid, &life, self.timezone)));
            }
            if exhausted {
                break;
            }
        }
        let next_cursor = (!exhausted).then(|| lives_member(pos.0, &pos.1));
        let total = if outcome.is_none() { Some(total) } else { None };
        Ok(Page {
            items: page,
            next_cursor,
            total,
        })
    }
}

/// The range a pass reads past `pos`: from (ms) and to (ms or `+inf`), as
/// `lives_page.lua` and `lives_merge.lua` take them (going down, from is the lower
/// end and to the position).
fn range_args(pos: &Position, filter: &ListFilter) -> (i64, String) {
    if filter.descending {
        let top = if pos.0 == i64::MAX {
            "+inf".to_string()
        } else {
            pos.0.to_string()
        };
        (filter.from_ms.unwrap_or(0).max(0), top)
    } else {
        let to = filter
            .to_ms
            .map_or_else(|| "+inf".to_string(), |t| t.to_string());
        (pos.0, to)
    }
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

    #[test]
    fn state_and_outcome_filters_need_one_state() {
        let f = |state: Option<&str>, outcome: Option<&str>| ListFilter {
            state: state.map(str::to_string),
            outcome: outcome.map(|o| o.parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(f(None, None).needed_state(), Ok(None));
        assert_eq!(f(Some("Dead"), None).needed_state(), Ok(Some("Dead")));
        assert_eq!(
            f(None, Some("birth_failed")).needed_state(),
            Ok(Some("Stillbirth"))
        );
        assert_eq!(
            f(Some("Dead"), Some("death_failed")).needed_state(),
            Ok(Some("Dead"))
        );
        assert_eq!(f(Some("Dead"), Some("cancelled")).needed_state(), Err(()));
        // A term whose death failed.
        let mut life = LifeRecord::from_json(
            r#"{"b":1,"d":2,"c":0,"a":{"path":"/a","method":"POST"},"x":{"path":"/b","method":"POST"}}"#,
        )
        .unwrap();
        life.state = "Dead".into();
        life.birth.state = Some("Done".into());
        life.death.state = Some("Failed".into());
        assert!(f(Some("Dead"), None).matches(&life));
        assert!(f(None, Some("death_failed")).matches(&life));
        assert!(!f(None, Some("succeeded")).matches(&life));
    }
}
