//! Recurring schedules of timers (SPEC section 5): a cron expression with seconds
//! (`0 */5 * * * *`, parsed by the `cron` crate) or a list of times of day
//! (`"02:00 10:00 18:00"`), both read as wall-clock times in the timer's IANA zone.
//!
//! **DST rule.** A schedule names wall-clock slots; each slot becomes one instant:
//! - a slot that exists once is that instant;
//! - a slot in a spring-forward gap (it never shows on a clock) runs once, at the first
//!   instant after the gap; several slots in one gap make that one run;
//! - a slot in a repeated autumn hour runs once, at its first occurrence; the repeat of
//!   the hour runs nothing.
//!
//! Instants never go backwards under these rules, so "the next slot after an instant" is
//! well defined, and no slot ever fires twice.

use std::str::FromStr;

use chrono::{DateTime, LocalResult, NaiveDateTime, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;

/// Most wall-clock slots looked at when searching for the next fire time; a schedule
/// whose next slot is further away than this (in slots) is treated as never firing.
const MAX_SLOTS_SCANNED: usize = 200_000;

/// A parsed schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    Cron(Box<cron::Schedule>),
    /// Sorted, distinct times of day.
    TimesOfDay(Vec<NaiveTime>),
}

impl Schedule {
    /// Parses a cron expression (6 or 7 fields, seconds first) or a list of `HH:MM` /
    /// `HH:MM:SS` times separated by spaces or commas.
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
        if words.len() < 6 {
            return Err(format!(
                "`{text}` is neither a cron expression with seconds (6 or 7 fields, e.g. `0 */5 * * * *`) nor a list of times of day (`02:00 10:00`)"
            ));
        }
        cron::Schedule::from_str(text)
            .map(|s| Schedule::Cron(Box::new(s)))
            .map_err(|e| format!("`{text}` is not a cron expression: {e}"))
    }

    /// Wall-clock slots strictly after `naive`, in order.
    fn slots_after(&self, naive: NaiveDateTime) -> Box<dyn Iterator<Item = NaiveDateTime> + '_> {
        match self {
            // The cron crate iterates in a zone; over UTC its "instants" are exactly the
            // wall-clock slots we want, with no DST of their own.
            Schedule::Cron(s) => Box::new(
                s.after_owned(Utc.from_utc_datetime(&naive))
                    .map(|t| t.naive_utc()),
            ),
            Schedule::TimesOfDay(times) => {
                let start_day = naive.date();
                Box::new(
                    start_day
                        .iter_days()
                        .flat_map(move |day| times.iter().map(move |t| day.and_time(*t)))
                        .filter(move |slot| *slot > naive),
                )
            }
        }
    }

    /// The first fire time strictly after `after_ms`, under the DST rule of the module
    /// docs; None if the schedule never fires again.
    pub fn next_after(&self, after_ms: i64, tz: Tz) -> Option<i64> {
        let after = DateTime::from_timestamp_millis(after_ms)?;
        let local = after.with_timezone(&tz).naive_local();
        // Slots before the wall-clock time of `after` map to instants at or before it
        // (see the module docs), so the search can start there.
        self.slots_after(local)
            .take(MAX_SLOTS_SCANNED)
            .map(|slot| slot_instant_ms(slot, tz))
            .find(|ms| *ms > after_ms)
    }

    /// The next `n` fire times after `after_ms`.
    pub fn preview(&self, after_ms: i64, tz: Tz, n: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(n);
        let mut from = after_ms;
        while out.len() < n {
            match self.next_after(from, tz) {
                Some(ms) => {
                    out.push(ms);
                    from = ms;
                }
                None => break,
            }
        }
        out
    }

    /// Fire times in `(from_ms, to_ms]`, at most `cap` of them, and whether there were
    /// more.
    pub fn between(&self, from_ms: i64, to_ms: i64, tz: Tz, cap: usize) -> (Vec<i64>, bool) {
        let mut out = Vec::new();
        let mut at = from_ms;
        while let Some(ms) = self.next_after(at, tz) {
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
}

/// The instant of one wall-clock slot (the DST rule of the module docs).
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

    const LONDON: Tz = chrono_tz::Europe::London;
    const NEW_YORK: Tz = chrono_tz::America::New_York;

    #[test]
    fn parses_both_forms_and_refuses_nonsense() {
        assert!(matches!(
            Schedule::parse("0 */5 * * * *").unwrap(),
            Schedule::Cron(_)
        ));
        match Schedule::parse("18:00, 02:00 10:00:30 02:00").unwrap() {
            Schedule::TimesOfDay(t) => assert_eq!(t.len(), 3),
            other => panic!("{other:?}"),
        }
        assert!(Schedule::parse("").is_err());
        assert!(Schedule::parse("25:00").is_err());
        assert!(
            Schedule::parse("*/5 * * * *").is_err(),
            "five fields lack seconds"
        );
        assert!(Schedule::parse("0 61 * * * *").is_err());
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
    fn london_spring_gap_runs_once_right_after_it() {
        // 2026-03-29: 01:00 GMT becomes 02:00 BST (01:00Z); 01:30 does not exist.
        for s in ["01:30", "0 30 1 * * *"] {
            assert_eq!(
                next(s, "2026-03-29T00:00:00Z", LONDON),
                "2026-03-29T01:00:00Z",
                "{s}"
            );
            assert_eq!(
                next(s, "2026-03-29T01:00:00Z", LONDON),
                "2026-03-30T00:30:00Z",
                "{s}: the next day is 01:30 BST"
            );
        }
        // Every 15 minutes: the four slots of the missing hour make a single run.
        let every15 = Schedule::parse("0 */15 * * * *").unwrap();
        let runs = every15.between(
            utc("2026-03-29T00:40:00Z"),
            utc("2026-03-29T01:20:00Z"),
            LONDON,
            100,
        );
        let shown: Vec<String> = runs.0.into_iter().map(show).collect();
        assert_eq!(
            shown,
            [
                "2026-03-29T00:45:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-29T01:15:00Z"
            ]
        );
    }

    #[test]
    fn london_autumn_repeat_runs_once() {
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
        let every30 = Schedule::parse("0 0,30 * * * *").unwrap();
        let (runs, more) = every30.between(
            utc("2026-10-24T23:45:00Z"),
            utc("2026-10-25T02:00:00Z"),
            LONDON,
            100,
        );
        assert!(!more);
        let shown: Vec<String> = runs.into_iter().map(show).collect();
        // 01:00 and 01:30 once each (BST), then nothing until 02:00 GMT.
        assert_eq!(
            shown,
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T02:00:00Z"
            ]
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
    }

    #[test]
    fn never_firing_schedules_end() {
        let feb30 = Schedule::parse("0 0 0 30 2 * *").unwrap();
        assert_eq!(feb30.next_after(0, chrono_tz::UTC), None);
        let (between, more) =
            Schedule::parse("*/1 * * * * *")
                .unwrap()
                .between(0, 10_000, chrono_tz::UTC, 3);
        assert_eq!(between, [1000, 2000, 3000]);
        assert!(more);
    }
}
