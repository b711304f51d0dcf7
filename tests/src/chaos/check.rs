//! The checker: reads what the load booked, what the sink received, what the faults did
//! and the final state the API shows, and counts every violation of the contract, each
//! with examples.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::cluster::{Anomaly, Fault, Instance};
use super::load::{Booking, Kind, QUEUES};
use super::sink::Call;
use super::FaultKind;

/// A fault's `[start, end]` widened by this much still explains an outcome that could not
/// be recorded: the finisher writes outcomes in batches right after a call ends.
const RECORD_MS: i64 = 2_000;
/// How many examples each check keeps.
const EXAMPLES: usize = 12;

/// Everything the run observed (kept as `observed.json` by `--keep`; `--recheck` reads
/// it back).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Observed {
    pub bookings: Vec<Booking>,
    pub calls: Vec<Call>,
    pub faults: Vec<Fault>,
    pub instances: Vec<Instance>,
    pub anomalies: Vec<Anomaly>,
    /// GET /schedules/{id} of every Life booked (acknowledged or not): the view, or None
    /// for a 404. A Life whose view could not be read is absent.
    pub lives: HashMap<String, Option<Value>>,
    /// GET /queues/{q}/tasks/{name} of the tasks the sink never saw (same convention).
    pub tasks: HashMap<String, Option<Value>>,
    /// The timers the load created: (name, period in ms).
    pub timers: Vec<(String, i64)>,
    /// GET /timers/{name}/runs items.
    pub timer_runs: HashMap<String, Vec<Value>>,
    pub start_ms: i64,
    pub load_end_ms: i64,
    /// When the final state was read.
    pub end_ms: i64,
    pub takeover_ms: i64,
    pub lease_ms: i64,
    pub birth_delay_limit_ms: i64,
    /// Calls held by the sink when the final state was read.
    pub in_flight_at_end: usize,
    /// Plans seen Running while the run went on.
    #[serde(default)]
    pub samples: Vec<Sample>,
    /// Which kairos binary ran.
    pub kairos: String,
    /// Once every host had stopped: each state whose count in the shards' census differs
    /// from the number of Lives in that state (`state: census N, Lives M`).
    #[serde(default)]
    pub census_mismatches: Vec<String>,
}

/// A Plan the sampler saw Running.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    /// When the GET was sent, and when its answer came.
    pub at_ms: i64,
    pub read_ms: i64,
    pub key: String,
    pub held_by: String,
    pub attempts: i64,
}

/// One check: a count and examples.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub count: usize,
    /// When true, a count above zero fails the run.
    pub must_be_zero: bool,
    pub examples: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub n: usize,
    pub p50: i64,
    pub p99: i64,
    pub max: i64,
}

impl Percentiles {
    fn of(mut v: Vec<i64>) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_unstable();
        let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
        Percentiles {
            n: v.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: *v.last().unwrap(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct BookingCounts {
    pub sent: usize,
    pub acknowledged: usize,
    /// Not acknowledged, by answer (status and error code, or the transport error).
    pub refused: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub bookings: BTreeMap<String, BookingCounts>,
    pub resource_bound_lives: usize,
    pub faults: BTreeMap<String, usize>,
    pub calls: usize,
    pub calls_by_plan: BTreeMap<String, usize>,
    pub in_flight_at_end: usize,
    /// Plans called more than once.
    pub duplicated_plans: usize,
    /// Calls after a Plan's first one, by cause (the fault kind, or `unexplained`).
    pub extra_calls_by_cause: BTreeMap<String, usize>,
    /// first call start − due time (ms), by Plan kind and overall (Lives and tasks).
    pub lateness: BTreeMap<String, Percentiles>,
    /// Lateness of the Plans due in the shadow of a kill -9 (its start to its end plus a
    /// lease): the takeover time as measured.
    pub lateness_after_kill9: Percentiles,
    /// Late beyond --takeover-ms, by the fault that explains it best (`none` if none).
    pub late_by_fault: BTreeMap<String, usize>,
    /// Not-acknowledged bookings that were stored anyway, by whether they were delivered.
    pub unacknowledged_stored_delivered: usize,
    pub unacknowledged_stored_not_delivered: usize,
    pub unacknowledged_not_stored: usize,
    /// Acknowledged Lives that ended without their action for a reason the spec allows.
    pub allowed_without_action: BTreeMap<String, usize>,
    pub timer_max_gap_ms: BTreeMap<String, i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub passed: bool,
    /// The start of the load (epoch ms); the report's `+N.Ns` times count from it.
    pub start_ms: i64,
    pub kairos: String,
    pub summary: Summary,
    pub checks: Vec<Check>,
    pub faults: Vec<Fault>,
    pub instances: Vec<Instance>,
    pub anomalies: Vec<Anomaly>,
}

impl Report {
    /// The checks that failed the run.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| c.must_be_zero && c.count > 0)
            .collect()
    }
}

struct Ctx<'a> {
    o: &'a Observed,
    by_key: HashMap<String, Vec<&'a Call>>,
}

impl Ctx<'_> {
    /// A time as seconds since the start of the run.
    fn t(&self, ms: i64) -> String {
        format!("+{:.1}s", (ms - self.o.start_ms) as f64 / 1000.0)
    }

    fn call(&self, c: &Call) -> String {
        format!(
            "[{} by {} {}–{}{}]",
            c.execution_count
                .map(|n| format!("#{n}"))
                .unwrap_or_default(),
            c.via,
            self.t(c.start_ms),
            c.end_ms.map(|e| self.t(e)).unwrap_or_else(|| "…".into()),
            if c.caller_gone { " caller gone" } else { "" }
        )
    }

    fn fault(&self, f: &Fault) -> String {
        format!(
            "{:?} {} {}–{}",
            f.kind,
            f.instance.as_deref().unwrap_or("redis"),
            self.t(f.start_ms),
            self.t(f.end_ms)
        )
    }

    /// The faults whose window (widened by `before` and `after`) contains `at`.
    fn faults_near(&self, at: i64, before: i64, after: i64) -> Vec<&Fault> {
        self.o
            .faults
            .iter()
            .filter(|f| at >= f.start_ms - before && at <= f.end_ms + after)
            .collect()
    }

    /// The due times a fault can make late: from just before it (a Plan dispatched as
    /// the fault came) to when its effect is over: a killed or terminated host's lease
    /// has run out (counted from the fault, when its heartbeat stopped), a stopped host
    /// is resumed, Redis is back and hosts' leases renewed; plus 5 s.
    fn shadow(&self, f: &Fault) -> (i64, i64) {
        let lease = self.o.lease_ms;
        let to = match f.kind {
            FaultKind::Kill9 | FaultKind::Term => f.end_ms.max(f.start_ms + lease),
            FaultKind::Stop => f.end_ms,
            FaultKind::Redis => f.end_ms + lease,
        };
        (f.start_ms - 2_000, to + 5_000)
    }

    fn near(&self, at: i64) -> String {
        let near = self.faults_near(at, 5_000, self.o.lease_ms + 5_000);
        if near.is_empty() {
            "no fault near".into()
        } else {
            let v: Vec<String> = near.iter().map(|f| self.fault(f)).collect();
            format!("near {}", v.join(", "))
        }
    }

    fn calls(&self, key: &str) -> &[&Call] {
        self.by_key.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The fault that explains why the run `c` may have to run again: its process was
    /// killed, terminated or stopped while `c` was in flight or before its outcome could
    /// be recorded, or Redis was away then.
    fn explains(&self, c: &Call) -> Option<&Fault> {
        let end = c.end_or(self.o.end_ms) + RECORD_MS;
        self.o.faults.iter().find(|f| match f.kind {
            FaultKind::Redis => f.start_ms <= end && f.end_ms + 1_000 >= c.start_ms,
            _ => {
                f.instance.as_deref() == Some(c.via.as_str())
                    && f.start_ms >= c.start_ms - 50
                    && f.start_ms <= end
            }
        })
    }
}

fn overlap(a: &Call, b: &Call, now: i64) -> bool {
    a.start_ms < b.end_or(now) && b.start_ms < a.end_or(now)
}

fn push(examples: &mut Vec<String>, e: String) {
    if examples.len() < EXAMPLES {
        examples.push(e);
    }
}

fn check(name: &str, must_be_zero: bool, count: usize, examples: Vec<String>) -> Check {
    Check {
        name: name.to_string(),
        count,
        must_be_zero,
        examples,
    }
}

fn plan_of<'v>(life: &'v Value, kind: &str) -> Option<&'v Value> {
    life["plans"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["kind"] == kind))
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

/// Runs every check.
pub fn check_all(o: &Observed) -> Report {
    let mut by_key: HashMap<String, Vec<&Call>> = HashMap::new();
    for c in &o.calls {
        by_key.entry(c.key()).or_default().push(c);
    }
    for v in by_key.values_mut() {
        v.sort_by_key(|c| (c.start_ms, c.seq));
    }
    let cx = Ctx { o, by_key };
    let now = o.end_ms;
    let mut checks = Vec::new();

    // ---- bookings ------------------------------------------------------------------
    let mut bookings: BTreeMap<String, BookingCounts> = BTreeMap::new();
    for b in &o.bookings {
        let kind = format!(
            "{:?}{}",
            b.kind,
            if b.resource.is_some() {
                "+resource"
            } else {
                ""
            }
        )
        .to_lowercase();
        let e = bookings.entry(kind).or_default();
        e.sent += 1;
        if b.acked() {
            e.acknowledged += 1;
        } else {
            let why = format!(
                "{} {}",
                b.status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "no answer".into()),
                b.error.as_deref().unwrap_or("")
            );
            let why: String = why.chars().take(80).collect();
            *e.refused.entry(why).or_default() += 1;
        }
    }

    // ---- lost ------------------------------------------------------------------------
    let mut lost = Vec::new();
    let mut lost_n = 0;
    let mut lost_by: BTreeMap<String, usize> = BTreeMap::new();
    let mut allowed: BTreeMap<String, usize> = BTreeMap::new();
    let outage = |from: i64, to: i64| -> bool {
        // [from, to] covered by Redis being down (the only outage where no host can run
        // anything while others are up).
        o.faults
            .iter()
            .any(|f| f.kind == FaultKind::Redis && f.start_ms <= from && f.end_ms >= to)
    };
    for b in o.bookings.iter().filter(|b| b.acked()) {
        let (key, _, due) = b.plan_keys()[0].clone();
        if !cx.calls(&key).is_empty() {
            continue;
        }
        let (label, detail) = if b.kind == Kind::Task {
            match o.tasks.get(&b.id) {
                None => ("task unreadable".to_string(), String::new()),
                Some(None) => ("task gone (404) without a call".to_string(), String::new()),
                Some(Some(t)) => (
                    format!("task {}", text(&t["state"])),
                    format!(
                        "attempts {} last_error {}",
                        t["attempts"],
                        text(&t["last_error"])
                    ),
                ),
            }
        } else {
            match o.lives.get(&b.id) {
                None => ("Life unreadable".to_string(), String::new()),
                Some(None) => ("Life missing (404)".to_string(), String::new()),
                Some(Some(l)) => {
                    let p = plan_of(l, "birth").cloned().unwrap_or(Value::Null);
                    let state = text(&l["state"]).to_string();
                    if state == "Invalidated" && outage(due, due + o.birth_delay_limit_ms) {
                        *allowed
                            .entry(
                                "Invalidated: birth_delay_limit passed while Redis was down".into(),
                            )
                            .or_default() += 1;
                        continue;
                    }
                    (
                        format!("{state}, birth Plan {}", text(&p["state"])),
                        format!(
                            "attempts {} last_error {} held_by {}",
                            p["attempts"],
                            text(&p["last_error"]),
                            text(&p["held_by"])
                        ),
                    )
                }
            }
        };
        lost_n += 1;
        *lost_by.entry(label.clone()).or_default() += 1;
        push(
            &mut lost,
            format!(
                "{} {:?}{} due {} booked via {} at {}: {label}; {detail}; {}",
                b.id,
                b.kind,
                b.resource
                    .as_deref()
                    .map(|r| format!(" on {r}"))
                    .unwrap_or_default(),
                cx.t(due),
                b.via,
                cx.t(b.sent_ms),
                cx.near(due)
            ),
        );
    }
    let mut lost_examples: Vec<String> =
        lost_by.iter().map(|(k, n)| format!("{n} × {k}")).collect();
    lost_examples.extend(lost);
    checks.push(check(
        "lost: acknowledged, never delivered, no allowed reason",
        true,
        lost_n,
        lost_examples,
    ));

    // ---- concurrent double runs ------------------------------------------------------
    let mut n = 0;
    let mut ex = Vec::new();
    for (key, calls) in &cx.by_key {
        for (i, a) in calls.iter().enumerate() {
            for b in &calls[i + 1..] {
                if overlap(a, b, now) {
                    n += 1;
                    push(
                        &mut ex,
                        format!(
                            "{key}: {} and {}; {}",
                            cx.call(a),
                            cx.call(b),
                            cx.near(b.start_ms)
                        ),
                    );
                }
            }
        }
    }
    checks.push(check(
        "concurrent double runs of one Idempotency-Key",
        true,
        n,
        ex,
    ));

    // ---- resources: overlap and order --------------------------------------------
    let mut per_resource: BTreeMap<&str, Vec<(i64, String)>> = BTreeMap::new();
    for b in &o.bookings {
        let Some(r) = b.resource.as_deref() else {
            continue;
        };
        let stored = b.acked() || matches!(o.lives.get(&b.id), Some(Some(_)));
        if !stored {
            continue;
        }
        for (key, _, due) in b.plan_keys() {
            per_resource.entry(r).or_default().push((due, key));
        }
    }
    let (mut n_overlap, mut n_order) = (0, 0);
    let (mut ex_overlap, mut ex_order) = (Vec::new(), Vec::new());
    for (r, plans) in per_resource.iter_mut() {
        plans.sort();
        for i in 0..plans.len() {
            for j in i + 1..plans.len() {
                let (earlier, later) = (cx.calls(&plans[i].1), cx.calls(&plans[j].1));
                let mut o_pair = None;
                let mut inv_pair = None;
                for a in earlier {
                    for b in later {
                        if overlap(a, b, now) {
                            o_pair.get_or_insert((*a, *b));
                        } else if b.start_ms < a.end_or(now) {
                            inv_pair.get_or_insert((*a, *b));
                        }
                    }
                }
                if let Some((a, b)) = o_pair {
                    n_overlap += 1;
                    push(
                        &mut ex_overlap,
                        format!(
                            "{r}: {} (due {}) {} overlaps {} (due {}) {}; {}",
                            plans[i].1,
                            cx.t(plans[i].0),
                            cx.call(a),
                            plans[j].1,
                            cx.t(plans[j].0),
                            cx.call(b),
                            cx.near(b.start_ms.min(a.start_ms))
                        ),
                    );
                }
                if let Some((a, b)) = inv_pair {
                    n_order += 1;
                    push(
                        &mut ex_order,
                        format!(
                            "{r}: {} (due {}) ran {} before earlier {} (due {}) ran {}; {}",
                            plans[j].1,
                            cx.t(plans[j].0),
                            cx.call(b),
                            plans[i].1,
                            cx.t(plans[i].0),
                            cx.call(a),
                            cx.near(b.start_ms)
                        ),
                    );
                }
            }
        }
    }
    checks.push(check(
        "resource: calls of two Plans of one resource overlap",
        true,
        n_overlap,
        ex_overlap,
    ));
    checks.push(check(
        "resource: a later Plan started before an earlier one's last call ended (order)",
        true,
        n_order,
        ex_order,
    ));

    // ---- term Lives -------------------------------------------------------------------
    let (mut n_early, mut n_missing) = (0, 0);
    let (mut ex_early, mut ex_missing) = (Vec::new(), Vec::new());
    for b in o.bookings.iter().filter(|b| b.kind == Kind::Term) {
        let births = cx.calls(&format!("{}:birth", b.id));
        let deaths = cx.calls(&format!("{}:death", b.id));
        if let Some(d) = deaths.first() {
            match births.first() {
                None => {
                    n_early += 1;
                    push(
                        &mut ex_early,
                        format!(
                            "{}: death {} with no birth call; {}",
                            b.id,
                            cx.call(d),
                            cx.near(d.start_ms)
                        ),
                    );
                }
                Some(first_birth) if d.start_ms < first_birth.end_or(now) => {
                    n_early += 1;
                    push(
                        &mut ex_early,
                        format!(
                            "{}: death {} before its birth {} ended; {}",
                            b.id,
                            cx.call(d),
                            cx.call(first_birth),
                            cx.near(d.start_ms)
                        ),
                    );
                }
                _ => {}
            }
        }
        if !births.is_empty() && deaths.is_empty() {
            n_missing += 1;
            let state = match o.lives.get(&b.id) {
                Some(Some(l)) => {
                    let p = plan_of(l, "death").cloned().unwrap_or(Value::Null);
                    format!(
                        "Life {}, death Plan {} attempts {} last_error {}",
                        text(&l["state"]),
                        text(&p["state"]),
                        p["attempts"],
                        text(&p["last_error"])
                    )
                }
                Some(None) => "Life missing (404)".into(),
                None => "Life unreadable".into(),
            };
            push(
                &mut ex_missing,
                format!(
                    "{} (acknowledged: {}) death due {} never called after birth {}: {state}; {}",
                    b.id,
                    b.acked(),
                    cx.t(b.death_ms.unwrap_or(0)),
                    cx.call(births[0]),
                    cx.near(b.death_ms.unwrap_or(0))
                ),
            );
        }
    }
    checks.push(check(
        "term: death called before (or while) its birth ran",
        true,
        n_early,
        ex_early,
    ));
    checks.push(check(
        "term: delivered birth never followed by its death",
        true,
        n_missing,
        ex_missing,
    ));

    // ---- Plans left Running/Preset, or Standby past due ------------------------------
    let (mut n_running, mut n_standby) = (0, 0);
    let (mut ex_running, mut ex_standby) = (Vec::new(), Vec::new());
    for (id, life) in &o.lives {
        let Some(life) = life else { continue };
        for p in life["plans"].as_array().into_iter().flatten() {
            let state = text(&p["state"]);
            let key = format!("{id}:{}", text(&p["kind"]));
            let in_flight = cx.calls(&key).iter().any(|c| c.end_ms.is_none());
            let fire = p["fire_at_ms"].as_i64().unwrap_or(0);
            if matches!(state, "Running" | "Preset") && !in_flight {
                n_running += 1;
                push(
                    &mut ex_running,
                    format!(
                        "{key} {state} held_by {} fire_at {} attempts {} (Life {}), calls {}; {}",
                        text(&p["held_by"]),
                        cx.t(fire),
                        p["attempts"],
                        text(&life["state"]),
                        cx.calls(&key).len(),
                        cx.near(fire)
                    ),
                );
            } else if state == "Standby" && fire < now - 2_000 {
                // A death waits in Standby for its birth only while the birth is unfinished.
                n_standby += 1;
                push(
                    &mut ex_standby,
                    format!(
                        "{key} Standby, due {} (Life {}), calls {}; {}",
                        cx.t(fire),
                        text(&life["state"]),
                        cx.calls(&key).len(),
                        cx.near(fire)
                    ),
                );
            }
        }
    }
    checks.push(check(
        "Plans left Running or Preset at the end with no call in flight",
        true,
        n_running,
        ex_running,
    ));
    checks.push(check(
        "Plans left Standby long past due at the end",
        true,
        n_standby,
        ex_standby,
    ));

    // ---- Plans seen Running with no call in flight ------------------------------------
    // A Plan is Running from its start (just before the call) until its outcome is
    // recorded (just after): a sample is fine when a call of it was in flight within
    // SETTLE_MS of the read, or when its holder was faulted (killed, stopped, Redis away)
    // and the lease has not run out yet; otherwise the Plan is held Running by nobody.
    const SETTLE_MS: i64 = 2_000;
    // Per Plan: the samples that found it Running with nothing to show for it.
    let mut bad: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for s in &o.samples {
        let live = cx
            .calls(&s.key)
            .iter()
            .any(|c| c.start_ms <= s.read_ms + SETTLE_MS && c.end_or(now) + SETTLE_MS >= s.at_ms);
        let excused = o.faults.iter().any(|f| {
            let holder = match f.kind {
                FaultKind::Redis => true,
                _ => f.host_id.as_deref() == Some(s.held_by.as_str()),
            };
            let (from, to) = cx.shadow(f);
            holder && s.at_ms >= from && s.at_ms <= to
        });
        if !live && !excused {
            bad.entry(s.key.as_str()).or_default().push(s);
        }
    }
    let n = bad.len();
    let mut ex = Vec::new();
    for (key, seen) in &bad {
        let (first, last) = (seen[0], seen[seen.len() - 1]);
        push(
            &mut ex,
            format!(
                "{key} Running held_by {} attempts {}, seen {} time(s) {}..{}; calls {}; {}",
                first.held_by,
                first.attempts,
                seen.len(),
                cx.t(first.at_ms),
                cx.t(last.at_ms),
                cx.calls(key)
                    .iter()
                    .map(|c| cx.call(c))
                    .collect::<Vec<_>>()
                    .join(" "),
                cx.near(first.at_ms)
            ),
        );
    }
    checks.push(check(
        "Plans seen Running mid-run with no call in flight (holder not faulted)",
        true,
        n,
        ex,
    ));

    // ---- duplicates and stale runs -------------------------------------------------
    let mut duplicated = 0;
    let mut by_cause: BTreeMap<String, usize> = BTreeMap::new();
    let mut ex_unexplained = Vec::new();
    let mut ex_explained = Vec::new();
    let mut n_stale = 0;
    let mut ex_stale = Vec::new();
    for (key, calls) in &cx.by_key {
        if calls.len() < 2 {
            continue;
        }
        duplicated += 1;
        for (k, c) in calls.iter().enumerate().skip(1) {
            let cause = calls[..k]
                .iter()
                .find_map(|e| cx.explains(e).map(|f| (e, f)));
            match cause {
                Some((e, f)) => {
                    let word = format!("{:?}", f.kind).to_lowercase();
                    *by_cause
                        .entry(format!("in flight at a fault: {word}"))
                        .or_default() += 1;
                    push(
                        &mut ex_explained,
                        format!(
                            "{key}: {} again as {}; {} was in flight",
                            cx.call(e),
                            cx.call(c),
                            cx.fault(f)
                        ),
                    );
                }
                None => {
                    *by_cause.entry("unexplained".into()).or_default() += 1;
                    let earlier: Vec<String> = calls[..k].iter().map(|e| cx.call(e)).collect();
                    push(
                        &mut ex_unexplained,
                        format!(
                            "{key}: {} after {}; {}",
                            cx.call(c),
                            earlier.join(" "),
                            cx.near(c.start_ms)
                        ),
                    );
                }
            }
            // A stale run: by a process after it was stopped, of a Plan another process
            // took over and ran to its end while it was stopped (a takeover whose own
            // run was cut by a fault may be run again by anyone).
            for f in o.faults.iter().filter(|f| f.kind == FaultKind::Stop) {
                if f.instance.as_deref() != Some(c.via.as_str()) || c.start_ms < f.end_ms {
                    continue;
                }
                if let Some(other) = calls[..k].iter().find(|e| {
                    e.via != c.via
                        && e.start_ms >= f.start_ms
                        && e.start_ms <= f.end_ms
                        && cx.explains(e).is_none()
                }) {
                    n_stale += 1;
                    push(
                        &mut ex_stale,
                        format!(
                            "{key}: {} ran it {} after {} took it over; {}",
                            c.via,
                            cx.call(c),
                            cx.call(other),
                            cx.fault(f)
                        ),
                    );
                    break;
                }
            }
        }
    }
    checks.push(check(
        "duplicates unexplained by a fault (re-runs with no run in flight at a fault)",
        true,
        *by_cause.get("unexplained").unwrap_or(&0),
        ex_unexplained,
    ));
    checks.push(check(
        "duplicates of runs in flight at a fault (allowed: at-least-once)",
        false,
        by_cause
            .iter()
            .filter(|(k, _)| *k != "unexplained")
            .map(|(_, n)| n)
            .sum(),
        ex_explained,
    ));
    checks.push(check(
        "stale runs: a stopped host ran a Plan another host had taken over",
        true,
        n_stale,
        ex_stale,
    ));

    // ---- history against calls -------------------------------------------------------
    // Every success a Life's history records is a call the sink answered, made under the
    // same attempt number by a process of the host the record names: an outcome written
    // for a run that never happened, or by a host that did not run it, is a host
    // recording for a Plan it no longer held.
    let host_of: HashMap<&str, &str> = o
        .instances
        .iter()
        .map(|i| (i.label.as_str(), i.host_id.as_str()))
        .collect();
    let (mut n_uncalled, mut n_other_host) = (0, 0);
    let (mut ex_uncalled, mut ex_other_host) = (Vec::new(), Vec::new());
    for (id, life) in &o.lives {
        let Some(life) = life else { continue };
        for r in life["history"].as_array().into_iter().flatten() {
            if r["outcome"] != "success" {
                continue;
            }
            let key = format!("{id}:{}", text(&r["plan"]));
            let attempt = r["attempt"].as_u64().map(|a| a as u32);
            let same: Vec<&&Call> = cx
                .calls(&key)
                .iter()
                .filter(|c| c.execution_count == attempt)
                .collect();
            let at = r["started_at_ms"].as_i64().unwrap_or(0);
            if same.is_empty() {
                n_uncalled += 1;
                push(
                    &mut ex_uncalled,
                    format!(
                        "{key} attempt {} by {} started {}: no call #{}; calls {}; {}",
                        r["attempt"],
                        text(&r["host"]),
                        cx.t(at),
                        r["attempt"],
                        cx.calls(&key)
                            .iter()
                            .map(|c| cx.call(c))
                            .collect::<Vec<_>>()
                            .join(" "),
                        cx.near(at)
                    ),
                );
            } else if !same
                .iter()
                .any(|c| host_of.get(c.via.as_str()).copied() == r["host"].as_str())
            {
                n_other_host += 1;
                push(
                    &mut ex_other_host,
                    format!(
                        "{key} attempt {} recorded by {} but called by {}; {}",
                        r["attempt"],
                        text(&r["host"]),
                        same.iter()
                            .map(|c| cx.call(c))
                            .collect::<Vec<_>>()
                            .join(" "),
                        cx.near(at)
                    ),
                );
            }
        }
    }
    checks.push(check(
        "history: success recorded for a run that never reached the target",
        true,
        n_uncalled,
        ex_uncalled,
    ));
    checks.push(check(
        "history: success recorded by a host other than the one that ran it",
        true,
        n_other_host,
        ex_other_host,
    ));

    // ---- lateness ----------------------------------------------------------------------
    let mut lateness: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut after_kill9 = Vec::new();
    let mut late_by: BTreeMap<String, usize> = BTreeMap::new();
    let mut ex_late: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for b in &o.bookings {
        for (key, word, due) in b.plan_keys() {
            let Some(first) = cx.calls(&key).first() else {
                continue;
            };
            // A death is due at its time, or when its birth ended if that was later.
            let base = if word == "death" {
                let birth_end = cx
                    .calls(&format!("{}:birth", b.id))
                    .iter()
                    .map(|c| c.end_or(now))
                    .max()
                    .unwrap_or(due);
                due.max(birth_end)
            } else {
                due
            };
            let late = first.start_ms - base;
            lateness.entry(word.to_string()).or_default().push(late);
            lateness.entry("all".into()).or_default().push(late);
            let near: Vec<&Fault> = o
                .faults
                .iter()
                .filter(|f| {
                    let (from, to) = cx.shadow(f);
                    base >= from && base <= to
                })
                .collect();
            if near.iter().any(|f| f.kind == FaultKind::Kill9) {
                after_kill9.push(late);
            }
            if late <= o.takeover_ms {
                continue;
            }
            // The most lenient allowance of the faults around (Redis down allows its
            // remaining downtime on top of the takeover time), charged to the most
            // crash-like of them: a Plan stranded by a kill -9 is the kill's even when a
            // Redis restart came by meanwhile.
            let allow = near
                .iter()
                .map(|f| match f.kind {
                    FaultKind::Redis => (f.end_ms - base).max(0) + o.takeover_ms,
                    _ => o.takeover_ms,
                })
                .max()
                .unwrap_or(o.takeover_ms);
            let cat = [
                FaultKind::Kill9,
                FaultKind::Stop,
                FaultKind::Term,
                FaultKind::Redis,
            ]
            .into_iter()
            .find(|k| near.iter().any(|f| f.kind == *k))
            .map(|k| format!("{k:?}").to_lowercase())
            .unwrap_or_else(|| "none".to_string());
            if late > allow {
                *late_by.entry(cat.clone()).or_default() += 1;
                let e = ex_late.entry(cat).or_default();
                if e.len() < EXAMPLES {
                    e.push(format!(
                        "{key} due {} first call {} late {late} ms (allowed {allow}); {}",
                        cx.t(base),
                        cx.call(first),
                        cx.near(base)
                    ));
                }
            }
        }
    }
    for c in o.calls.iter().filter(|c| c.timer.is_some()) {
        if let (Some(eta), true) = (c.eta_ms, c.execution_count == Some(1)) {
            lateness
                .entry("timer".into())
                .or_default()
                .push(c.start_ms - eta);
        }
    }
    for (cat, must) in [
        ("kill9", true),
        ("term", true),
        ("none", true),
        ("stop", false),
        ("redis", false),
    ] {
        checks.push(check(
            &format!(
                "late beyond --takeover-ms {} ms{}",
                o.takeover_ms,
                match cat {
                    "none" => " with no fault near".to_string(),
                    c => format!(", due in the shadow of a {c} fault"),
                }
            ),
            must,
            *late_by.get(cat).unwrap_or(&0),
            ex_late.remove(cat).unwrap_or_default(),
        ));
    }

    // ---- queues: max_concurrent ------------------------------------------------------
    for (queue, max) in QUEUES.iter().filter(|(_, m)| *m > 0) {
        let calls: Vec<&Call> = o
            .calls
            .iter()
            .filter(|c| c.queue.as_deref() == Some(queue))
            .collect();
        let mut n = 0;
        let mut ex = Vec::new();
        for c in &calls {
            let mut others: Vec<&&Call> = calls
                .iter()
                .filter(|d| {
                    d.key() != c.key() && d.start_ms <= c.start_ms && d.end_or(now) > c.start_ms
                })
                .collect();
            others.dedup_by_key(|d| d.key());
            if others.len() as i64 >= *max {
                n += 1;
                let v: Vec<String> = others
                    .iter()
                    .map(|d| format!("{} {}", d.key(), cx.call(d)))
                    .collect();
                push(
                    &mut ex,
                    format!(
                        "{} {} started while {} ran; {}",
                        c.key(),
                        cx.call(c),
                        v.join(", "),
                        cx.near(c.start_ms)
                    ),
                );
            }
        }
        checks.push(check(
            &format!("queue {queue}: more than max_concurrent {max} tasks at once"),
            true,
            n,
            ex,
        ));
    }

    // ---- timers ---------------------------------------------------------------------------
    let mut timer_gap = BTreeMap::new();
    let (mut n_twice, mut n_stalled, mut n_unrun) = (0, 0, 0);
    let (mut ex_twice, mut ex_stalled, mut ex_unrun) = (Vec::new(), Vec::new(), Vec::new());
    for (name, period) in &o.timers {
        let (name, period) = (name.as_str(), *period);
        let mut calls: Vec<&Call> = o
            .calls
            .iter()
            .filter(|c| c.timer.as_deref() == Some(name))
            .collect();
        calls.sort_by_key(|c| c.start_ms);
        for w in calls.windows(2) {
            if w[0].key() != w[1].key() && overlap(w[0], w[1], now) {
                n_twice += 1;
                push(
                    &mut ex_twice,
                    format!(
                        "{name}: {} {} and {} {}; {}",
                        w[0].key(),
                        cx.call(w[0]),
                        w[1].key(),
                        cx.call(w[1]),
                        cx.near(w[1].start_ms)
                    ),
                );
            }
        }
        let gap = calls
            .windows(2)
            .map(|w| w[1].start_ms - w[0].start_ms)
            .max()
            .unwrap_or(0);
        timer_gap.insert(name.to_string(), gap);
        let last = calls.last().map(|c| c.start_ms).unwrap_or(o.start_ms);
        if last < now - (2 * period + o.takeover_ms) {
            n_stalled += 1;
            push(
                &mut ex_stalled,
                format!(
                    "{name}: last call at {} ({} calls), end at {}",
                    cx.t(last),
                    calls.len(),
                    cx.t(now)
                ),
            );
        }
        // Every run the timer recorded as a success was a call the sink saw.
        for r in o.timer_runs.get(name).into_iter().flatten() {
            if r["outcome"] != "success" {
                continue;
            }
            let should = r["should_run_at_ms"]
                .as_i64()
                .or_else(|| r["should_run_at"].as_i64())
                .unwrap_or(0);
            if should < o.start_ms {
                continue;
            }
            if !calls.iter().any(|c| c.eta_ms == Some(should)) {
                n_unrun += 1;
                push(
                    &mut ex_unrun,
                    format!(
                        "{name}: run for {} recorded ({r}) with no call; {}",
                        cx.t(should),
                        cx.near(should)
                    ),
                );
            }
        }
    }
    checks.push(check(
        "timer: two runs of one timer at once",
        true,
        n_twice,
        ex_twice,
    ));
    checks.push(check(
        "timer: not running at the end",
        true,
        n_stalled,
        ex_stalled,
    ));
    checks.push(check(
        "timer: success recorded for a slot never called",
        true,
        n_unrun,
        ex_unrun,
    ));

    // ---- unacknowledged bookings ---------------------------------------------------
    let (mut un_del, mut un_nodel, mut un_none) = (0, 0, 0);
    let mut ex_un = Vec::new();
    for b in o.bookings.iter().filter(|b| !b.acked()) {
        let delivered = !cx.calls(&b.plan_keys()[0].0).is_empty();
        let stored = delivered
            || match b.kind {
                Kind::Task => matches!(o.tasks.get(&b.id), Some(Some(_))),
                _ => matches!(o.lives.get(&b.id), Some(Some(_))),
            };
        match (stored, delivered) {
            (true, true) => un_del += 1,
            (true, false) => {
                un_nodel += 1;
                push(
                    &mut ex_un,
                    format!(
                        "{} {:?} answered {:?} {:?}: stored, not delivered, due {}",
                        b.id,
                        b.kind,
                        b.status,
                        b.error,
                        cx.t(b.birth_ms)
                    ),
                );
            }
            _ => un_none += 1,
        }
    }
    checks.push(check(
        "not acknowledged but stored and never delivered (reported, not a failure)",
        false,
        un_nodel,
        ex_un,
    ));

    // ---- the harness's own findings ------------------------------------------------
    checks.push(check(
        "hosts that exited on their own, would not start or ignored SIGTERM",
        true,
        o.anomalies.len(),
        o.anomalies
            .iter()
            .map(|a| format!("{}: {}", cx.t(a.at_ms), a.what))
            .take(EXAMPLES)
            .collect(),
    ));

    checks.push(check(
        "census: Lives per state counted otherwise than the Lives' own states",
        true,
        o.census_mismatches.len(),
        o.census_mismatches.iter().take(EXAMPLES).cloned().collect(),
    ));

    // ---- summary -------------------------------------------------------------------
    let mut faults = BTreeMap::new();
    for f in &o.faults {
        *faults
            .entry(format!("{:?}", f.kind).to_lowercase())
            .or_default() += 1;
    }
    let mut calls_by_plan = BTreeMap::new();
    for c in &o.calls {
        *calls_by_plan
            .entry(c.plan.clone().unwrap_or_else(|| "?".into()))
            .or_default() += 1;
    }
    let summary = Summary {
        bookings,
        resource_bound_lives: o.bookings.iter().filter(|b| b.resource.is_some()).count(),
        faults,
        calls: o.calls.len(),
        calls_by_plan,
        in_flight_at_end: o.in_flight_at_end,
        duplicated_plans: duplicated,
        extra_calls_by_cause: by_cause,
        lateness: lateness
            .into_iter()
            .map(|(k, v)| (k, Percentiles::of(v)))
            .collect(),
        lateness_after_kill9: Percentiles::of(after_kill9),
        late_by_fault: late_by,
        unacknowledged_stored_delivered: un_del,
        unacknowledged_stored_not_delivered: un_nodel,
        unacknowledged_not_stored: un_none,
        allowed_without_action: allowed,
        timer_max_gap_ms: timer_gap,
    };
    let passed = checks.iter().all(|c| !c.must_be_zero || c.count == 0);
    Report {
        passed,
        start_ms: o.start_ms,
        kairos: o.kairos.clone(),
        summary,
        checks,
        faults: o.faults.clone(),
        instances: o.instances.clone(),
        anomalies: o.anomalies.clone(),
    }
}

/// The report as a person reads it.
pub fn render(r: &Report) -> String {
    use std::fmt::Write;
    let s = &r.summary;
    let mut out = String::new();
    let _ = writeln!(out, "== kairos chaos report ==");
    let _ = writeln!(out, "kairos: {}", r.kairos);
    let _ = writeln!(
        out,
        "bookings (kind: sent / acknowledged / not acknowledged by answer):"
    );
    for (k, b) in &s.bookings {
        let _ = writeln!(
            out,
            "  {k:<16} {:>6} / {:>6} / {:?}",
            b.sent, b.acknowledged, b.refused
        );
    }
    let _ = writeln!(
        out,
        "  not acknowledged: {} stored+delivered, {} stored+not delivered, {} not stored",
        s.unacknowledged_stored_delivered,
        s.unacknowledged_stored_not_delivered,
        s.unacknowledged_not_stored
    );
    let _ = writeln!(out, "faults: {:?}", s.faults);
    for f in &r.faults {
        let _ = writeln!(
            out,
            "  {:?} {} +{:.1}s..+{:.1}s: {}",
            f.kind,
            f.instance.as_deref().unwrap_or("redis"),
            (f.start_ms - r.start_ms) as f64 / 1000.0,
            (f.end_ms - r.start_ms) as f64 / 1000.0,
            f.detail
        );
    }
    let _ = writeln!(
        out,
        "calls: {} {:?}, in flight at the end: {}",
        s.calls, s.calls_by_plan, s.in_flight_at_end
    );
    let _ = writeln!(
        out,
        "duplicates: {} Plans called more than once; extra calls by cause {:?}",
        s.duplicated_plans, s.extra_calls_by_cause
    );
    let _ = writeln!(
        out,
        "lateness ms (first call start - due): n / p50 / p99 / max"
    );
    for (k, p) in &s.lateness {
        let _ = writeln!(
            out,
            "  {k:<8} {:>6} / {:>6} / {:>6} / {:>6}",
            p.n, p.p50, p.p99, p.max
        );
    }
    let p = &s.lateness_after_kill9;
    let _ = writeln!(
        out,
        "  after kill -9: {} / {} / {} / {}; late beyond takeover by fault: {:?}",
        p.n, p.p50, p.p99, p.max, s.late_by_fault
    );
    let _ = writeln!(out, "timer max gap ms: {:?}", s.timer_max_gap_ms);
    if !s.allowed_without_action.is_empty() {
        let _ = writeln!(
            out,
            "ended without action, allowed: {:?}",
            s.allowed_without_action
        );
    }
    let _ = writeln!(out, "checks:");
    for c in &r.checks {
        let mark = match (c.count, c.must_be_zero) {
            (0, _) => "ok  ",
            (_, true) => "FAIL",
            (_, false) => "info",
        };
        let _ = writeln!(out, "  {mark} {:>5}  {}", c.count, c.name);
        if c.count > 0 {
            for e in c.examples.iter().take(4) {
                let _ = writeln!(out, "               {e}");
            }
        }
    }
    let _ = writeln!(
        out,
        "result: {}",
        if r.passed { "PASSED" } else { "FAILED" }
    );
    out
}

#[cfg(test)]
mod tests {
    //! The checker against hand-made observations: each violation it must see, seen.

    use super::*;
    use serde_json::json;

    fn booking(
        id: &str,
        kind: Kind,
        resource: Option<&str>,
        birth: i64,
        death: Option<i64>,
    ) -> Booking {
        Booking {
            id: id.into(),
            kind,
            resource: resource.map(str::to_string),
            queue: None,
            birth_ms: birth,
            death_ms: death,
            sent_ms: 0,
            answered_ms: 1,
            via: "h0.1".into(),
            status: Some(200),
            error: None,
        }
    }

    fn call(seq: usize, key: &str, via: &str, start: i64, end: i64, attempt: u32) -> Call {
        let (life, plan) = key.rsplit_once(':').unwrap();
        Call {
            seq,
            via: via.into(),
            start_ms: start,
            end_ms: Some(end),
            caller_gone: false,
            delay_ms: end - start,
            method: "POST".into(),
            path: "/hook".into(),
            idempotency_key: Some(key.into()),
            life: Some(life.into()),
            plan: Some(plan.into()),
            eta_ms: None,
            execution_count: Some(attempt),
            resource: None,
            timer: None,
            queue: None,
            task: None,
        }
    }

    fn fault(kind: FaultKind, instance: Option<&str>, start: i64, end: i64) -> Fault {
        Fault {
            kind,
            slot: instance.map(|_| 0),
            instance: instance.map(str::to_string),
            host_id: None,
            start_ms: start,
            end_ms: end,
            replacement: None,
            same_id: None,
            exited_ms: None,
            detail: String::new(),
        }
    }

    fn observed(bookings: Vec<Booking>, calls: Vec<Call>, faults: Vec<Fault>) -> Observed {
        let lives = bookings
            .iter()
            .filter(|b| b.kind != Kind::Task)
            .map(|b| {
                (
                    b.id.clone(),
                    Some(json!({"state": "Dead", "plans": [], "history": []})),
                )
            })
            .collect();
        Observed {
            bookings,
            calls,
            faults,
            instances: Vec::new(),
            anomalies: Vec::new(),
            lives,
            tasks: HashMap::new(),
            timers: Vec::new(),
            timer_runs: HashMap::new(),
            start_ms: 0,
            load_end_ms: 50_000,
            end_ms: 100_000,
            takeover_ms: 6_000,
            lease_ms: 4_000,
            birth_delay_limit_ms: 180_000,
            in_flight_at_end: 0,
            samples: Vec::new(),
            kairos: String::new(),
            census_mismatches: Vec::new(),
        }
    }

    fn count(r: &Report, prefix: &str) -> usize {
        r.checks
            .iter()
            .find(|c| c.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no check {prefix}"))
            .count
    }

    #[test]
    fn a_clean_run_passes() {
        let r = check_all(&observed(
            vec![booking("a", Kind::Term, Some("r"), 1_000, Some(3_000))],
            vec![
                call(0, "a:birth", "h0.1", 1_001, 1_100, 1),
                call(1, "a:death", "h1.1", 3_002, 3_200, 1),
            ],
            vec![],
        ));
        assert!(r.passed, "{}", render(&r));
    }

    #[test]
    fn a_census_that_differs_from_the_lives_fails_the_run() {
        let mut o = observed(
            vec![booking("a", Kind::Point, None, 1_000, None)],
            vec![call(0, "a:birth", "h0.1", 1_001, 1_100, 1)],
            vec![],
        );
        assert!(check_all(&o).passed);
        o.census_mismatches = vec!["Dead: census 0, Lives 1".into()];
        let r = check_all(&o);
        assert!(!r.passed, "{}", render(&r));
        assert_eq!(count(&r, "census:"), 1);
    }

    #[test]
    fn each_violation_is_counted() {
        let bookings = vec![
            // Lost: acknowledged, Dead, never called.
            booking("lost", Kind::Point, None, 1_000, None),
            // One resource: a's death runs after b's birth started (order), c overlaps d.
            booking("a", Kind::Term, Some("r"), 1_000, Some(3_000)),
            booking("b", Kind::Term, Some("r"), 5_000, Some(7_000)),
            booking("c", Kind::Point, Some("s"), 1_000, None),
            booking("d", Kind::Point, Some("s"), 3_000, None),
            // A term whose birth ran and death never did.
            booking("e", Kind::Term, None, 1_000, Some(2_000)),
            // Run twice at once; run again with nothing in flight at a fault.
            booking("f", Kind::Point, None, 1_000, None),
            booking("g", Kind::Point, None, 1_000, None),
            // Run again after its first run's host was killed: allowed.
            booking("h", Kind::Point, None, 1_000, None),
            // Due while a host was down after a kill -9, run 10 s late.
            booking("i", Kind::Point, None, 20_500, None),
        ];
        let calls = vec![
            call(0, "a:birth", "h0.1", 1_000, 1_100, 1),
            call(1, "b:birth", "h1.1", 5_000, 5_050, 1),
            call(2, "a:death", "h2.1", 5_100, 5_200, 1),
            call(3, "b:death", "h1.1", 7_000, 7_100, 1),
            call(4, "c:birth", "h0.1", 1_000, 3_500, 1),
            call(5, "d:birth", "h1.1", 3_000, 3_100, 1),
            call(6, "e:birth", "h0.1", 1_000, 1_100, 1),
            call(7, "f:birth", "h0.1", 1_000, 1_200, 1),
            call(8, "f:birth", "h1.1", 1_100, 1_300, 2),
            call(9, "g:birth", "h0.1", 1_000, 1_100, 1),
            call(10, "g:birth", "h1.1", 30_000, 30_100, 2),
            call(11, "h:birth", "h2.1", 1_000, 1_200, 1),
            call(12, "h:birth", "h1.1", 6_000, 6_100, 2),
            call(13, "i:birth", "h1.1", 30_500, 30_600, 1),
        ];
        let faults = vec![fault(FaultKind::Kill9, Some("h2.1"), 1_100, 20_000)];
        let r = check_all(&observed(bookings, calls, faults));
        assert!(!r.passed);
        assert_eq!(count(&r, "lost"), 1, "{}", render(&r));
        assert_eq!(count(&r, "resource: a later Plan"), 1, "{}", render(&r));
        assert_eq!(
            count(&r, "resource: calls of two Plans"),
            1,
            "{}",
            render(&r)
        );
        assert_eq!(
            count(&r, "term: delivered birth never"),
            1,
            "{}",
            render(&r)
        );
        assert_eq!(count(&r, "concurrent double runs"), 1, "{}", render(&r));
        // f's second call overlaps its first with no fault; g's comes 29 s after.
        assert_eq!(count(&r, "duplicates unexplained"), 2, "{}", render(&r));
        assert_eq!(
            count(&r, "duplicates of runs in flight"),
            1,
            "{}",
            render(&r)
        );
        assert_eq!(
            count(
                &r,
                "late beyond --takeover-ms 6000 ms, due in the shadow of a kill9"
            ),
            1,
            "{}",
            render(&r)
        );
    }

    #[test]
    fn a_stopped_host_running_a_taken_over_plan_is_stale() {
        let r = check_all(&observed(
            vec![booking("a", Kind::Point, None, 10_000, None)],
            vec![
                call(0, "a:birth", "h1.1", 14_000, 14_100, 1),
                call(1, "a:birth", "h0.1", 20_000, 20_100, 1),
            ],
            vec![fault(FaultKind::Stop, Some("h0.1"), 9_000, 19_990)],
        ));
        assert_eq!(count(&r, "stale runs"), 1, "{}", render(&r));
        assert_eq!(count(&r, "duplicates unexplained"), 1, "{}", render(&r));
    }

    #[test]
    fn a_host_stopped_long_ago_may_take_over_a_killed_hosts_plan() {
        let r = check_all(&observed(
            vec![booking("a", Kind::Point, None, 23_000, None)],
            vec![
                call(0, "a:birth", "h0.1", 23_000, 23_500, 1),
                call(1, "a:birth", "h2.1", 27_500, 27_800, 2),
            ],
            vec![
                fault(FaultKind::Stop, Some("h2.1"), 2_900, 11_300),
                fault(FaultKind::Kill9, Some("h0.1"), 23_400, 25_500),
            ],
        ));
        assert!(r.passed, "{}", render(&r));
        assert_eq!(
            count(&r, "duplicates of runs in flight"),
            1,
            "{}",
            render(&r)
        );
    }

    #[test]
    fn a_plan_running_with_no_call_and_no_fault_is_seen() {
        let sample = |key: &str, held_by: &str, at_ms: i64| Sample {
            at_ms,
            read_ms: at_ms + 5,
            key: key.into(),
            held_by: held_by.into(),
            attempts: 1,
        };
        let mut o = observed(
            vec![
                booking("a", Kind::Point, None, 10_000, None),
                booking("b", Kind::Point, None, 10_000, None),
                booking("c", Kind::Point, None, 10_000, None),
            ],
            vec![
                call(0, "a:birth", "h0.1", 10_000, 10_200, 1),
                call(1, "b:birth", "h0.1", 10_000, 10_200, 1),
                call(2, "c:birth", "h1.1", 10_000, 10_200, 1),
            ],
            vec![Fault {
                host_id: Some("chaos-h1".into()),
                ..fault(FaultKind::Kill9, Some("h1.1"), 10_100, 12_000)
            }],
        );
        o.samples = vec![
            // In flight: fine.
            sample("a:birth", "chaos-h0", 10_100),
            // 20 s after its call, held by a host nothing happened to.
            sample("b:birth", "chaos-h0", 30_000),
            // Its holder was killed 3 s ago: the lease has not run out.
            sample("c:birth", "chaos-h1", 13_000),
        ];
        let r = check_all(&o);
        assert_eq!(count(&r, "Plans seen Running mid-run"), 1, "{}", render(&r));
    }
}
