//! Recurring timers (SPEC section 5): a timer's definition and its checks, and how a
//! finished timer run is recorded and its next slot chosen. The routes are in
//! `api/timers.rs`.
//!
//! A timer is a definition (`timer:{name}`) and one Plan (`plan:{name}:timer`) that goes
//! through the same `due` set, claims, leases and `start_run` fence as a Life's Plans.
//! **Architecture invariant:** a timer has exactly one Plan and its next slot is scheduled
//! only when the run before it has been recorded, so a timer never runs twice at once on
//! any number of hosts. Slots that pass meanwhile, because the run was still going or
//! because no host was up, follow the timer's policy ([`TimerPolicy`]): by default they
//! are logged in the runs list as `skipped` and the timer goes on with the next slot;
//! `fire_all` runs missed slots late one by one (still one run at a time), `buffer_one`
//! runs the last overlapping slot when the run ends, and a `starting_deadline` skips a
//! run that would start too late (decided by the executor before the call).
//! Schedules and the DST rules are in `schedule/`.

use std::collections::HashMap;

use chrono_tz::Tz;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::Engine;
use crate::error::ApiError;
use crate::model::DEFAULT_TIMER_RETRIES;
use crate::model::{Action, RunOpts};
use crate::schedule::{Checked, Clock, DstRule, Gap, Repeated, Schedule};
use crate::store::{self, FinishedRun, Owner, RunOutcome, TimerFinish};

/// Fire times shown by `GET /timers/{name}` unless `?preview=` says otherwise.
pub(crate) const DEFAULT_PREVIEW: usize = 5;
/// Skipped slots counted one by one in a skip record; past this it says "at least".
const MAX_SKIPS_COUNTED: usize = 100_000;
/// Default priority of a timer (1 high .. 4 low).
pub(crate) const DEFAULT_PRIORITY: u8 = 2;
/// The `dialect` field of timers whose schedule is in the unix dialect; timers written
/// before it have none and are rewritten by [`upgrade_legacy_schedules`].
const DIALECT: &str = "unix";

/// Rewrites the schedules of timers written before the unix dialect into it, keeping
/// their fire times (`schedule/legacy.rs`); run by every host at startup. Until then, or
/// if a rewrite fails, such a timer is still read in its old dialect.
pub async fn upgrade_legacy_schedules(store: &store::Store) -> Result<usize, ApiError> {
    let mut rewritten = 0;
    for (name, hash, _plan) in store.timer_list().await? {
        if hash.contains_key("dialect") {
            continue;
        }
        let Some(old) = hash.get("schedule") else {
            continue;
        };
        match crate::schedule::legacy::to_unix(old) {
            Ok(new) => {
                if store
                    .timer_rewrite_dialect(&name, old, &new, DIALECT)
                    .await?
                {
                    tracing::info!(timer = %name, old = %old, new = %new, "timer schedule rewritten into the unix cron dialect, same fire times");
                    rewritten += 1;
                }
            }
            Err(e) => {
                tracing::warn!(timer = %name, error = %e, "timer schedule left in its old dialect")
            }
        }
    }
    Ok(rewritten)
}

/// How a checked schedule is shown: by `POST /timers/validate`, `GET /timers/{name}` and
/// `kairos timers check --json`.
pub fn checked_json(checked: &Checked) -> Value {
    json!({
        "description": checked.description,
        "timezone": checked.timezone.name(),
        "dst_rule": checked.clock_name(),
        "preview": checked
            .fires_ms
            .iter()
            .map(|ms| store::rfc3339(*ms, checked.timezone))
            .collect::<Vec<_>>(),
        "preview_ms": checked.fires_ms,
    })
}

/// `preview=N`: 0 to 100 fire times.
pub(crate) fn preview_count(text: Option<&String>) -> Result<usize, ApiError> {
    match text {
        None => Ok(DEFAULT_PREVIEW),
        Some(n) => n
            .parse()
            .ok()
            .filter(|n| *n <= 100)
            .ok_or_else(|| ApiError::bad_request("invalid_query", "preview must be 0 to 100")),
    }
}

/// What becomes of a timer's missed slots: `skip` (none runs), `fire_once` (one run
/// stands for them all), `fire_all` (each runs, oldest first, within catch_up_limit and
/// catch_up_window).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = Misfire)]
#[allow(dead_code)]
#[serde(rename_all = "snake_case")]
pub(crate) enum MisfireName {
    Skip,
    FireOnce,
    FireAll,
}

/// What becomes of a timer's slot that comes while its run before is still going:
/// `skip` (logged as skipped), `buffer_one` (the last such slot runs when the run ends),
/// `cancel_running` (the run is cut off, recorded as cancelled, and the slot runs now).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = Overlap)]
#[allow(dead_code)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OverlapName {
    Skip,
    BufferOne,
    CancelRunning,
}

/// A fixed time of day in an autumn hour that happens twice: run `once` or `twice`.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = DstRepeated)]
#[allow(dead_code)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DstRepeatedName {
    Once,
    Twice,
}

/// A fixed time of day in a spring gap: run right `after_gap`, or `skip` it.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[schema(as = DstGap)]
#[allow(dead_code)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DstGapName {
    AfterGap,
    Skip,
}

// The body of `POST /timers` and of `PATCH /timers/{name}` (documented there as
// `api::views::TimerChange`, every field optional). The doc comment below is the OpenAPI
// document's description of a new timer.
/// A new timer: `name`, `schedule` and `action` are required. An unknown field is
/// refused (400 `unknown_field`).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = TimerCreate, example = json!({
    "name": "nightly-report",
    "schedule": "02:00 10:00 18:00",
    "timezone": "Asia/Tokyo",
    "action": {"path": "/reports", "method": "POST"},
    "priority": 2,
    "retries": 3
}))]
pub(crate) struct TimerBody {
    /// 1 to 100 characters; cannot change.
    #[schema(required = true, value_type = String)]
    pub(crate) name: Option<String>,
    /// Times of day (`"02:00 10:00 18:00"`), a cron expression of 5, 6 or 7 fields, or a
    /// macro such as `@hourly`.
    #[schema(required = true, value_type = String, example = "*/5 * * * *")]
    pub(crate) schedule: Option<String>,
    /// An IANA zone; the host's timezone when absent.
    #[schema(example = "Europe/Paris")]
    pub(crate) timezone: Option<String>,
    #[schema(required = true, value_type = crate::bookings::request::RawAction)]
    pub(crate) action: Option<Value>,
    /// 1 (high) to 4 (low).
    #[schema(minimum = 1, maximum = 4)]
    pub(crate) priority: Option<u8>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    pub(crate) timeout: Option<Value>,
    pub(crate) retries: Option<u32>,
    pub(crate) active: Option<bool>,
    /// The next run's time (either time format), instead of the schedule's next slot.
    pub(crate) next_run: Option<String>,
    /// Default `skip`.
    #[schema(value_type = Option<MisfireName>)]
    pub(crate) misfire: Option<String>,
    pub(crate) catch_up_limit: Option<u32>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    pub(crate) catch_up_window: Option<Value>,
    /// Default `skip`.
    #[schema(value_type = Option<OverlapName>)]
    pub(crate) overlap: Option<String>,
    #[schema(value_type = Option<crate::bookings::request::DurationValue>)]
    pub(crate) starting_deadline: Option<Value>,
    /// Dates (`YYYY-MM-DD`, in the timer's zone) on which it does not run.
    pub(crate) exclude_dates: Option<Vec<String>>,
    /// What a fixed time of day does when the clock repeats or skips it.
    pub(crate) dst: Option<DstBody>,
}

/// What a fixed time of day does when the clock repeats or skips it; a field left out
/// keeps its value (at first: `once`, `after_gap`).
#[derive(Debug, Clone, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DstBody {
    #[schema(value_type = Option<DstRepeatedName>)]
    pub(crate) repeated: Option<String>,
    #[schema(value_type = Option<DstGapName>)]
    pub(crate) gap: Option<String>,
}

/// What becomes of the slots a timer missed (Quartz's misfire instructions, Temporal's
/// catch-up window): slots that passed while no host ran it, and its overdue slot when
/// that could not start within `starting_deadline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misfire {
    /// None of them runs; each is logged as skipped. Without a `starting_deadline`, the
    /// overdue slot still runs, late (the behaviour before this setting existed).
    Skip,
    /// One run stands for all of them.
    FireOnce,
    /// One run per missed slot, oldest first, one at a time, at most `catch_up_limit`
    /// of them and none older than `catch_up_window`; the rest are logged as skipped.
    FireAll,
}

/// What becomes of a slot that comes while the timer's previous run is still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// It is logged as skipped (a timer never runs twice at once).
    Skip,
    /// The last such slot runs as soon as the run ends; any others are skipped.
    BufferOne,
    /// The running call is cut off when the next slot comes (recorded as `cancelled`),
    /// and that slot runs at once.
    CancelRunning,
}

/// A timer's run policy: misfires, overlaps, the starting deadline and the dates it
/// never fires on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimerPolicy {
    pub(crate) misfire: Misfire,
    pub(crate) catch_up_limit: u32,
    /// 0: no window.
    pub(crate) catch_up_window_ms: u64,
    pub(crate) overlap: Overlap,
    /// 0: no deadline.
    pub(crate) starting_deadline_ms: u64,
    /// Dates (in the timer's zone) on which it does not fire.
    pub(crate) exclude_dates: std::collections::BTreeSet<chrono::NaiveDate>,
    /// What a fixed-time schedule does in a repeated autumn hour and a spring gap.
    pub(crate) dst: DstRule,
}

/// `catch_up_limit` when none is given, and the most it may be.
const DEFAULT_CATCH_UP_LIMIT: u32 = 100;
const MAX_CATCH_UP_LIMIT: u32 = 1000;
/// Most `exclude_dates` one timer has.
const MAX_EXCLUDE_DATES: usize = 1000;
/// Longest starting_deadline and catch_up_window.
const MAX_POLICY_DURATION_MS: u64 = 366 * 86_400_000;

impl Default for TimerPolicy {
    fn default() -> Self {
        TimerPolicy {
            misfire: Misfire::Skip,
            catch_up_limit: DEFAULT_CATCH_UP_LIMIT,
            catch_up_window_ms: 0,
            overlap: Overlap::Skip,
            starting_deadline_ms: 0,
            exclude_dates: Default::default(),
            dst: DstRule::default(),
        }
    }
}

impl TimerPolicy {
    fn misfire_word(&self) -> &'static str {
        match self.misfire {
            Misfire::Skip => "skip",
            Misfire::FireOnce => "fire_once",
            Misfire::FireAll => "fire_all",
        }
    }

    fn overlap_word(&self) -> &'static str {
        match self.overlap {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
            Overlap::CancelRunning => "cancel_running",
        }
    }

    /// How late a slot's first attempt may start before the run is skipped instead, if
    /// ever: the deadline for `skip`, the catch-up window for `fire_all`; `fire_once`
    /// runs its overdue slot however late, as the one run for what was missed.
    pub(crate) fn skip_if_late_ms(&self) -> Option<u64> {
        let some = |ms: u64| (ms > 0).then_some(ms);
        match self.misfire {
            Misfire::Skip => some(self.starting_deadline_ms),
            Misfire::FireOnce => None,
            Misfire::FireAll => some(self.catch_up_window_ms),
        }
    }

    fn fields(&self) -> Vec<(String, String)> {
        let dates: Vec<String> = self.exclude_dates.iter().map(|d| d.to_string()).collect();
        [
            ("misfire", self.misfire_word().to_string()),
            ("catch_up_limit", self.catch_up_limit.to_string()),
            ("catch_up_window_ms", self.catch_up_window_ms.to_string()),
            ("overlap", self.overlap_word().to_string()),
            (
                "starting_deadline_ms",
                self.starting_deadline_ms.to_string(),
            ),
            ("exclude_dates", dates.join(",")),
            ("dst_repeated", self.dst.repeated.word().to_string()),
            ("dst_gap", self.dst.gap.word().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The policy stored in a timer hash; the defaults for what a timer made before
    /// these settings lacks.
    pub(crate) fn from_hash(h: &HashMap<String, String>) -> TimerPolicy {
        let d = TimerPolicy::default();
        let num = |k: &str| h.get(k).and_then(|v| v.parse::<u64>().ok());
        TimerPolicy {
            misfire: match h.get("misfire").map(String::as_str) {
                Some("fire_once") => Misfire::FireOnce,
                Some("fire_all") => Misfire::FireAll,
                _ => Misfire::Skip,
            },
            catch_up_limit: num("catch_up_limit")
                .map(|n| n as u32)
                .unwrap_or(d.catch_up_limit),
            catch_up_window_ms: num("catch_up_window_ms").unwrap_or(0),
            overlap: match h.get("overlap").map(String::as_str) {
                Some("buffer_one") => Overlap::BufferOne,
                Some("cancel_running") => Overlap::CancelRunning,
                _ => Overlap::Skip,
            },
            starting_deadline_ms: num("starting_deadline_ms").unwrap_or(0),
            exclude_dates: h
                .get("exclude_dates")
                .map(|t| t.split(',').filter_map(|d| d.parse().ok()).collect())
                .unwrap_or_default(),
            dst: DstRule {
                repeated: h
                    .get("dst_repeated")
                    .and_then(|w| Repeated::from_word(w))
                    .unwrap_or_default(),
                gap: h
                    .get("dst_gap")
                    .and_then(|w| Gap::from_word(w))
                    .unwrap_or_default(),
            },
        }
    }

    fn json(&self) -> Value {
        let secs = |ms: u64| (ms > 0).then(|| ms as f64 / 1000.0);
        json!({
            "misfire": self.misfire_word(),
            "catch_up_limit": self.catch_up_limit,
            "catch_up_window": secs(self.catch_up_window_ms),
            "overlap": self.overlap_word(),
            "starting_deadline": secs(self.starting_deadline_ms),
            "exclude_dates": self.exclude_dates.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            "dst": {"repeated": self.dst.repeated.word(), "gap": self.dst.gap.word()},
        })
    }

    /// The fire times of `schedule` in `timezone` under this policy.
    pub(crate) fn calendar<'a>(&'a self, schedule: &'a Schedule, timezone: Tz) -> Calendar<'a> {
        Calendar {
            schedule,
            timezone,
            exclude: &self.exclude_dates,
            dst: self.dst,
        }
    }
}

/// A schedule in its zone under a DST rule, less the excluded dates: the fire times a
/// timer makes.
pub(crate) struct Calendar<'a> {
    pub(crate) schedule: &'a Schedule,
    pub(crate) timezone: Tz,
    pub(crate) exclude: &'a std::collections::BTreeSet<chrono::NaiveDate>,
    pub(crate) dst: DstRule,
}

/// Fire times skipped over at most while looking past excluded dates.
const MAX_EXCLUDED_SKIPS: usize = 100_000;

impl Calendar<'_> {
    fn excluded(&self, ms: i64) -> bool {
        !self.exclude.is_empty()
            && chrono::DateTime::from_timestamp_millis(ms).is_some_and(|t| {
                self.exclude
                    .contains(&t.with_timezone(&self.timezone).date_naive())
            })
    }

    /// The first fire time strictly after `after_ms` not on an excluded date.
    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
        let mut at = after_ms;
        for _ in 0..MAX_EXCLUDED_SKIPS {
            let next = self.schedule.next_after_with(at, self.timezone, self.dst)?;
            if !self.excluded(next) {
                return Some(next);
            }
            at = next;
        }
        None
    }

    /// The next `n` fire times after `after_ms`.
    pub(crate) fn preview(&self, after_ms: i64, n: usize) -> Vec<i64> {
        crate::schedule::preview(|at| self.next_after(at), after_ms, n)
    }

    /// Fire times in `(from_ms, to_ms]`, at most `cap`, and whether there were more.
    fn between(&self, from_ms: i64, to_ms: i64, cap: usize) -> (Vec<i64>, bool) {
        crate::schedule::between(|at| self.next_after(at), from_ms, to_ms, cap)
    }
}

/// A timer's definition as stored.
#[derive(Debug, Clone)]
pub(crate) struct TimerDef {
    pub(crate) schedule_text: String,
    pub(crate) schedule: Schedule,
    pub(crate) timezone: Tz,
    pub(crate) action: Action,
    pub(crate) priority: u8,
    pub(crate) timeout_ms: Option<u64>,
    pub(crate) retries: u32,
    pub(crate) active: bool,
    pub(crate) policy: TimerPolicy,
}

impl TimerDef {
    /// A timer with the defaults of a new one, for the parser fuzz tests.
    #[cfg(test)]
    pub(crate) fn for_fuzzing() -> TimerDef {
        TimerDef {
            schedule_text: String::new(),
            schedule: Schedule::TimesOfDay(Vec::new()),
            timezone: chrono_tz::UTC,
            action: serde_json::from_value(json!({"path": "/x", "method": "POST"}))
                .expect("an action"),
            priority: DEFAULT_PRIORITY,
            timeout_ms: None,
            retries: DEFAULT_TIMER_RETRIES,
            active: true,
            policy: TimerPolicy::default(),
        }
    }

    pub(crate) fn from_hash(name: &str, h: &HashMap<String, String>) -> Result<TimerDef, ApiError> {
        let broken =
            |what: &str| ApiError::unavailable(format!("timer `{name}`: stored {what} unreadable"));
        let schedule_text = h
            .get("schedule")
            .cloned()
            .ok_or_else(|| broken("schedule"))?;
        Ok(TimerDef {
            schedule: Schedule::parse_stored(&schedule_text, h.get("dialect").map(String::as_str))
                .map_err(|_| broken("schedule"))?,
            schedule_text,
            timezone: h
                .get("timezone")
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| broken("timezone"))?,
            action: h
                .get("action")
                .and_then(|a| serde_json::from_str(a).ok())
                .ok_or_else(|| broken("action"))?,
            priority: h
                .get("priority")
                .and_then(|p| p.parse().ok())
                .unwrap_or(DEFAULT_PRIORITY),
            timeout_ms: h.get("timeout_ms").and_then(|t| t.parse().ok()),
            retries: h
                .get("retries")
                .and_then(|r| r.parse().ok())
                .unwrap_or(DEFAULT_TIMER_RETRIES),
            active: h.get("active").map(String::as_str) == Some("1"),
            policy: TimerPolicy::from_hash(h),
        })
    }

    pub(crate) fn fields(&self) -> Vec<(String, String)> {
        let mut f = vec![
            ("schedule".to_string(), self.schedule_text.clone()),
            ("dialect".to_string(), DIALECT.to_string()),
            ("timezone".to_string(), self.timezone.name().to_string()),
            ("action".to_string(), self.action_json()),
            ("priority".to_string(), self.priority.to_string()),
            ("retries".to_string(), self.retries.to_string()),
            (
                "active".to_string(),
                if self.active { "1" } else { "0" }.to_string(),
            ),
        ];
        if let Some(t) = self.timeout_ms {
            f.push(("timeout_ms".to_string(), t.to_string()));
        }
        f.extend(self.policy.fields());
        f
    }

    /// The policy as `GET /timers/{name}` shows it.
    pub(crate) fn policy_json(&self) -> Value {
        self.policy.json()
    }

    pub(crate) fn calendar(&self) -> Calendar<'_> {
        self.policy.calendar(&self.schedule, self.timezone)
    }

    pub(crate) fn action_json(&self) -> String {
        serde_json::to_string(&self.action).expect("actions serialize")
    }

    pub(crate) fn opts_json(&self) -> String {
        serde_json::to_string(&RunOpts {
            priority: Some(self.priority),
            retries: Some(self.retries),
            timeout_ms: self.timeout_ms,
            skip_if_late_ms: self.policy.skip_if_late_ms(),
            cancel_at_next_slot: self.policy.overlap == Overlap::CancelRunning,
        })
        .expect("opts serialize")
    }

    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
        self.calendar().next_after(after_ms)
    }
}

pub(crate) fn parse_body(body: &[u8]) -> Result<TimerBody, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    serde_json::from_value(value)
        .map_err(|e| crate::bookings::request::body_error("the timer body", "invalid_body", e))
}

/// The body's fields other than the action, checked and applied to `def`; returns the
/// `next_run` asked for (read in `tz`), if any.
pub(crate) fn apply_settings(
    body: TimerBody,
    def: &mut TimerDef,
    tz: Tz,
) -> Result<Option<i64>, ApiError> {
    apply_policy(&body, &mut def.policy)?;
    if let Some(text) = body.schedule {
        def.schedule =
            Schedule::parse(&text).map_err(|e| ApiError::bad_request("invalid_schedule", e))?;
        def.schedule_text = text.trim().to_string();
    }
    if def.policy.dst != DstRule::default() && def.schedule.clock() == Clock::Elapsed {
        return Err(ApiError::bad_request(
            "invalid_timer_policy",
            format!(
                "dst applies to fixed times of day; `{}` follows elapsed time (it runs through both copies of a repeated hour and not in the minutes of a gap), so leave dst out or set it to repeated once, gap after_gap",
                def.schedule_text
            ),
        ));
    }
    if let Some(tz) = body.timezone {
        def.timezone = tz.parse().map_err(|_| {
            ApiError::bad_request(
                "invalid_timezone",
                format!("`{tz}` is not an IANA time zone such as Europe/London"),
            )
        })?;
    }
    if let Some(p) = body.priority {
        if !(1..=4).contains(&p) {
            return Err(ApiError::bad_request(
                "invalid_priority",
                "priority must be 1 (high) to 4 (low)",
            ));
        }
        def.priority = p;
    }
    if let Some(t) = body.timeout {
        let text = match &t {
            Value::Number(n) => n.to_string(),
            Value::String(s) => s.clone(),
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_duration",
                    "timeout must be seconds or a string such as \"30s\"",
                ))
            }
        };
        let d = crate::config::parse_duration(&text, std::time::Duration::from_secs(1))
            .map_err(|e| ApiError::bad_request("invalid_duration", format!("timeout: {e}")))?;
        if d.is_zero() || d.as_secs() > 86_400 {
            return Err(ApiError::bad_request(
                "invalid_duration",
                "timeout must be more than 0 and at most a day",
            ));
        }
        def.timeout_ms = Some(d.as_millis() as u64);
    }
    if let Some(r) = body.retries {
        if r > 100 {
            return Err(ApiError::bad_request(
                "invalid_retries",
                "retries must be at most 100",
            ));
        }
        def.retries = r;
    }
    if let Some(a) = body.active {
        def.active = a;
    }
    body.next_run
        .map(|t| {
            crate::bookings::request::parse_time(&t, tz)
                .map(|t| t.timestamp_millis())
                .map_err(|e| ApiError::bad_request("invalid_time", format!("next_run: {e}")))
        })
        .transpose()
}

/// A policy duration: seconds or a string such as `"10m"`, 0 for none.
fn policy_duration(field: &str, value: &Value) -> Result<u64, ApiError> {
    let d = crate::bookings::request::parse_duration_value(field, value)?;
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms > MAX_POLICY_DURATION_MS {
        return Err(ApiError::bad_request(
            "invalid_duration",
            format!("{field} must be at most 366 days (0 for none)"),
        ));
    }
    Ok(ms)
}

fn apply_policy(body: &TimerBody, p: &mut TimerPolicy) -> Result<(), ApiError> {
    let bad = |message: String| ApiError::bad_request("invalid_timer_policy", message);
    if let Some(m) = &body.misfire {
        p.misfire = match m.as_str() {
            "skip" => Misfire::Skip,
            "fire_once" => Misfire::FireOnce,
            "fire_all" => Misfire::FireAll,
            other => {
                return Err(bad(format!(
                    "misfire `{other}` is not skip, fire_once or fire_all"
                )))
            }
        };
    }
    if let Some(n) = body.catch_up_limit {
        if !(1..=MAX_CATCH_UP_LIMIT).contains(&n) {
            return Err(bad(format!(
                "catch_up_limit must be 1 to {MAX_CATCH_UP_LIMIT}"
            )));
        }
        p.catch_up_limit = n;
    }
    if let Some(v) = &body.catch_up_window {
        p.catch_up_window_ms = policy_duration("catch_up_window", v)?;
    }
    if let Some(o) = &body.overlap {
        p.overlap = match o.as_str() {
            "skip" => Overlap::Skip,
            "buffer_one" => Overlap::BufferOne,
            "cancel_running" => Overlap::CancelRunning,
            other => {
                return Err(bad(format!(
                    "overlap `{other}` is not skip, buffer_one or cancel_running"
                )))
            }
        };
    }
    if let Some(v) = &body.starting_deadline {
        p.starting_deadline_ms = policy_duration("starting_deadline", v)?;
    }
    if let Some(dst) = &body.dst {
        if let Some(word) = &dst.repeated {
            p.dst.repeated = Repeated::from_word(word)
                .ok_or_else(|| bad(format!("dst.repeated `{word}` is not once or twice")))?;
        }
        if let Some(word) = &dst.gap {
            p.dst.gap = Gap::from_word(word)
                .ok_or_else(|| bad(format!("dst.gap `{word}` is not after_gap or skip")))?;
        }
    }
    if let Some(dates) = &body.exclude_dates {
        if dates.len() > MAX_EXCLUDE_DATES {
            return Err(bad(format!(
                "exclude_dates holds at most {MAX_EXCLUDE_DATES} dates"
            )));
        }
        p.exclude_dates = dates
            .iter()
            .map(|d| {
                chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d")
                    .map_err(|_| bad(format!("exclude_dates: `{d}` is not a date YYYY-MM-DD")))
            })
            .collect::<Result<_, _>>()?;
    }
    Ok(())
}

pub(crate) fn empty_body() -> TimerBody {
    TimerBody {
        name: None,
        schedule: None,
        timezone: None,
        action: None,
        priority: None,
        timeout: None,
        retries: None,
        active: None,
        next_run: None,
        misfire: None,
        catch_up_limit: None,
        catch_up_window: None,
        overlap: None,
        starting_deadline: None,
        exclude_dates: None,
        dst: None,
    }
}

impl Engine {
    /// Records one finished timer run and schedules what follows: its retry, or under the
    /// timer's policy a catch-up run of a missed slot, a buffered overlapping slot, or
    /// the next slot; the slots passed over are logged as skipped.
    pub(crate) async fn record_timer(&self, mut run: FinishedRun) {
        let Some(Owner::Timer(name)) = run.plan.owner() else {
            return;
        };
        let name = name.to_string();
        self.attach_callback(&mut run);
        for _ in 0..5 {
            let loaded = self
                .retry_store("timer", || self.store.timer_for_finish(&name))
                .await;
            let Some(loaded) = loaded else { return };
            let now_ms = self.clock.now_ms();
            let mut run_record = run.record.clone();
            let mut next_slot_ms = None;
            let mut catch_up_runs = 0;
            let (version, next, skips, outcome) = match loaded {
                None => (String::new(), None, Vec::new(), "done"),
                Some(slot) => {
                    let tz: Tz = slot.timezone.parse().unwrap_or(chrono_tz::UTC);
                    let schedule =
                        Schedule::parse_stored(&slot.schedule, slot.dialect.as_deref()).ok();
                    let version = slot.version.clone();
                    match (run.outcome.clone(), schedule) {
                        (RunOutcome::Retry { next_ms }, _) => (
                            version,
                            Some((next_ms, store::rfc3339(next_ms, tz))),
                            Vec::new(),
                            "retry",
                        ),
                        (outcome, Some(schedule)) => {
                            let slot_ms = slot.slot_ms.unwrap_or(run.record.should_run_at_ms);
                            if run.record.attempt == 1 {
                                // A catch-up or buffered run fired later than its slot: its
                                // history names the slot it stood for.
                                run_record.should_run_at_ms = slot_ms;
                            }
                            // After retries, the slot's run began before this attempt:
                            // every slot since it came while that run was still going.
                            let run_began_ms = if run.record.attempt > 1 {
                                slot_ms
                            } else {
                                run.record.started_at_ms
                            };
                            let policy = TimerPolicy::from_hash(&slot.policy);
                            let calendar = policy.calendar(&schedule, tz);
                            let plan = self.plan_after_run(
                                &name,
                                &calendar,
                                &policy,
                                slot.catch_up_runs,
                                slot_ms,
                                run_began_ms,
                                now_ms,
                            );
                            next_slot_ms = plan.next_slot_ms;
                            catch_up_runs = plan.catch_up_runs;
                            let next = plan.next_ms.map(|ms| (ms, store::rfc3339(ms, tz)));
                            let word = match (outcome, run.record.outcome) {
                                (_, "skipped") => "skipped",
                                (_, "cancelled") => "cancelled",
                                (RunOutcome::Done, _) => "done",
                                _ => "failed",
                            };
                            (version, next, plan.skips, word)
                        }
                        (_, None) => (version, None, Vec::new(), "failed"),
                    }
                }
            };
            let record = store::run_record_json(&self.host_id, "timer", &run_record);
            let finish = TimerFinish {
                name: &name,
                claim: &run.plan.claim,
                outcome,
                next,
                next_slot_ms,
                catch_up_runs,
                version: &version,
                record: record.to_string(),
                skips,
                callback: run.callback.clone(),
            };
            let notify_before = self.notify_before_ms();
            let reply = self
                .retry_store("timer", || {
                    self.store
                        .finish_timer(&self.host_id, &finish, now_ms, notify_before)
                })
                .await;
            match reply.as_deref() {
                Some("changed") => continue,
                Some("lost") => {
                    tracing::warn!(timer = %name, "the timer's Plan was taken over while it ran; its run is recorded, its schedule left to the new holder");
                    return;
                }
                _ => return,
            }
        }
    }

    /// The first slot of timer `name` after `after_ms`, read from its stored definition
    /// (None when it is gone, unreadable or never fires again): where a run under
    /// `overlap: cancel_running` is cut off.
    pub(crate) async fn next_timer_slot(&self, name: &str, after_ms: i64) -> Option<i64> {
        let (hash, _plan) = self.store.timer_load(name).await.ok()??;
        TimerDef::from_hash(name, &hash).ok()?.next_after(after_ms)
    }

    /// What follows a run of `slot_ms` that began at `run_began_ms` (see [`AfterRun`]).
    /// The slots in `(slot_ms, run_began_ms]` came while no host ran the timer (missed);
    /// those in `(run_began_ms, now_ms]` while the run was going (overlapping).
    #[allow(clippy::too_many_arguments)]
    fn plan_after_run(
        &self,
        name: &str,
        calendar: &Calendar,
        policy: &TimerPolicy,
        catch_up_runs: u32,
        slot_ms: i64,
        run_began_ms: i64,
        now_ms: i64,
    ) -> AfterRun {
        let (missed, more_missed) = calendar.between(slot_ms, run_began_ms, MAX_SKIPS_COUNTED);
        let mut skips = Vec::new();
        if policy.misfire == Misfire::FireAll && !missed.is_empty() {
            // This run was late (slots passed before it began): the first of the catch-up
            // unless one is under way.
            let late_runs = catch_up_runs.max(1);
            let oldest_ok = match policy.catch_up_window_ms {
                0 => i64::MIN,
                w => now_ms - w as i64,
            };
            let (too_old, due): (Vec<i64>, Vec<i64>) = missed.iter().partition(|s| **s < oldest_ok);
            self.skip_record(
                &mut skips,
                name,
                &too_old,
                false,
                now_ms,
                "missed, and older than the timer's catch_up_window",
            );
            if let Some(first) = due.first() {
                if late_runs < policy.catch_up_limit {
                    // The rest are missed slots again after this one's run.
                    return AfterRun {
                        next_ms: Some(now_ms),
                        next_slot_ms: Some(*first),
                        catch_up_runs: late_runs + 1,
                        skips,
                    };
                }
                self.skip_record(
                    &mut skips,
                    name,
                    &due,
                    more_missed,
                    now_ms,
                    "missed, past the timer's catch_up_limit of late runs",
                );
            }
        } else {
            let reason = match policy.misfire {
                Misfire::FireOnce => "missed: no host ran the timer at these times (down or busy); it ran once for them (misfire fire_once)",
                _ => "missed: no host ran the timer at these times (down or busy); it ran once for them",
            };
            self.skip_record(&mut skips, name, &missed, more_missed, now_ms, reason);
        }
        let (overlapped, more_overlapped) =
            calendar.between(run_began_ms, now_ms, MAX_SKIPS_COUNTED);
        let waited = match policy.overlap {
            Overlap::Skip => None,
            Overlap::BufferOne => Some(
                "the previous run was still going; one slot waited for it (overlap buffer_one)",
            ),
            // The run was cut off when its next slot came; that slot runs now (a call that
            // ended on its own just before it leaves nothing to cut off, and the same).
            Overlap::CancelRunning => Some(
                "the previous run was still going; it was cancelled and the last slot runs (overlap cancel_running)",
            ),
        };
        if let (Some(reason), Some(last)) = (waited, overlapped.last()) {
            self.skip_record(
                &mut skips,
                name,
                &overlapped[..overlapped.len() - 1],
                false,
                now_ms,
                reason,
            );
            return AfterRun {
                next_ms: Some(now_ms),
                next_slot_ms: Some(*last),
                catch_up_runs: 0,
                skips,
            };
        }
        self.skip_record(
            &mut skips,
            name,
            &overlapped,
            more_overlapped,
            now_ms,
            "the previous run was still going; a timer never runs twice at once",
        );
        AfterRun {
            next_ms: calendar.next_after(now_ms),
            next_slot_ms: None,
            catch_up_runs: 0,
            skips,
        }
    }

    /// One skip record for `slots` (none when empty), logged.
    fn skip_record(
        &self,
        out: &mut Vec<String>,
        name: &str,
        slots: &[i64],
        more: bool,
        now_ms: i64,
        reason: &str,
    ) {
        let (Some(first), Some(last)) = (slots.first(), slots.last()) else {
            return;
        };
        tracing::info!(timer = %name, skipped = slots.len(), first_ms = first, reason, "timer slots skipped");
        out.push(
            json!({
                "plan": "timer",
                "outcome": "skipped",
                "should_run_at": first,
                "last_should_run_at": last,
                "skipped": slots.len(),
                "more": more,
                "host": self.host_id,
                "reason": reason,
                "started_at": now_ms,
                "duration_ms": 0,
            })
            .to_string(),
        );
    }
}

/// What a timer does after a run (`Engine::plan_after_run`).
#[derive(Debug, PartialEq)]
struct AfterRun {
    /// When its Plan fires next (None: never again).
    next_ms: Option<i64>,
    /// The slot that run stands for, when not its fire time.
    next_slot_ms: Option<i64>,
    /// Late runs of a catch-up under way, the next one included (0: none).
    catch_up_runs: u32,
    /// Skip records to log.
    skips: Vec<String>,
}

/// A timer's stored `last_outcome` as its run records say it: `success`, `retry` or
/// `failed`. A timer whose last run was recorded before the two agreed has `done`.
pub fn last_outcome(stored: &str) -> &str {
    if stored == "done" {
        "success"
    } else {
        stored
    }
}
