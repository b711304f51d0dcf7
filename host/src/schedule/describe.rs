//! A schedule in plain English, in the style of crontab.guru and cronstrue:
//! `0 9 * * 1-5` is "At 09:00, Monday through Friday".

use chrono::{NaiveTime, Timelike};

use super::cron::{CronExpr, Field, Item, Kind};

const DAYS: [&str; 8] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

pub fn times_of_day(times: &[NaiveTime]) -> String {
    let shown: Vec<String> = times
        .iter()
        .map(|t| clock(t.hour(), t.minute(), t.second()))
        .collect();
    format!("At {}", and_list(&shown))
}

pub fn cron(c: &CronExpr) -> String {
    let mut parts = vec![time_of_day(c)];
    let dom = day_of_month(&c.days);
    let dow = day_of_week(&c.weekdays);
    match (dom, dow) {
        (Some(dom), Some(dow)) if c.days_and => parts.push(format!("{dom}, if it is {dow}")),
        (Some(dom), Some(dow)) => parts.push(format!("{dom}, and {dow}")),
        (Some(d), None) | (None, Some(d)) => parts.push(d),
        (None, None) => {}
    }
    if !c.months.is_any() {
        parts.push(format!(
            "in {}",
            list(&c.months, |m| MONTHS[m as usize - 1].to_string())
        ));
    }
    if let Some(years) = c.years.as_ref().filter(|y| !y.is_any()) {
        parts.push(format!("in {}", list(years, |y| y.to_string())));
    }
    parts.join(", ")
}

fn clock(h: u32, m: u32, s: u32) -> String {
    if s == 0 {
        format!("{h:02}:{m:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// One value of a field, when it names exactly one.
fn single(f: &Field) -> Option<u32> {
    match f.items.as_slice() {
        [Item::Values { from, to, .. }] if from == to => Some(*from),
        _ => None,
    }
}

fn time_of_day(c: &CronExpr) -> String {
    let (s, m) = (single(&c.seconds), single(&c.minutes));
    let hours = c.hours.values();
    // A few fixed times a day: "At 02:00, 10:00 and 18:00".
    if let (Some(s), Some(m)) = (s, m) {
        if !c.hours.is_any()
            && hours.len() <= 6
            && !matches!(c.hours.items.as_slice(), [Item::Values { whole: true, .. }])
        {
            let shown: Vec<String> = hours.iter().map(|h| clock(*h, m, s)).collect();
            return format!("At {}", and_list(&shown));
        }
    }
    let mut out = Vec::new();
    match (s, c.seconds.is_any()) {
        (Some(0), _) => {}
        (_, true) => out.push("every second".to_string()),
        _ => out.push(unit(&c.seconds, "second", "seconds")),
    }
    let every_second = c.seconds.is_any();
    match (m, c.minutes.is_any()) {
        (_, true) if every_second => {}
        (_, true) => out.push("every minute".to_string()),
        _ => out.push(unit(&c.minutes, "minute", "minutes")),
    }
    if !c.hours.is_any() {
        out.push(match single(&c.hours) {
            Some(h) => format!("past hour {h}"),
            None => match c.hours.items.as_slice() {
                [Item::Values {
                    whole: true, step, ..
                }] => format!("past every {} hour", ordinal(*step)),
                _ => format!("past hours {}", list(&c.hours, |h| h.to_string())),
            },
        });
    }
    let mut text = out.join(", ");
    if let Some(first) = text.get(..1) {
        let upper = first.to_ascii_uppercase();
        text.replace_range(..1, &upper);
    }
    if text.starts_with("Minute") || text.starts_with("Second") {
        text = format!("At {}", lower_first(&text));
    }
    text
}

fn lower_first(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_ascii_lowercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// "minute 5", "every 15th minute", "minutes 0, 15 and 30", "minutes 10 through 20".
fn unit(f: &Field, one: &str, many: &str) -> String {
    if let Some(v) = single(f) {
        return format!("{one} {v}");
    }
    if let [Item::Values {
        whole: true, step, ..
    }] = f.items.as_slice()
    {
        return match step {
            1 => format!("every {one}"),
            _ => format!("every {} {one}", ordinal(*step)),
        };
    }
    format!("{many} {}", list(f, |v| v.to_string()))
}

fn day_of_month(f: &Field) -> Option<String> {
    if f.is_any() {
        return None;
    }
    let mut parts = Vec::new();
    if let [Item::Values {
        whole: true, step, ..
    }] = f.items.as_slice()
    {
        return Some(format!("every {} day of the month", ordinal(*step)));
    }
    let values = f.values();
    if !values.is_empty() {
        let label = if values.len() == 1 { "day" } else { "days" };
        parts.push(format!("on {label} {}", list(f, |d| d.to_string())));
    }
    for item in &f.items {
        match item {
            Item::LastDay => parts.push("on the last day of the month".into()),
            Item::LastWeekday => parts.push("on the last weekday of the month".into()),
            Item::NearestWeekday(d) => parts.push(format!("on the weekday nearest day {d}")),
            _ => {}
        }
    }
    let mut text = and_list(&parts);
    if !values.is_empty() {
        text.push_str(" of the month");
    }
    Some(text)
}

fn day_of_week(f: &Field) -> Option<String> {
    if f.is_any() {
        return None;
    }
    let mut parts = Vec::new();
    if !f.values().is_empty() {
        parts.push(list(f, |d| DAYS[d as usize].to_string()));
    }
    for item in &f.items {
        match item {
            Item::LastOf(d) => parts.push(format!("the last {} of the month", DAYS[*d as usize])),
            Item::Nth(d, n) => parts.push(format!(
                "the {} {} of the month",
                ["first", "second", "third", "fourth", "fifth"][*n as usize - 1],
                DAYS[*d as usize]
            )),
            _ => {}
        }
    }
    Some(and_list(&parts))
}

/// A field's plain values as written: ranges stay ranges ("Monday through Friday"),
/// steps are spelled out.
fn list(f: &Field, name: impl Fn(u32) -> String) -> String {
    let mut parts = Vec::new();
    for item in &f.items {
        if let Item::Values {
            from,
            to,
            step,
            whole,
        } = *item
        {
            parts.push(match (from == to, step, whole) {
                (true, _, _) => name(from),
                (false, 1, _) => format!("{} through {}", name(from), name(to)),
                (false, _, true) => format!("every {} {}", ordinal(step), noun(f.kind)),
                (false, _, false) => format!(
                    "every {} {} from {} through {}",
                    ordinal(step),
                    noun(f.kind),
                    name(from),
                    name(to)
                ),
            });
        }
    }
    and_list(&parts)
}

fn noun(kind: Kind) -> &'static str {
    match kind {
        Kind::DayOfWeek | Kind::DayOfMonth => "day",
        other => other.name(),
    }
}

fn and_list(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::super::Schedule;

    fn describe(text: &str) -> String {
        Schedule::parse(text).unwrap().describe()
    }

    #[test]
    fn reads_like_crontab_guru() {
        assert_eq!(describe("0 9 * * 1-5"), "At 09:00, Monday through Friday");
        assert_eq!(
            describe("0 0 9 * * MON-FRI"),
            "At 09:00, Monday through Friday"
        );
        assert_eq!(describe("*/15 * * * *"), "Every 15th minute");
        assert_eq!(describe("* * * * *"), "Every minute");
        assert_eq!(describe("* * * * * *"), "Every second");
        assert_eq!(describe("@hourly"), "At minute 0");
        assert_eq!(describe("0 */2 * * *"), "At minute 0, past every 2nd hour");
        assert_eq!(describe("@daily"), "At 00:00");
        assert_eq!(
            describe("0 0 1,15 * 3"),
            "At 00:00, on days 1 and 15 of the month, and Wednesday"
        );
        assert_eq!(
            describe("0 0 1,15 * +WED"),
            "At 00:00, on days 1 and 15 of the month, if it is Wednesday"
        );
        assert_eq!(
            describe("0 0 L * *"),
            "At 00:00, on the last day of the month"
        );
        assert_eq!(
            describe("30 17 * * 5L"),
            "At 17:30, the last Friday of the month"
        );
        assert_eq!(
            describe("0 10 * * 1#2"),
            "At 10:00, the second Monday of the month"
        );
        assert_eq!(
            describe("0 0 15W * *"),
            "At 00:00, on the weekday nearest day 15"
        );
        assert_eq!(
            describe("0 2,10,18 * jan,jul *"),
            "At 02:00, 10:00 and 18:00, in January and July"
        );
        assert_eq!(
            describe("30 0 0 1 1 * 2030-2040"),
            "At 00:00:30, on day 1 of the month, in January, in 2030 through 2040"
        );
        assert_eq!(describe("02:00 10:30"), "At 02:00 and 10:30");
        assert_eq!(
            describe("*/10 9-17 * * *"),
            "Every 10th minute, past hours 9 through 17"
        );
    }
}
