#!/usr/bin/env python3
"""Checks kairos's cron dialect against an independent oracle.

The oracle is `cronsim` (PyPI), which evaluates cron expressions the way Debian's cron
does, DST included; `croniter` (PyPI) answers for the one form cronsim lacks (`15W`, the
weekday nearest a day of the month). A seeded generator writes expressions in every form
kairos accepts (5, 6 and 7 fields, names, `?`, ranges, lists, steps, `L`, `LW`, `W`,
`5L`, `1#2`, macros); each is evaluated in several zones from several start instants,
including the hours and days just before a spring and an autumn change. kairos answers
through `kairos timers check --batch` (the same code that schedules a timer), and every
fire time must equal the oracle's.

Deliberate differences, each adapted for here rather than skipped:
- cronsim has no year field: a 7-field expression is evaluated without its year and the
  fire times are kept whose year (in the timer's zone) the year field names.
- cronsim follows elapsed time for every 6-field expression; kairos gives a 6- or 7-field
  expression with a fixed minute and hour Debian's fixed-time rule, as for its 5-field
  form (so `0 0 9 * * 1-5` means what `0 9 * * 1-5` means). Those are compared with
  cronsim's 5-field evaluation of the same minute, hour and day fields, each fire minute
  expanded by the seconds field; a minute moved past a spring gap runs once, at its
  start (several slots in one gap make one run).
- `nW` is compared with croniter in UTC only: croniter's DST handling is its own, not
  Debian's; the DST rule itself is the one checked against cronsim for every other form.
- cronsim steps hours by 60 minutes of elapsed time; where a zone moves its clocks by
  half an hour it misses the first half of the hour it reaches next. Around an offset
  change, elapsed-time fire times are completed by checking each second against
  cronsim's own reading of the fields.
- `?` means `*` (cronsim does not read it); a macro is given to cronsim spelled out.
- cronsim reads a one-value range with a step (`11-11/1`) as `11/1`, to the end of the
  field; Debian reads the range, as kairos does. The generator writes no such range.
- Fire times from the year 2100 on are not compared (zone rules beyond are guesses).

Usage: cron_oracle.py --kairos PATH [--seed N] [--expressions N] [--fires N]
"""

import argparse
import calendar
import json
import random
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError
from cronsim.cronsim import Field
from croniter import croniter

ZONES = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",  # a 30-minute shift
    "Australia/Sydney",  # southern hemisphere: spring in October
    "Asia/Kolkata",  # no DST, a half-hour offset
]
DAYS = "SUN MON TUE WED THU FRI SAT".split()
MONTHS = "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split()
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
LAST_YEAR = 2100
UTC = timezone.utc


# ---------------------------------------------------------------- the generator


class Gen:
    def __init__(self, rng: random.Random):
        self.r = rng

    def num(self, lo, hi, names=None, name_offset=0):
        v = self.r.randint(lo, hi)
        if names and self.r.random() < 0.3 and 0 <= v - name_offset < len(names):
            word = names[v - name_offset]
            return word if self.r.random() < 0.7 else word.lower()
        return str(v)

    def item(self, lo, hi, names=None, name_offset=0, dense=False):
        """One element of a list: a number, a range, or a step."""
        kind = self.r.random()
        if kind < 0.35:
            return self.num(lo, hi, names, name_offset)
        if kind < 0.6:
            a = self.r.randint(lo, hi)
            b = self.r.randint(a, hi)
            text = f"{self.num(a, a, names, name_offset)}-{self.num(b, b, names, name_offset)}"
            # cronsim reads a one-value range with a step (`11-11/1`) as `11/1` (to the
            # end of the field); Debian reads the range. Such ranges are left out.
            if b > a and self.r.random() < 0.3:
                text += f"/{self.r.randint(1, b - a)}"
            return text
        if kind < 0.85:
            step = self.r.randint(1, max(1, (hi - lo) // 2))
            return f"*/{step}"
        # `a/n`: from a to the field's end, every n (Quartz and cronsim read it so).
        a = self.r.randint(lo, hi)
        return f"{a}/{self.r.randint(1, max(1, hi - a or 1))}"

    def field(self, lo, hi, names=None, name_offset=0, star=0.35):
        if self.r.random() < star:
            return "*"
        return ",".join(self.item(lo, hi, names, name_offset) for _ in range(self.r.choice([1, 1, 1, 2, 3])))

    def dom(self):
        k = self.r.random()
        if k < 0.45:
            return "*"
        if k < 0.5:
            return "?"
        if k < 0.58:
            return "L"
        if k < 0.62:
            return "LW"
        if k < 0.66:
            return f"{self.r.randint(1, 31)}W"
        if k < 0.72:
            return f"L,{self.r.randint(1, 28)}"
        return self.field(1, 31, star=0)

    def dow(self):
        k = self.r.random()
        if k < 0.45:
            return "*"
        if k < 0.5:
            return "?"
        if k < 0.58:
            d = self.num(0, 7, DAYS + ["SUN"])
            return f"{d}L" if d.isdigit() else f"{self.r.randint(0, 7)}L"
        if k < 0.66:
            return f"{self.num(0, 7, DAYS + ['SUN'])}#{self.r.randint(1, 5)}"
        if k < 0.72:
            return self.r.choice(["1-5", "MON-FRI", "mon-fri", "0,6", "SAT,SUN", "6-7", "5-7", "0"])
        return self.field(0, 7, DAYS + ["SUN"], star=0)

    def expression(self):
        """An expression in kairos's dialect, with a note of its form."""
        k = self.r.random()
        if k < 0.05:
            return self.r.choice(list(MACROS)), "macro"
        minute = self.field(0, 59, star=0.3)
        hour = self.field(0, 23, star=0.4)
        if self.r.random() < 0.4:  # Most real schedules name a fixed time of day.
            minute = str(self.r.randint(0, 59))
            hour = str(self.r.randint(0, 23))
        dom, dow = self.dom(), self.dow()
        if "W" in dom:  # croniter, the W oracle, takes only plain days of week with it
            dow = self.r.choice(["*", "?"])
        month = self.field(1, 12, MONTHS, name_offset=1, star=0.7)
        five = f"{minute} {hour} {dom} {month} {dow}"
        if k < 0.45:
            return five, "5"
        k2 = self.r.random()
        second = "0" if k2 < 0.5 else str(self.r.randint(0, 59)) if k2 < 0.75 else self.field(0, 59, star=0.2)
        if k < 0.85:
            return f"{second} {five}", "6"
        y1 = self.r.randint(2026, 2040)
        year = self.r.choice([f"{y1}", f"{y1}-{y1 + self.r.randint(0, 20)}", f"{y1},{y1 + 2}", "*", f"{y1}/2"])
        return f"{second} {five} {year}", "7"


# ------------------------------------------------------------------ the oracle


def fields_of(expr):
    """kairos's text as (seconds, five Debian fields, year or None)."""
    if expr.startswith("@"):
        return "0", MACROS[expr.lower()].split(), None
    parts = expr.split()
    if len(parts) == 5:
        return "0", parts, None
    if len(parts) == 6:
        return parts[0], parts[1:], None
    return parts[0], parts[1:6], parts[6]


def uses_nearest_weekday(expr):
    if expr.startswith("@"):
        return False
    dom = fields_of(expr)[1][2]
    return any(f.upper().endswith("W") and f.upper() != "LW" for f in dom.split(","))


def year_set(text):
    if text is None or text == "*":
        return None
    years = set()
    for item in text.split(","):
        if "/" in item:
            start, step = item.split("/")
            years.update(range(int(start), LAST_YEAR + 1, int(step)))
        elif "-" in item:
            a, b = item.split("-")
            years.update(range(int(a), int(b) + 1))
        else:
            years.add(int(item))
    return years


def fixed_time(five):
    """Debian's test: a job whose minute and hour fields do not start with `*`."""
    return not five[0].startswith("*") and not five[1].startswith("*")


def debian(five):
    return " ".join("*" if f == "?" else f for f in five)


def oracle(expr, zone_name, start, count):
    """The first `count` fire times after `start` (aware), as epoch ms, by the oracle."""
    tz = ZoneInfo(zone_name)
    second, five, year_text = fields_of(expr)
    years = year_set(year_text)
    five_field = len(expr.split()) == 5 or expr.startswith("@")
    if uses_nearest_weekday(expr):
        # croniter, in UTC, takes seconds as its sixth field.
        text = f"{debian(five)} {second}"

        def fires_from(t):
            it = croniter(text, t.astimezone(UTC).replace(tzinfo=None))
            while True:
                yield it.get_next(datetime).replace(tzinfo=UTC)

    elif five_field and fixed_time(five) or zone_name == "UTC":
        # cronsim itself, with Debian's DST handling of fixed times.
        text = debian(five) if five_field else f"{second} {debian(five)}"

        def fires_from(t):
            return CronSim(text, t.astimezone(tz))

    elif not fixed_time(five):
        # Elapsed time. cronsim steps hours by 60 minutes of elapsed time, so on a day a
        # zone moves its clocks by half an hour (Lord Howe) its hour steps land at hh:30
        # and it can miss fires of that day. Those days are checked second by second
        # (minute by minute when only second 0 is named) against cronsim's own reading
        # of the fields.
        text = f"{second} {debian(five)}"

        def fires_from(t):
            sim = CronSim(text, t.astimezone(tz))
            step = timedelta(seconds=60 if sim.seconds == {0} else 1)
            prev = t.astimezone(UTC)
            for dt in sim:
                extra = set()
                for change in odd_changes(zone_name, prev, dt):
                    day = change.astimezone(tz).replace(hour=0, minute=0, second=0, microsecond=0)
                    lo = max(prev, day.astimezone(UTC)).replace(second=0, microsecond=0)
                    hi = min(dt.astimezone(UTC), (day + timedelta(days=1)).astimezone(UTC))
                    probe = lo
                    while probe < hi:
                        if probe > prev and matches_all(sim, probe.astimezone(tz)):
                            extra.add(probe)
                        probe += step
                for e in sorted(extra):
                    yield e.astimezone(tz)
                yield dt
                prev = dt.astimezone(UTC)

    else:
        # A 6/7-field fixed-time expression: cronsim's 5-field answer, each fire minute
        # expanded by the seconds field. A minute cronsim moved past a spring gap (its
        # wall clock is not one the fields name) is one run at its start, plus its own
        # slots if the fields name it too.
        seconds = sorted(Field.SECOND.parse(second))
        minutes, hours = Field.MINUTE.parse(five[0]), Field.HOUR.parse(five[1])

        def fires_from(t):
            minute_start = t.astimezone(tz).replace(second=0, microsecond=0) - timedelta(minutes=1)
            for dt in CronSim(debian(five), minute_start):
                named = dt.minute in minutes and dt.hour in hours
                instants = {dt + timedelta(seconds=s) for s in seconds} if named else set()
                if not named or gap_slot_before(dt.replace(tzinfo=None), tz, minutes, hours):
                    instants.add(dt)
                yield from sorted(instants)

    out = []
    fires = fires_from(start)
    end = datetime(LAST_YEAR, 1, 1, tzinfo=UTC)
    while len(out) < count:
        dt = next(fires, None)
        if dt is None or dt >= end:
            break
        if dt <= start:
            continue
        local_year = dt.astimezone(tz).year
        if years is not None and local_year not in years:
            later = [y for y in years if y > local_year]
            if not later:
                break
            # Jump to the next named year instead of walking through this one.
            fires = fires_from(datetime(min(later), 1, 1, tzinfo=tz) - timedelta(seconds=1))
            continue
        out.append(int(dt.timestamp() * 1000))
    return out


_CHANGES = {}


def odd_changes(zone_name, lo, hi):
    """Offset changes of the zone in (lo, hi] that are not whole hours."""
    if zone_name not in _CHANGES:
        tz = ZoneInfo(zone_name)
        found = []
        for year in range(2025, LAST_YEAR + 1):
            for change in transitions(zone_name, year):
                before = (change - timedelta(minutes=1)).astimezone(tz).utcoffset()
                after = change.astimezone(tz).utcoffset()
                if (after - before).total_seconds() % 3600:
                    found.append(change)
        _CHANGES[zone_name] = found
    return [c for c in _CHANGES[zone_name] if lo < c <= hi]


def matches_all(sim, local):
    return (
        local.second in sim.seconds
        and local.minute in sim.minutes
        and local.hour in sim.hours
        and local.month in sim.months
        and sim.match_day(local.date())
    )


def gap_slot_before(naive, tz, minutes, hours):
    """Whether the fields name a wall-clock minute of a gap that ends at `naive`."""
    t = naive - timedelta(minutes=1)
    while is_imaginary(t, tz):
        if t.minute in minutes and t.hour in hours:
            return True
        t -= timedelta(minutes=1)
    return False


def is_imaginary(naive, tz):
    aware = naive.replace(tzinfo=tz)
    return aware != aware.astimezone(UTC).astimezone(tz)


# ------------------------------------------------------------------- the check


def transitions(zone_name, year):
    """The instants (UTC) at which the zone's offset changes in `year`."""
    tz = ZoneInfo(zone_name)
    out = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    prev = t.astimezone(tz).utcoffset()
    while t < end:
        nxt = t + timedelta(hours=6)
        off = nxt.astimezone(tz).utcoffset()
        if off != prev:
            lo, hi = t, nxt
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(tz).utcoffset() == prev:
                    lo = mid
                else:
                    hi = mid
            out.append(hi)
            prev = off
        t = nxt
    return out


def starts_for(zone_name, rng):
    """Start instants: one at random, and before each change of the zone's offset."""
    out = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randint(0, 5 * 365 * 86400))]
    for change in transitions(zone_name, rng.choice([2026, 2027, 2028])):
        out.append(change - timedelta(days=1, minutes=rng.randint(0, 600)))
        out.append(change - timedelta(minutes=rng.randint(1, 90), seconds=rng.randint(0, 59)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kairos", required=True)
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--expressions", type=int, default=520)
    ap.add_argument("--fires", type=int, default=100)
    ap.add_argument("--show", type=int, default=10, help="mismatches to print")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    gen = Gen(rng)

    cases = []
    forms = {}
    began = time.monotonic()
    seen = set()
    while len(seen) < args.expressions:
        expr, form = gen.expression()
        if expr in seen:
            continue
        seen.add(expr)
        zones = ["UTC"] if uses_nearest_weekday(expr) else ZONES
        mine = []
        try:
            for zone in zones:
                for start in starts_for(zone, rng):
                    want = oracle(expr, zone, start, args.fires)
                    mine.append(
                        {
                            "schedule": expr,
                            "timezone": zone,
                            "from_ms": int(start.timestamp() * 1000),
                            "count": len(want),
                            "want": want,
                        }
                    )
        except (CronSimError, ValueError, KeyError) as e:
            # An expression the oracle refuses (e.g. `0 0 31 2 *`): kairos must refuse it too.
            mine = [{"schedule": expr, "timezone": "UTC", "from_ms": 0, "count": 0, "refused": str(e)}]
            form = "refused"
        cases.extend(mine)
        forms[form] = forms.get(form, 0) + 1
    oracle_s = time.monotonic() - began

    lines = "".join(
        json.dumps({"schedule": c["schedule"], "timezone": c["timezone"], "from_ms": c["from_ms"], "count": max(c["count"], 1)})
        + "\n"
        for c in cases
    )
    began = time.monotonic()
    proc = subprocess.run([args.kairos, "timers", "check", "--batch"], input=lines, capture_output=True, text=True)
    kairos_s = time.monotonic() - began
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        sys.exit(f"kairos timers check --batch exited with {proc.returncode}")
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    if len(answers) != len(cases):
        sys.exit(f"kairos answered {len(answers)} lines for {len(cases)} cases")

    compared = fires = 0
    bad = []
    for case, got in zip(cases, answers):
        if "refused" in case:
            if "error" not in got:
                bad.append((case, f"the oracle refuses it ({case['refused']}); kairos accepted it"))
            continue
        compared += 1
        if "error" in got:
            bad.append((case, f"kairos refused it: {got['error']}"))
            continue
        got_fires = [ms for ms in got["fires"] if ms < int(datetime(LAST_YEAR, 1, 1, tzinfo=UTC).timestamp() * 1000)]
        fires += len(case["want"])
        if got_fires[: len(case["want"])] != case["want"]:
            bad.append((case, got_fires))

    print(
        f"cron oracle: {len(seen)} expressions ({forms}), "
        f"{len(ZONES)} zones, {compared} cases, {fires} fire times; "
        f"oracle {oracle_s:.1f} s, kairos {kairos_s:.1f} s; {len(bad)} mismatches"
    )
    for case, got in bad[: args.show]:
        zone = ZoneInfo(case["timezone"])

        def show(ms):
            return datetime.fromtimestamp(ms / 1000, tz=zone).isoformat()

        print(f"  {case['schedule']!r} in {case['timezone']} from {show(case['from_ms']) if case['from_ms'] else '-'}:")
        if isinstance(got, str):
            print(f"    {got}")
            continue
        for i, (w, g) in enumerate(zip(case["want"], got + [None] * len(case["want"]))):
            if w != g:
                print(f"    fire {i}: oracle {show(w)}, kairos {show(g) if g else 'none'}")
                break
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
