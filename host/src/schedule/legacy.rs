//! Timers written before the unix dialect: their cron schedules were read by the `cron`
//! crate, Quartz-style (day of week 1 = Sunday, day fields both required, every schedule
//! under the fixed-time DST rule). [`to_unix`] rewrites such a schedule into the unix
//! dialect with exactly the fire times it had, so that nothing changes under an existing
//! timer: `0 0 9 * * 1-5` (which fired Sunday to Thursday) becomes
//! `0 0 9 * * SUN-THU`.
//!
//! The `cron` crate reads the old text (so its meaning is the crate's own), and every
//! field is written back as the explicit values it names:
//! - day of week as names, with a leading `+` when the day of month is restricted too
//!   (the old rule: both must match);
//! - minute and hour never starting with `*` (`0-59` rather than `*`), so the rewritten
//!   schedule keeps the fixed-time DST rule every old schedule had.

use std::str::FromStr;

use cron::TimeUnitSpec;

const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// The unix-dialect text of an old schedule; times-of-day lists are returned unchanged.
pub fn to_unix(old: &str) -> Result<String, String> {
    let words: Vec<&str> = old.split_whitespace().collect();
    if words.len() < 6 {
        // Not cron in the old reading (which needed 6 or 7 fields): a times-of-day list.
        return Ok(old.trim().to_string());
    }
    let s = cron::Schedule::from_str(old.trim())
        .map_err(|e| format!("`{old}` is not a schedule the old reading accepted: {e}"))?;
    let plain = |spec: &dyn Spec| -> String {
        if spec.all() {
            "*".into()
        } else {
            compact(&spec.values())
        }
    };
    let never_star = |spec: &dyn Spec| compact(&spec.values());
    let days = plain(s.days_of_month());
    let weekdays = if s.days_of_week().is_all() {
        "*".to_string()
    } else {
        let names: Vec<u32> = s.days_of_week().iter().map(|d| d - 1).collect();
        let text = compact_with(&names, |d| DAY_NAMES[d as usize].to_string());
        if s.days_of_month().is_all() {
            text
        } else {
            format!("+{text}")
        }
    };
    let mut fields = vec![
        plain(s.seconds()),
        never_star(s.minutes()),
        never_star(s.hours()),
        days,
        plain(s.months()),
        weekdays,
    ];
    if !s.years().is_all() {
        fields.push(compact(&s.years().iter().collect::<Vec<_>>()));
    }
    Ok(fields.join(" "))
}

/// The two things needed of a `cron` crate field, as an object (its own trait is not).
trait Spec {
    fn all(&self) -> bool;
    fn values(&self) -> Vec<u32>;
}

impl<T: TimeUnitSpec> Spec for T {
    fn all(&self) -> bool {
        self.is_all()
    }
    fn values(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

fn compact(values: &[u32]) -> String {
    compact_with(values, |v| v.to_string())
}

/// Sorted values as a list, runs of three or more as ranges: `1,2,3,7` is `1-3,7`.
fn compact_with(values: &[u32], name: impl Fn(u32) -> String) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let mut j = i;
        while j + 1 < values.len() && values[j + 1] == values[j] + 1 {
            j += 1;
        }
        if j - i >= 2 {
            parts.push(format!("{}-{}", name(values[i]), name(values[j])));
        } else {
            parts.extend(values[i..=j].iter().map(|v| name(*v)));
        }
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Schedule;
    use chrono::{TimeZone, Utc};

    #[test]
    fn rewrites_keep_the_old_meaning() {
        assert_eq!(to_unix("0 0 9 * * 1-5").unwrap(), "0 0 9 * * SUN-THU");
        assert_eq!(to_unix("0 30 8 1,15 * 4").unwrap(), "0 30 8 1,15 * +WED");
        assert_eq!(to_unix("0 0 */6 * * *").unwrap(), "0 0 0,6,12,18 * * *");
        assert_eq!(
            to_unix("*/10 * * * * *").unwrap(),
            "0,10,20,30,40,50 0-59 0-23 * * *"
        );
        assert_eq!(to_unix("0 0 12 * * MON-FRI").unwrap(), "0 0 12 * * MON-FRI");
        assert_eq!(
            to_unix("0 0 0 1 1 * 2030-2040").unwrap(),
            "0 0 0 1 1 * 2030-2040"
        );
        assert_eq!(to_unix("0 0 6 ? * 2,6").unwrap(), "0 0 6 * * MON,FRI");
        assert_eq!(to_unix("02:00 10:00 18:00").unwrap(), "02:00 10:00 18:00");
        assert!(to_unix("0 0 9 * * 9").is_err());
    }

    /// The rewritten schedule fires exactly where the `cron` crate fired the old one (in
    /// UTC, where the old code used the crate's own instants).
    #[test]
    fn rewrites_fire_where_the_old_reading_fired() {
        for old in [
            "0 0 9 * * 1-5",
            "0 30 8 1,15 * 4",
            "0 0 0 * * */2",
            "30 45 23 * * 7",
            "0 15 10 * * 1",
            "0 0 0 L * *",
        ] {
            let Ok(new) = to_unix(old) else { continue };
            let legacy = cron::Schedule::from_str(old).unwrap();
            let start = Utc.with_ymd_and_hms(2026, 11, 23, 0, 0, 0).unwrap();
            let want: Vec<i64> = legacy
                .after(&start)
                .take(60)
                .map(|t| t.timestamp_millis())
                .collect();
            let got = Schedule::parse(&new).unwrap().preview(
                start.timestamp_millis(),
                chrono_tz::UTC,
                60,
            );
            assert_eq!(got, want, "`{old}` rewritten as `{new}`");
        }
    }
}
