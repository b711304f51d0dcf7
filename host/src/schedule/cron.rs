//! The unix cron dialect (SPEC section 5): what people paste from crontab(5), Kubernetes,
//! GitHub Actions, Cloud Scheduler, BullMQ or Spring, read as Debian's cron reads it.
//!
//! - 5 fields (`minute hour day-of-month month day-of-week`), 6 (seconds first) or 7
//!   (seconds first, then the year); or a macro: `@yearly` (`@annually`), `@monthly`,
//!   `@weekly`, `@daily` (`@midnight`), `@hourly`.
//! - Day of week 0–7 (0 and 7 are Sunday) or `SUN`–`SAT`; months 1–12 or `JAN`–`DEC`;
//!   names in any case.
//! - `*`, `?` (day fields: the same as `*`), `a-b`, lists `a,b`, steps `*/n`, `a-b/n` and
//!   `a/n` (from a to the end of the field).
//! - Day of month: `L` (last day), `LW` (last weekday), `15W` (the weekday nearest the
//!   15th, within the month). Day of week: `5L` (the last Friday of the month), `1#2`
//!   (the second Monday).
//! - When both day fields are restricted, a day matching either is enough (POSIX/Vixie);
//!   when either starts with `*` (or is `?`), both must match, as in Debian. A day of week
//!   written with a leading `+` (`+WED`, croner's extension) makes both needed whatever
//!   they are: timers written before this dialect are rewritten with it where they relied
//!   on both.
//!
//! Parsing is ours, so that an error names the field and the value; the search for the
//! next matching wall-clock time is the `croner` crate's, given the fields as explicit
//! lists so that no reading of a step or a range is left to it.

use std::collections::BTreeSet;
use std::fmt;

use chrono::NaiveDateTime;
use croner::parser::{CronParser, Seconds, Year};

/// How a schedule's wall-clock slots become instants when the zone's clocks change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// A fixed time of day (Debian: neither the minute nor the hour field starts with
    /// `*`): a slot in a spring gap runs once right after it, a slot in a repeated autumn
    /// hour runs once, at its first occurrence.
    WallClock,
    /// A wildcard or stepped minute or hour (`*/15 * * * *`, `@hourly`): the schedule
    /// follows elapsed time, so it runs through both copies of a repeated hour and not at
    /// all in the minutes a spring gap skips.
    Elapsed,
}

/// The fields of a schedule, in the order of a 7-field expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
    Year,
}

const DAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
const MONTH_NAMES: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
/// Days in each month (February as in a leap year): a day of month no named month has
/// never fires.
const MONTH_DAYS: [u32; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Second => "second",
            Kind::Minute => "minute",
            Kind::Hour => "hour",
            Kind::DayOfMonth => "day of month",
            Kind::Month => "month",
            Kind::DayOfWeek => "day of week",
            Kind::Year => "year",
        }
    }

    pub fn range(self) -> (u32, u32) {
        match self {
            Kind::Second | Kind::Minute => (0, 59),
            Kind::Hour => (0, 23),
            Kind::DayOfMonth => (1, 31),
            Kind::Month => (1, 12),
            Kind::DayOfWeek => (0, 7),
            Kind::Year => (1970, 2099),
        }
    }

    fn value_of_name(self, word: &str) -> Option<u32> {
        let (names, first): (&[&str], u32) = match self {
            Kind::DayOfWeek => (&DAY_NAMES, 0),
            Kind::Month => (&MONTH_NAMES, 1),
            _ => return None,
        };
        names
            .iter()
            .position(|n| *n == word)
            .map(|i| i as u32 + first)
    }

    fn allowed(self) -> &'static str {
        match self {
            Kind::DayOfWeek => "0-7 or SUN-SAT",
            Kind::Month => "1-12 or JAN-DEC",
            Kind::Second | Kind::Minute => "0-59",
            Kind::Hour => "0-23",
            Kind::DayOfMonth => "1-31",
            Kind::Year => "1970-2099",
        }
    }
}

/// One element of a field's list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// `*`, or `?` in a day field.
    Any,
    /// `n` (from = to), `a-b`, and steps: `*/s`, `a-b/s`, `a/s`. `whole` marks `*/s`.
    Values {
        from: u32,
        to: u32,
        step: u32,
        whole: bool,
    },
    /// `L` in day of month.
    LastDay,
    /// `LW` in day of month.
    LastWeekday,
    /// `15W` in day of month.
    NearestWeekday(u32),
    /// `5L` in day of week (0 = Sunday).
    LastOf(u32),
    /// `1#2` in day of week: (day, nth).
    Nth(u32, u32),
}

/// One parsed field.
#[derive(Debug, Clone)]
pub struct Field {
    pub kind: Kind,
    pub items: Vec<Item>,
    /// The field as written starts with `*` (or is `?`): Debian's test for a wildcard
    /// minute or hour, and for day fields that must both match.
    pub star: bool,
}

impl Field {
    /// Every value the field names, without the special day items; day of week 7 is 0.
    pub fn values(&self) -> BTreeSet<u32> {
        let (lo, hi) = self.kind.range();
        let mut out = BTreeSet::new();
        for item in &self.items {
            match *item {
                Item::Any => out.extend(lo..=hi),
                Item::Values { from, to, step, .. } => {
                    out.extend((from..=to).step_by(step as usize));
                }
                _ => {}
            }
        }
        if self.kind == Kind::DayOfWeek && out.remove(&7) {
            out.insert(0);
        }
        out
    }

    /// `*` or `?` alone, or any list with a `*` in it: every value.
    pub fn is_any(&self) -> bool {
        self.items.contains(&Item::Any)
    }

    fn specials(&self) -> impl Iterator<Item = &Item> {
        self.items
            .iter()
            .filter(|i| !matches!(i, Item::Any | Item::Values { .. }))
    }

    /// The field as croner reads it: `*`, or an explicit list.
    fn engine_text(&self) -> String {
        if self.is_any() {
            return "*".into();
        }
        let sunday = |d: u32| if d == 7 { 0 } else { d };
        let mut parts: Vec<String> = self.values().iter().map(u32::to_string).collect();
        for item in self.specials() {
            parts.push(match *item {
                Item::LastDay => "L".into(),
                Item::LastWeekday => "LW".into(),
                Item::NearestWeekday(d) => format!("{d}W"),
                Item::LastOf(d) => format!("{}L", sunday(d)),
                Item::Nth(d, n) => format!("{}#{n}", sunday(d)),
                Item::Any | Item::Values { .. } => unreachable!("filtered out"),
            });
        }
        parts.join(",")
    }
}

/// A parse error: the field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronError(pub String);

impl fmt::Display for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn field_error(kind: Kind, what: impl fmt::Display) -> CronError {
    CronError(format!("{}: {what}", kind.name()))
}

/// The macros, spelled out.
pub const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// A parsed cron expression.
#[derive(Debug, Clone)]
pub struct CronExpr {
    pub seconds: Field,
    pub minutes: Field,
    pub hours: Field,
    pub days: Field,
    pub months: Field,
    pub weekdays: Field,
    pub years: Option<Field>,
    /// Both day fields must match (see the module docs); otherwise either is enough.
    pub days_and: bool,
    pub clock: Clock,
    engine: croner::Cron,
}

impl CronExpr {
    /// Whether `text` is meant as a cron expression: a macro, or fields (a list of times
    /// of day is told apart before this).
    pub fn looks_like_cron(text: &str) -> bool {
        let text = text.trim();
        text.starts_with('@') || text.split_whitespace().count() >= 2
    }

    pub fn parse(text: &str) -> Result<CronExpr, CronError> {
        let text = text.trim();
        let spelled;
        let words: Vec<&str> = if text.starts_with('@') {
            let lower = text.to_ascii_lowercase();
            spelled = MACROS
                .iter()
                .find(|(name, _)| *name == lower)
                .map(|(_, fields)| *fields)
                .ok_or_else(|| {
                    let names: Vec<&str> = MACROS.iter().map(|(n, _)| *n).collect();
                    CronError(format!(
                        "`{text}` is not a macro kairos knows ({})",
                        names.join(", ")
                    ))
                })?;
            spelled.split_whitespace().collect()
        } else {
            text.split_whitespace().collect()
        };
        let (second, rest, year) = match words.len() {
            5 => ("0", &words[..], None),
            6 => (words[0], &words[1..], None),
            7 => (words[0], &words[1..6], Some(words[6])),
            n => {
                return Err(CronError(format!(
                    "`{text}` has {n} field{}; a cron schedule has 5 (minute hour day-of-month month day-of-week), 6 (seconds first) or 7 (seconds first, then the year), or is a macro such as @daily",
                    if n == 1 { "" } else { "s" }
                )))
            }
        };
        let (weekday_text, forced_and) = match rest[4].strip_prefix('+') {
            Some(stripped) => (stripped, true),
            None => (rest[4], false),
        };
        let seconds = parse_field(Kind::Second, second)?;
        let minutes = parse_field(Kind::Minute, rest[0])?;
        let hours = parse_field(Kind::Hour, rest[1])?;
        let days = parse_field(Kind::DayOfMonth, rest[2])?;
        let months = parse_field(Kind::Month, rest[3])?;
        let weekdays = parse_field(Kind::DayOfWeek, weekday_text)?;
        let years = year.map(|y| parse_field(Kind::Year, y)).transpose()?;
        let days_and = forced_and || days.star || weekdays.star;
        let clock = if minutes.star || hours.star {
            Clock::Elapsed
        } else {
            Clock::WallClock
        };

        // A day of month that no named month has never fires (`0 0 30 2 *`), unless the
        // day of week alone can make the day.
        let plain_days = days.specials().next().is_none() && !days.is_any();
        if plain_days && (days_and || weekdays.is_any()) {
            let first_day = days.values().into_iter().next().unwrap_or(1);
            let longest = months
                .values()
                .iter()
                .map(|m| MONTH_DAYS[*m as usize - 1])
                .max()
                .unwrap_or(31);
            if first_day > longest {
                return Err(field_error(
                    Kind::DayOfMonth,
                    format!("no month named has a day {first_day}, so this never fires"),
                ));
            }
        }

        let engine_text = [
            seconds.engine_text(),
            minutes.engine_text(),
            hours.engine_text(),
            days.engine_text(),
            months.engine_text(),
            weekdays.engine_text(),
            years
                .as_ref()
                .map(Field::engine_text)
                .unwrap_or_else(|| "*".into()),
        ]
        .join(" ");
        let engine = CronParser::builder()
            .seconds(Seconds::Required)
            .year(Year::Required)
            .dom_and_dow(days_and)
            .build()
            .parse(&engine_text)
            .map_err(|e| CronError(format!("`{text}` cannot be evaluated: {e}")))?;
        Ok(CronExpr {
            seconds,
            minutes,
            hours,
            days,
            months,
            weekdays,
            years,
            days_and,
            clock,
            engine,
        })
    }

    /// The first wall-clock slot strictly after `naive`; None if there is none before the
    /// search gives up (croner looks up to the year 5000).
    pub fn next_slot(&self, naive: NaiveDateTime) -> Option<NaiveDateTime> {
        self.engine.find_next_occurrence(&naive, false).ok()
    }
}

fn parse_field(kind: Kind, text: &str) -> Result<Field, CronError> {
    if text.is_empty() {
        return Err(field_error(kind, "empty"));
    }
    let upper = text.to_ascii_uppercase();
    let items = upper
        .split(',')
        .map(|item| parse_item(kind, item))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Field {
        kind,
        items,
        star: upper.starts_with('*') || upper == "?",
    })
}

fn parse_item(kind: Kind, item: &str) -> Result<Item, CronError> {
    let day_field = matches!(kind, Kind::DayOfMonth | Kind::DayOfWeek);
    match item {
        "" => return Err(field_error(kind, "an empty list item")),
        "*" => return Ok(Item::Any),
        "?" if day_field => return Ok(Item::Any),
        "?" => {
            return Err(field_error(
                kind,
                "`?` is only for day of month and day of week",
            ))
        }
        _ => {}
    }
    if kind == Kind::DayOfMonth {
        if item == "L" {
            return Ok(Item::LastDay);
        }
        if item == "LW" {
            return Ok(Item::LastWeekday);
        }
        if let Some(day) = item.strip_suffix('W') {
            return Ok(Item::NearestWeekday(value(kind, day)?));
        }
    }
    if kind == Kind::DayOfWeek {
        if let Some((day, nth)) = item.split_once('#') {
            let day = value(kind, day)?;
            let nth = match nth.parse::<u32>() {
                Ok(n @ 1..=5) => n,
                _ => {
                    return Err(field_error(
                        kind,
                        format!("`{item}`: the number after # is 1-5 (1#2 = the second Monday)"),
                    ))
                }
            };
            return Ok(Item::Nth(day, nth));
        }
        if let Some(day) = item.strip_suffix('L') {
            if day.is_empty() {
                return Err(field_error(
                    kind,
                    "`L` needs a day before it (5L = the last Friday of the month)",
                ));
            }
            return Ok(Item::LastOf(value(kind, day)?));
        }
    }
    let (lo, hi) = kind.range();
    let (base, step) = match item.split_once('/') {
        Some((base, step)) => {
            let step = match step.parse::<u32>() {
                Ok(s) if s >= 1 => s,
                _ => {
                    return Err(field_error(
                        kind,
                        format!("`{item}`: a step is a whole number of at least 1"),
                    ))
                }
            };
            (base, Some(step))
        }
        None => (item, None),
    };
    let (from, to, whole) = if base == "*" {
        (lo, hi, true)
    } else if let Some((a, b)) = base.split_once('-') {
        let (a_val, b_val) = (value(kind, a)?, value(kind, b)?);
        if a_val > b_val {
            let (last, first) = match kind {
                Kind::DayOfWeek => ("SAT".to_string(), "SUN".to_string()),
                Kind::Month => ("DEC".to_string(), "JAN".to_string()),
                _ => (hi.to_string(), lo.to_string()),
            };
            return Err(field_error(
                kind,
                format!("`{a}-{b}` runs backwards; write it as a list ({a}-{last},{first}-{b})"),
            ));
        }
        (a_val, b_val, false)
    } else {
        let v = value(kind, base)?;
        // `a/s` runs from a to the end of the field, as Quartz and Spring read it.
        (v, if step.is_some() { hi } else { v }, false)
    };
    Ok(Item::Values {
        from,
        to,
        step: step.unwrap_or(1),
        whole,
    })
}

fn value(kind: Kind, word: &str) -> Result<u32, CronError> {
    let (lo, hi) = kind.range();
    if !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit()) {
        return match word.parse::<u32>() {
            Ok(v) if (lo..=hi).contains(&v) => Ok(v),
            _ => Err(field_error(kind, format!("{word} is out of {lo}-{hi}"))),
        };
    }
    kind.value_of_name(word).ok_or_else(|| {
        let hint = if word.contains(['L', 'W', '#']) {
            "; L and W belong to day of month (L, LW, 15W), L and # to day of week (5L, 1#2)"
        } else {
            ""
        };
        field_error(
            kind,
            format!("`{word}` is not a value ({}){hint}", kind.allowed()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        CronExpr::parse(text).unwrap_err().0
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        assert_eq!(err("0 9 * * 8"), "day of week: 8 is out of 0-7");
        assert_eq!(err("61 * * * *"), "minute: 61 is out of 0-59");
        assert_eq!(err("0 24 * * *"), "hour: 24 is out of 0-23");
        assert_eq!(err("0 0 0 * * *  1969"), "year: 1969 is out of 1970-2099");
        assert_eq!(
            err("0 0 * FOO *"),
            "month: `FOO` is not a value (1-12 or JAN-DEC)"
        );
        assert_eq!(
            err("0 0 * * MONDAY"),
            "day of week: `MONDAY` is not a value (0-7 or SUN-SAT)"
        );
        assert_eq!(
            err("0 0 * * FRI-MON"),
            "day of week: `FRI-MON` runs backwards; write it as a list (FRI-SAT,SUN-MON)"
        );
        assert_eq!(
            err("*/0 * * * *"),
            "minute: `*/0`: a step is a whole number of at least 1"
        );
        assert_eq!(
            err("0 0 30 2 *"),
            "day of month: no month named has a day 30, so this never fires"
        );
        assert!(err("0 0 * *").contains("has 4 fields"));
        assert!(err("@reboot").contains("@daily"));
        assert!(err("0 0 ? * * *").starts_with("hour: `?`"));
        assert!(err("0 0 * * L").contains("5L"));
        assert!(err("0 0 * * 1#6").contains("1-5"));
        assert!(err("0 0 L * 5W").starts_with("day of week"));
    }

    #[test]
    fn fields_expand_as_debian_reads_them() {
        let e = CronExpr::parse("5/20 1-10/3 */10 JAN-mar 5-7").unwrap();
        assert_eq!(e.seconds.values(), [0].into());
        assert_eq!(e.minutes.values(), [5, 25, 45].into());
        assert_eq!(e.hours.values(), [1, 4, 7, 10].into());
        assert_eq!(e.days.values(), [1, 11, 21, 31].into());
        assert_eq!(e.months.values(), [1, 2, 3].into());
        assert_eq!(e.weekdays.values(), [0, 5, 6].into(), "7 is Sunday");
        // `*/2` on days of week runs over 0-7: Sunday, Tuesday, Thursday, Saturday.
        assert_eq!(
            CronExpr::parse("0 0 * * */2").unwrap().weekdays.values(),
            [0, 2, 4, 6].into()
        );
    }

    #[test]
    fn the_day_rule_and_the_clock_rule_follow_debian() {
        let or = CronExpr::parse("0 0 1,15 * 3").unwrap();
        assert!(!or.days_and, "both restricted: either day matches");
        assert!(CronExpr::parse("0 0 */2 * 3").unwrap().days_and);
        assert!(CronExpr::parse("0 0 1 * ?").unwrap().days_and);
        assert!(CronExpr::parse("0 0 1,15 * +WED").unwrap().days_and);
        assert_eq!(
            CronExpr::parse("0 9 * * 1-5").unwrap().clock,
            Clock::WallClock
        );
        assert_eq!(
            CronExpr::parse("*/15 * * * *").unwrap().clock,
            Clock::Elapsed
        );
        assert_eq!(CronExpr::parse("@hourly").unwrap().clock, Clock::Elapsed);
        assert_eq!(CronExpr::parse("@daily").unwrap().clock, Clock::WallClock);
        assert_eq!(
            CronExpr::parse("*/5 2 * * *").unwrap().clock,
            Clock::Elapsed
        );
    }
}
