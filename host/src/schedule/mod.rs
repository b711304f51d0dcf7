//! Recurring schedules of timers (SPEC section 5): a cron expression in the unix dialect
//! (`cron.rs`: 5, 6 or 7 fields, `L`/`W`/`#`, macros) or a list of times of day
//! (`"02:00 10:00 18:00"`), both read as wall-clock times in the timer's IANA zone, with
//! Debian cron's answers (checked against an independent oracle by
//! `scripts/cron_oracle.py`).
//!
//! **DST, by kind of schedule** ([`Clock`]), as Debian's cron does it:
//! - A **fixed time of day** (a times-of-day list, or cron whose minute and hour fields do
//!   not start with `*`) names wall-clock slots, each one instant:
//!   - a slot that exists once is that instant;
//!   - a slot in a spring-forward gap (it never shows on a clock) runs once, at the first
//!     instant after the gap; several slots in one gap make that one run;
//!   - a slot in a repeated autumn hour runs once, at its first occurrence.
//! - A **wildcard or stepped minute or hour** (`*/15 * * * *`, `@hourly`) follows
//!   elapsed time: it runs at every instant whose wall-clock time matches, so through
//!   both copies of a repeated hour, and not at all in the minutes a gap skips.
//!
//! Under both rules the instants of successive slots never go backwards, so "the next
//! fire time after an instant" is well defined and no instant fires twice.
//!
//! A timer may change the fixed-time rule with its `dst` ([`DstRule`]): `repeated:
//! twice` runs a slot of a repeated hour at both of its instants (so the two copies of
//! the hour interleave: 01:00 and 01:30 of the first copy, then of the second), and `gap:
//! skip` does not run a slot that a spring gap removes.

pub mod cron;
mod describe;
pub mod legacy;

use chrono::{DateTime, LocalResult, NaiveDateTime, NaiveTime, Offset, TimeZone};
use chrono_tz::Tz;

pub use cron::{Clock, CronError, CronExpr};

/// Most wall-clock slots looked at when searching for the next fire time under the
/// fixed-time rule; a schedule whose next slot is further away than this (in slots) is
/// treated as never firing.
const MAX_SLOTS_SCANNED: usize = 200_000;
/// Most steps of the elapsed-time search (each covers a day, or up to an offset change).
const MAX_ELAPSED_STEPS: usize = 10_000;
const DAY_MS: i64 = 86_400_000;

/// What a fixed-time schedule does at DST changes (a timer's `dst`); the default is
/// Debian cron's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DstRule {
    pub repeated: Repeated,
    pub gap: Gap,
}

/// A slot whose wall-clock time shows twice, in an autumn repeated hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Repeated {
    /// At its first instant only.
    #[default]
    Once,
    /// At both instants.
    Twice,
}

/// A slot whose wall-clock time never shows, in a spring gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gap {
    /// Once, at the first instant after the gap (several slots in one gap: one run).
    #[default]
    AfterGap,
    /// Not at all.
    Skip,
}

impl Repeated {
    pub fn word(self) -> &'static str {
        match self {
            Repeated::Once => "once",
            Repeated::Twice => "twice",
        }
    }

    pub fn from_word(word: &str) -> Option<Repeated> {
        match word {
            "once" => Some(Repeated::Once),
            "twice" => Some(Repeated::Twice),
            _ => None,
        }
    }
}

impl Gap {
    pub fn word(self) -> &'static str {
        match self {
            Gap::AfterGap => "after_gap",
            Gap::Skip => "skip",
        }
    }

    pub fn from_word(word: &str) -> Option<Gap> {
        match word {
            "after_gap" => Some(Gap::AfterGap),
            "skip" => Some(Gap::Skip),
            _ => None,
        }
    }
}

/// Most hours a DST change moves the clock (two, in the Antarctic's Troll station): the
/// search for the next fire time under `repeated: twice` looks this far either side.
const MAX_DST_SHIFT_MS: i64 = 3 * 3_600_000;

/// A parsed schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    Cron(Box<CronExpr>),
    /// Sorted, distinct times of day.
    TimesOfDay(Vec<NaiveTime>),
}

impl Schedule {
    /// Parses a cron expression (see `cron.rs`) or a list of `HH:MM` / `HH:MM:SS` times
    /// separated by spaces or commas.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("schedule is empty".into());
        }
        let words: Vec<&str> = text
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .collect();
        let looks_like_times = words
            .iter()
            .all(|w| w.contains(':') && w.bytes().all(|b| b.is_ascii_digit() || b == b':'));
        if looks_like_times {
            let mut times = Vec::new();
            for w in &words {
                let t = NaiveTime::parse_from_str(w, "%H:%M:%S")
                    .or_else(|_| NaiveTime::parse_from_str(w, "%H:%M"))
                    .map_err(|_| format!("`{w}` is not a time of day (HH:MM or HH:MM:SS)"))?;
                times.push(t);
            }
            times.sort();
            times.dedup();
            return Ok(Schedule::TimesOfDay(times));
        }
        if !CronExpr::looks_like_cron(text) {
            return Err(format!(
                "`{text}` is neither a cron expression (5 fields such as `0 9 * * 1-5`, 6 with seconds first, 7 with a year, or a macro such as @daily) nor a list of times of day (`02:00 10:00`)"
            ));
        }
        CronExpr::parse(text)
            .map(|c| Schedule::Cron(Box::new(c)))
            .map_err(|e| e.to_string())
    }

    /// A schedule as stored in a timer: in the unix dialect when `dialect` says so,
    /// otherwise written before it (`legacy.rs`) and read with its old meaning.
    pub fn parse_stored(text: &str, dialect: Option<&str>) -> Result<Schedule, String> {
        match dialect {
            Some(_) => Schedule::parse(text),
            None => Schedule::parse(&legacy::to_unix(text)?),
        }
    }

    /// How the schedule's slots meet DST changes.
    pub fn clock(&self) -> Clock {
        match self {
            Schedule::Cron(c) => c.clock,
            Schedule::TimesOfDay(_) => Clock::WallClock,
        }
    }

    /// The schedule in plain English, e.g. "At 09:00, Monday through Friday".
    pub fn describe(&self) -> String {
        match self {
            Schedule::Cron(c) => describe::cron(c),
            Schedule::TimesOfDay(times) => describe::times_of_day(times),
        }
    }

    /// The first wall-clock slot strictly after `naive`.
    fn next_slot(&self, naive: NaiveDateTime) -> Option<NaiveDateTime> {
        match self {
            Schedule::Cron(c) => c.next_slot(naive),
            Schedule::TimesOfDay(times) => {
                let day = naive.date();
                let today = times.iter().find(|t| day.and_time(**t) > naive);
                match today {
                    Some(t) => Some(day.and_time(*t)),
                    None => Some(day.succ_opt()?.and_time(*times.first()?)),
                }
            }
        }
    }

    /// The first fire time strictly after `after_ms`, under the DST rule of the module
    /// docs; None if the schedule never fires again.
    pub fn next_after(&self, after_ms: i64, tz: Tz) -> Option<i64> {
        self.next_after_with(after_ms, tz, DstRule::default())
    }

    /// The first fire time strictly after `after_ms` under `dst`, which changes only
    /// fixed-time schedules (elapsed time has no choice to make).
    pub fn next_after_with(&self, after_ms: i64, tz: Tz, dst: DstRule) -> Option<i64> {
        match self.clock() {
            Clock::WallClock if dst == DstRule::default() => self.next_wall_clock(after_ms, tz),
            Clock::WallClock => self.next_wall_clock_with(after_ms, tz, dst),
            Clock::Elapsed => self.next_elapsed(after_ms, tz),
        }
    }

    fn next_wall_clock(&self, after_ms: i64, tz: Tz) -> Option<i64> {
        let after = DateTime::from_timestamp_millis(after_ms)?;
        // Slots before the wall-clock time of `after` map to instants at or before it
        // (see the module docs), so the search can start there.
        let mut slot = after.with_timezone(&tz).naive_local();
        for _ in 0..MAX_SLOTS_SCANNED {
            slot = self.next_slot(slot)?;
            let ms = slot_instant_ms(slot, tz);
            if ms > after_ms {
                return Some(ms);
            }
        }
        None
    }

    /// The fixed-time rule with a `dst` of the timer's. Under `repeated: twice` the
    /// instants of successive slots can go backwards (the second copy of 01:30 comes after
    /// the first copy of 01:45), so this looks at every slot that could hold the answer,
    /// from the DST shift before the wall-clock time of `after` to the shift past the best
    /// instant found, and takes the earliest.
    fn next_wall_clock_with(&self, after_ms: i64, tz: Tz, dst: DstRule) -> Option<i64> {
        let after = DateTime::from_timestamp_millis(after_ms)?;
        let start = after.with_timezone(&tz).naive_local();
        let mut slot =
            start.checked_sub_signed(chrono::Duration::milliseconds(MAX_DST_SHIFT_MS))?;
        let mut best: Option<(i64, NaiveDateTime)> = None;
        for _ in 0..MAX_SLOTS_SCANNED {
            slot = self.next_slot(slot)?;
            if let Some((_, best_slot)) = best {
                let horizon = best_slot
                    .checked_add_signed(chrono::Duration::milliseconds(MAX_DST_SHIFT_MS))?;
                if slot > horizon {
                    break;
                }
            }
            for ms in slot_instants_ms(slot, tz, dst).into_iter().flatten() {
                if ms > after_ms && best.is_none_or(|(b, _)| ms < b) {
                    best = Some((ms, slot));
                }
            }
        }
        best.map(|(ms, _)| ms)
    }

    /// Elapsed time: walks the time line in stretches of one UTC offset; in each, the
    /// instants whose wall-clock time is a slot are the slots shifted by that offset.
    fn next_elapsed(&self, after_ms: i64, tz: Tz) -> Option<i64> {
        let mut from = after_ms;
        for _ in 0..MAX_ELAPSED_STEPS {
            let offset = offset_ms(from.checked_add(1)?, tz)?;
            let stretch_end = offset_change_after(from, offset, tz)?;
            let local = DateTime::from_timestamp_millis(from.checked_add(offset)?)?.naive_utc();
            let slot = self.next_slot(local)?;
            let slot_ms = slot.and_utc().timestamp_millis();
            let at = slot_ms - offset;
            if at < stretch_end {
                return Some(at);
            }
            // No slot in this stretch. Any later slot is at least `slot`; offsets lie
            // within -12 h and +14 h, so its instant is no earlier than 26 h before `at`:
            // jump there when that is past the stretch.
            from = (stretch_end - 1).max(at - 26 * 3_600_000);
        }
        None
    }

    /// The next `n` fire times after `after_ms`.
    pub fn preview(&self, after_ms: i64, tz: Tz, n: usize) -> Vec<i64> {
        preview(|at| self.next_after(at, tz), after_ms, n)
    }

    /// Fire times in `(from_ms, to_ms]`, at most `cap` of them, and whether there were
    /// more.
    pub fn between(&self, from_ms: i64, to_ms: i64, tz: Tz, cap: usize) -> (Vec<i64>, bool) {
        between(|at| self.next_after(at, tz), from_ms, to_ms, cap)
    }
}

/// The next `n` times `next` gives after `after_ms`, each after the one before.
pub fn preview(next: impl Fn(i64) -> Option<i64>, after_ms: i64, n: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(n);
    let mut from = after_ms;
    while out.len() < n {
        match next(from) {
            Some(ms) => {
                out.push(ms);
                from = ms;
            }
            None => break,
        }
    }
    out
}

/// The times `next` gives in `(from_ms, to_ms]`, at most `cap` of them, and whether
/// there were more.
pub fn between(
    next: impl Fn(i64) -> Option<i64>,
    from_ms: i64,
    to_ms: i64,
    cap: usize,
) -> (Vec<i64>, bool) {
    let mut out = Vec::new();
    let mut at = from_ms;
    while let Some(ms) = next(at) {
        if ms > to_ms {
            return (out, false);
        }
        if out.len() == cap {
            return (out, true);
        }
        out.push(ms);
        at = ms;
    }
    (out, false)
}

/// What `POST /timers/validate` and `kairos timers check` answer for a schedule: the
/// same reading a timer would get.
#[derive(Debug, Clone)]
pub struct Checked {
    pub schedule: Schedule,
    pub timezone: Tz,
    pub description: String,
    /// The next fire times after the instant asked about.
    pub fires_ms: Vec<i64>,
}

impl Checked {
    pub fn new(text: &str, zone: &str, from_ms: i64, count: usize) -> Result<Checked, String> {
        let schedule = Schedule::parse(text)?;
        let timezone: Tz = zone
            .parse()
            .map_err(|_| format!("`{zone}` is not an IANA time zone (e.g. Europe/London)"))?;
        Ok(Checked {
            description: schedule.describe(),
            fires_ms: schedule.preview(from_ms, timezone, count),
            schedule,
            timezone,
        })
    }

    /// The DST rule in effect, as shown to people.
    pub fn clock_name(&self) -> &'static str {
        match self.schedule.clock() {
            Clock::WallClock => "wall_clock",
            Clock::Elapsed => "elapsed",
        }
    }
}

/// The zone's UTC offset at an instant, in ms (local = utc + offset).
fn offset_ms(at_ms: i64, tz: Tz) -> Option<i64> {
    let utc = DateTime::from_timestamp_millis(at_ms)?.naive_utc();
    Some(i64::from(tz.offset_from_utc_datetime(&utc).fix().local_minus_utc()) * 1000)
}

/// The first instant after `from` whose offset is not `offset`, or a day after `from`
/// when the offset holds that long (no zone changes its offset twice within a day).
fn offset_change_after(from: i64, offset: i64, tz: Tz) -> Option<i64> {
    let mut hi = from.checked_add(DAY_MS)?;
    if offset_ms(hi, tz)? == offset {
        return Some(hi);
    }
    let mut lo = from;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset_ms(mid, tz)? == offset {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

/// The instants of one wall-clock slot under the fixed-time rule and `dst`: none for a
/// slot in a gap that is skipped, two for a slot of a repeated hour run twice.
fn slot_instants_ms(slot: NaiveDateTime, tz: Tz, dst: DstRule) -> [Option<i64>; 2] {
    match tz.from_local_datetime(&slot) {
        LocalResult::Single(t) => [Some(t.timestamp_millis()), None],
        LocalResult::Ambiguous(first, second) => [
            Some(first.timestamp_millis()),
            (dst.repeated == Repeated::Twice).then(|| second.timestamp_millis()),
        ],
        LocalResult::None => match dst.gap {
            Gap::AfterGap => [Some(gap_end_ms(slot, tz)), None],
            Gap::Skip => [None, None],
        },
    }
}

/// The instant of one wall-clock slot under the fixed-time rule of the module docs.
fn slot_instant_ms(slot: NaiveDateTime, tz: Tz) -> i64 {
    match tz.from_local_datetime(&slot) {
        LocalResult::Single(t) => t.timestamp_millis(),
        LocalResult::Ambiguous(first, _) => first.timestamp_millis(),
        LocalResult::None => gap_end_ms(slot, tz),
    }
}

/// The first instant whose wall-clock time is past `slot`, for a slot inside a gap: the
/// moment the clocks jumped. Binary search over seconds within a day either side, where
/// wall-clock time only moves forward (no zone has a gap and a repeat that close).
fn gap_end_ms(slot: NaiveDateTime, tz: Tz) -> i64 {
    let as_utc = slot.and_utc().timestamp();
    let (mut lo, mut hi) = (as_utc - 26 * 3600, as_utc + 26 * 3600);
    let past = |secs: i64| {
        DateTime::from_timestamp(secs, 0)
            .map(|t| t.with_timezone(&tz).naive_local() > slot)
            .unwrap_or(true)
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if past(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> i64 {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis()
    }

    fn show(ms: i64) -> String {
        DateTime::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    fn next(schedule: &str, after: &str, tz: Tz) -> String {
        show(
            Schedule::parse(schedule)
                .unwrap()
                .next_after(utc(after), tz)
                .unwrap(),
        )
    }

    fn runs(schedule: &str, from: &str, to: &str, tz: Tz) -> Vec<String> {
        let (runs, more) = Schedule::parse(schedule)
            .unwrap()
            .between(utc(from), utc(to), tz, 1000);
        assert!(!more);
        runs.into_iter().map(show).collect()
    }

    const LONDON: Tz = chrono_tz::Europe::London;
    const NEW_YORK: Tz = chrono_tz::America::New_York;

    #[test]
    fn parses_every_form_and_refuses_nonsense() {
        for text in [
            "0 */5 * * * *",
            "*/5 * * * *",
            "0 0 12 * * MON-FRI 2030",
            "@daily",
            "@HOURLY",
            "0 0 L * *",
            "0 0 15W * *",
            "0 0 * * 5L",
            "0 0 * * 1#2",
        ] {
            assert!(
                matches!(Schedule::parse(text), Ok(Schedule::Cron(_))),
                "{text}"
            );
        }
        match Schedule::parse("18:00, 02:00 10:00:30 02:00").unwrap() {
            Schedule::TimesOfDay(t) => assert_eq!(t.len(), 3),
            other => panic!("{other:?}"),
        }
        assert!(Schedule::parse("").is_err());
        assert!(Schedule::parse("25:00").is_err());
        assert!(Schedule::parse("0 61 * * * *").is_err());
        assert!(Schedule::parse("every day").is_err());
    }

    #[test]
    fn weekdays_are_monday_to_friday() {
        // 2026-11-27 is a Friday, 2026-11-29 a Sunday.
        let fires: Vec<String> = Schedule::parse("0 9 * * 1-5")
            .unwrap()
            .preview(utc("2026-11-26T12:00:00Z"), chrono_tz::UTC, 3)
            .into_iter()
            .map(show)
            .collect();
        assert_eq!(
            fires,
            [
                "2026-11-27T09:00:00Z",
                "2026-11-30T09:00:00Z",
                "2026-12-01T09:00:00Z"
            ]
        );
        assert_eq!(
            next("0 0 9 * * 1-5", "2026-11-27T10:00:00Z", chrono_tz::UTC),
            "2026-11-30T09:00:00Z",
            "the seconds-first form means the same"
        );
        assert_eq!(
            next("0 0 * * 0", "2026-11-27T10:00:00Z", chrono_tz::UTC),
            next("0 0 * * 7", "2026-11-27T10:00:00Z", chrono_tz::UTC),
            "0 and 7 are both Sunday"
        );
    }

    #[test]
    fn day_of_month_or_day_of_week() {
        // 2026-12: the 1st is a Tuesday; Wednesdays are the 2nd, 9th, 16th, ...
        let fires: Vec<String> = Schedule::parse("0 0 1,15 * 3")
            .unwrap()
            .preview(utc("2026-11-30T12:00:00Z"), chrono_tz::UTC, 4)
            .into_iter()
            .map(show)
            .collect();
        assert_eq!(
            fires,
            [
                "2026-12-01T00:00:00Z",
                "2026-12-02T00:00:00Z",
                "2026-12-09T00:00:00Z",
                "2026-12-15T00:00:00Z"
            ]
        );
        // With a leading `+` both must match: the 1st or 15th that is a Wednesday.
        assert_eq!(
            next("0 0 1,15 * +3", "2026-11-30T12:00:00Z", chrono_tz::UTC),
            "2027-09-01T00:00:00Z"
        );
    }

    #[test]
    fn last_nearest_and_nth_days() {
        let t = chrono_tz::UTC;
        assert_eq!(
            next("0 0 L 2 *", "2028-01-01T00:00:00Z", t),
            "2028-02-29T00:00:00Z"
        );
        // 2026-05-31 is a Sunday: the last weekday is Friday the 29th.
        assert_eq!(
            next("0 0 LW * *", "2026-05-01T00:00:00Z", t),
            "2026-05-29T00:00:00Z"
        );
        // 2026-08-01 is a Saturday: 1W is Monday the 3rd (it stays in the month).
        assert_eq!(
            next("0 0 1W * *", "2026-07-31T00:00:00Z", t),
            "2026-08-03T00:00:00Z"
        );
        // 2026-11-15 is a Sunday: 15W is Monday the 16th.
        assert_eq!(
            next("0 0 15W * *", "2026-11-01T00:00:00Z", t),
            "2026-11-16T00:00:00Z"
        );
        assert_eq!(
            next("0 0 * * 5L", "2026-11-01T00:00:00Z", t),
            "2026-11-27T00:00:00Z"
        );
        assert_eq!(
            next("0 0 * * 1#2", "2026-11-01T00:00:00Z", t),
            "2026-11-09T00:00:00Z"
        );
        assert_eq!(
            next("@yearly", "2026-11-01T00:00:00Z", t),
            "2027-01-01T00:00:00Z"
        );
    }

    #[test]
    fn plain_days_follow_the_zone() {
        assert_eq!(
            next("02:00 10:00 18:00", "2026-06-01T09:00:00Z", LONDON),
            "2026-06-01T17:00:00Z"
        );
        assert_eq!(
            next("0 0 10 * * *", "2026-01-10T10:00:00Z", LONDON),
            "2026-01-11T10:00:00Z"
        );
        assert_eq!(
            next("*/1 * * * * *", "2026-01-10T10:00:00.500Z", chrono_tz::UTC),
            "2026-01-10T10:00:01Z"
        );
    }

    #[test]
    fn london_spring_gap() {
        // 2026-03-29: 01:00 GMT becomes 02:00 BST (01:00Z); 01:00-02:00 does not exist.
        for s in ["01:30", "0 30 1 * * *", "30 1 * * *"] {
            assert_eq!(
                next(s, "2026-03-29T00:00:00Z", LONDON),
                "2026-03-29T01:00:00Z",
                "{s}: a fixed time in the gap runs once right after it"
            );
            assert_eq!(
                next(s, "2026-03-29T01:00:00Z", LONDON),
                "2026-03-30T00:30:00Z",
                "{s}: the next day is 01:30 BST"
            );
        }
        // Every 15 minutes follows elapsed time: nothing for the missing hour.
        assert_eq!(
            runs(
                "*/15 * * * *",
                "2026-03-29T00:40:00Z",
                "2026-03-29T01:20:00Z",
                LONDON
            ),
            [
                "2026-03-29T00:45:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:15:00Z"
            ]
        );
        // A fixed hour whose minutes are all in the gap makes one run at its end.
        assert_eq!(
            runs(
                "0,15,30,45 1 * * *",
                "2026-03-28T23:00:00Z",
                "2026-03-29T03:00:00Z",
                LONDON
            ),
            ["2026-03-29T01:00:00Z"]
        );
    }

    fn runs_with(schedule: &str, from: &str, to: &str, tz: Tz, dst: DstRule) -> Vec<String> {
        let schedule = Schedule::parse(schedule).unwrap();
        let (runs, more) = between(
            |at| schedule.next_after_with(at, tz, dst),
            utc(from),
            utc(to),
            1000,
        );
        assert!(!more);
        runs.into_iter().map(show).collect()
    }

    #[test]
    fn dst_twice_runs_both_copies_of_a_repeated_hour_in_time_order() {
        let twice = DstRule {
            repeated: Repeated::Twice,
            gap: Gap::AfterGap,
        };
        // New York, 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:00-02:00 shows twice.
        assert_eq!(
            runs_with(
                "0,30 1 * * *",
                "2026-11-01T00:00:00Z",
                "2026-11-02T00:00:00Z",
                NEW_YORK,
                twice
            ),
            [
                "2026-11-01T05:00:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:30:00Z"
            ],
            "01:00 and 01:30 EDT, then 01:00 and 01:30 EST"
        );
        // From inside the first copy, the second copy of an earlier slot comes next.
        let s = Schedule::parse("0,30 1 * * *").unwrap();
        assert_eq!(
            show(
                s.next_after_with(utc("2026-11-01T05:45:00Z"), NEW_YORK, twice)
                    .unwrap()
            ),
            "2026-11-01T06:00:00Z"
        );
        // Days without a change are as before, and so is the default rule.
        assert_eq!(
            runs_with(
                "01:30",
                "2026-10-30T00:00:00Z",
                "2026-11-03T00:00:00Z",
                NEW_YORK,
                twice
            ),
            [
                "2026-10-30T05:30:00Z",
                "2026-10-31T05:30:00Z",
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-02T06:30:00Z"
            ]
        );
        assert_eq!(
            runs_with(
                "01:30",
                "2026-10-31T12:00:00Z",
                "2026-11-02T12:00:00Z",
                NEW_YORK,
                DstRule::default()
            ),
            ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
        );
    }

    #[test]
    fn dst_gap_skip_drops_the_slots_a_spring_gap_removes() {
        let skip = DstRule {
            repeated: Repeated::Once,
            gap: Gap::Skip,
        };
        // New York, 2026-03-08: 02:00 EST becomes 03:00 EDT.
        assert_eq!(
            runs_with(
                "30 2 * * *",
                "2026-03-07T00:00:00Z",
                "2026-03-10T00:00:00Z",
                NEW_YORK,
                skip
            ),
            ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"],
            "no 02:30 on the 8th"
        );
        assert_eq!(
            runs_with(
                "30 2 * * *",
                "2026-03-07T00:00:00Z",
                "2026-03-10T00:00:00Z",
                NEW_YORK,
                DstRule::default()
            ),
            [
                "2026-03-07T07:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z"
            ],
            "by default it runs once, when the gap ends (03:00 EDT)"
        );
        // A slot next to the gap is untouched.
        assert_eq!(
            runs_with(
                "0 3 * * *",
                "2026-03-07T12:00:00Z",
                "2026-03-08T12:00:00Z",
                NEW_YORK,
                skip
            ),
            ["2026-03-08T07:00:00Z"]
        );
    }

    #[test]
    fn london_autumn_repeat() {
        // 2026-10-25: 02:00 BST becomes 01:00 GMT; 01:00-02:00 happens twice.
        assert_eq!(
            next("01:30", "2026-10-25T00:00:00Z", LONDON),
            "2026-10-25T00:30:00Z",
            "the first 01:30 (BST)"
        );
        assert_eq!(
            next("01:30", "2026-10-25T00:30:00Z", LONDON),
            "2026-10-26T01:30:00Z",
            "the second 01:30 (GMT) runs nothing"
        );
        // A fixed time runs once per slot ...
        assert_eq!(
            runs(
                "0 0,30 1 * * *",
                "2026-10-24T23:45:00Z",
                "2026-10-25T02:00:00Z",
                LONDON
            ),
            ["2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z"]
        );
        // ... a wildcard hour runs through both copies of the hour.
        assert_eq!(
            runs(
                "0,30 * * * *",
                "2026-10-24T23:45:00Z",
                "2026-10-25T02:00:00Z",
                LONDON
            ),
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:00:00Z"
            ]
        );
        assert_eq!(
            runs(
                "@hourly",
                "2026-10-24T23:30:00Z",
                "2026-10-25T02:30:00Z",
                LONDON
            )
            .len(),
            3,
            "00:00Z, 01:00Z and 02:00Z: three hours passed"
        );
    }

    #[test]
    fn new_york_transitions() {
        // 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00Z).
        assert_eq!(
            next("02:30", "2026-03-08T06:00:00Z", NEW_YORK),
            "2026-03-08T07:00:00Z"
        );
        assert_eq!(
            next("02:30", "2026-03-08T07:00:00Z", NEW_YORK),
            "2026-03-09T06:30:00Z"
        );
        // 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:30 runs at 05:30Z (EDT) only.
        assert_eq!(
            next("0 30 1 * * *", "2026-11-01T04:00:00Z", NEW_YORK),
            "2026-11-01T05:30:00Z"
        );
        assert_eq!(
            next("0 30 1 * * *", "2026-11-01T05:30:00Z", NEW_YORK),
            "2026-11-02T06:30:00Z"
        );
        // A time-of-day list across both days keeps one run per slot.
        let preview = Schedule::parse("01:30 03:00").unwrap().preview(
            utc("2026-11-01T00:00:00Z"),
            NEW_YORK,
            3,
        );
        let shown: Vec<String> = preview.into_iter().map(show).collect();
        assert_eq!(
            shown,
            [
                "2026-11-01T05:30:00Z",
                "2026-11-01T08:00:00Z",
                "2026-11-02T06:30:00Z"
            ]
        );
        // Elapsed time from inside the first copy of the hour reaches the second copy.
        assert_eq!(
            next("*/20 1 * * *", "2026-11-01T05:45:00Z", NEW_YORK),
            "2026-11-01T06:00:00Z"
        );
    }

    #[test]
    fn lord_howe_shifts_half_an_hour() {
        let lord_howe: Tz = chrono_tz::Australia::Lord_Howe;
        // 2026-10-04 02:00 +10:30 becomes 02:30 +11 (15:30Z the day before).
        assert_eq!(
            next("15 2 * * *", "2026-10-03T15:00:00Z", lord_howe),
            "2026-10-03T15:30:00Z",
            "02:15 is in the gap: it runs when it ends"
        );
        assert_eq!(
            runs(
                "*/15 * * * *",
                "2026-10-03T15:00:00Z",
                "2026-10-03T16:00:00Z",
                lord_howe
            ),
            [
                "2026-10-03T15:15:00Z",
                "2026-10-03T15:30:00Z",
                "2026-10-03T15:45:00Z",
                "2026-10-03T16:00:00Z"
            ],
            "02:00 +10:30, then 02:30, 02:45 and 03:00 +11"
        );
    }

    #[test]
    fn never_firing_schedules_end() {
        let past = Schedule::parse("0 0 0 1 1 * 2020").unwrap();
        assert_eq!(
            past.next_after(utc("2026-01-01T00:00:00Z"), chrono_tz::UTC),
            None
        );
        let elapsed_past = Schedule::parse("0 * * * * * 2020").unwrap();
        assert_eq!(
            elapsed_past.next_after(utc("2026-01-01T00:00:00Z"), LONDON),
            None
        );
        let (between, more) =
            Schedule::parse("*/1 * * * * *")
                .unwrap()
                .between(0, 10_000, chrono_tz::UTC, 3);
        assert_eq!(between, [1000, 2000, 3000]);
        assert!(more);
    }
}
