//! Prometheus metrics of one host, served at `/metrics` in the text exposition format.
//!
//! Counters and gauges are plain atomics updated on the hot paths (no locks); the
//! lateness histogram has fixed buckets. Cluster-wide figures that live in Redis (Plans
//! due, hosts alive) are read at scrape time. The API's requests are counted in
//! [`http`], and the `process_*` series of every Prometheus client come from [`process`].

pub mod http;
pub mod process;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::model::PlanKind;

/// Upper bounds (seconds) of the fire-lateness histogram buckets.
const LATENESS_BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// Upper bounds (seconds) of the run-duration histogram buckets.
const DURATION_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Action labels of `kairos_run_duration_seconds`.
const ACTIONS: [&str; 2] = ["webhook", "plugin"];

/// Reason labels of `kairos_retries_total` (see [`retry_reason`]).
const RETRY_REASONS: [&str; 6] = [
    "connect_or_timeout",
    "rate_limited",
    "server_error",
    "status",
    "plugin",
    "error",
];

/// Why a run is retried, from its answer: no answer in time or no connection (599), a
/// 429, another 5xx, another status in the retry codes, a plugin's retryable error, or an
/// error without a status (a queue task's failed plugin or bad action).
pub fn retry_reason(status: Option<u16>, plugin_retryable: bool) -> &'static str {
    match status {
        Some(599) => "connect_or_timeout",
        Some(429) => "rate_limited",
        Some(500..=599) => "server_error",
        Some(_) => "status",
        None if plugin_retryable => "plugin",
        None => "error",
    }
}

/// Plan labels of `kairos_runs_total` counted without a name: a Life's birth or death.
/// A timer's and a queue task's runs carry the timer's or queue's name beside
/// (`plan="timer",timer=…` and `plan="task",queue=…`).
const PLANS: [&str; 2] = ["birth", "death"];

/// Most timers, and most queues, given series of their own in `kairos_runs_total`: their
/// names are the clients', and the bound keeps a scrape small however many there are.
/// Runs of the names past it are counted under [`OTHER_NAME`].
const NAMED_SERIES_MAX: usize = 500;

/// The `timer` or `queue` label of runs past [`NAMED_SERIES_MAX`] names.
const OTHER_NAME: &str = "_other";

/// Run counts by outcome of each timer's or queue's name, at most [`NAMED_SERIES_MAX`].
#[derive(Default)]
struct NamedRuns(BTreeMap<String, [u64; OUTCOMES.len()]>);

impl NamedRuns {
    fn count(&mut self, name: &str, outcome: usize) {
        if let Some(counts) = self.0.get_mut(name) {
            counts[outcome] += 1;
            return;
        }
        let name = if self.0.len() < NAMED_SERIES_MAX {
            name
        } else {
            OTHER_NAME
        };
        self.0.entry(name.to_string()).or_default()[outcome] += 1;
    }
}

/// Outcomes a run is counted under (the words of the Plan's history).
/// `expired`: a queue task dropped because its first attempt missed its `expire_after`.
/// `skipped`: a timer slot not run because it could not start within its deadline.
/// `cancelled`: a timer run cut off by its next slot (`overlap: cancel_running`).
const OUTCOMES: [&str; 7] = [
    "success",
    "retry",
    "failed",
    "invalidated",
    "expired",
    "skipped",
    "cancelled",
];

/// Most plugins given a series of their own in `kairos_plugin_invocation_seconds`:
/// plugin names are the operator's (uploaded), but the bound keeps a scrape small even
/// with many of them. Invocations of plugins past it are not timed per plugin (the
/// `kairos_run_duration_seconds{action="plugin"}` histogram still counts them).
const PLUGIN_SERIES_MAX: usize = 500;

/// One histogram over [`DURATION_BUCKETS`]: cumulative bucket counts, count, sum.
#[derive(Default, Clone)]
struct Timings {
    buckets: [u64; DURATION_BUCKETS.len()],
    count: u64,
    sum_us: u64,
}

impl Timings {
    fn observe(&mut self, us: u64) {
        let secs = us as f64 / 1e6;
        for (bound, bucket) in DURATION_BUCKETS.iter().zip(&mut self.buckets) {
            if secs <= *bound {
                *bucket += 1;
            }
        }
        self.count += 1;
        self.sum_us += us;
    }
}

/// The host's metrics.
#[derive(Default)]
pub struct Metrics {
    /// Bookings accepted by `POST /schedules` and `/defer`.
    pub bookings_accepted: AtomicU64,
    /// Requests refused with a 4xx by the booking routes.
    pub bookings_refused: AtomicU64,
    /// Runs of Lives by plan (birth, death) and outcome.
    runs: [[AtomicU64; OUTCOMES.len()]; PLANS.len()],
    /// Runs of timers and of queue tasks by name and outcome.
    timer_runs: Mutex<NamedRuns>,
    task_runs: Mutex<NamedRuns>,
    /// Fire lateness (start of the run − its fire time): cumulative bucket counts.
    lateness_buckets: [AtomicU64; LATENESS_BUCKETS.len()],
    lateness_count: AtomicU64,
    lateness_sum_us: AtomicU64,
    /// Plans taken back from hosts whose lease expired.
    pub plans_reclaimed: AtomicU64,
    /// Shards this host took over from another host whose lease had run out.
    pub shard_takeovers: AtomicU64,
    /// Runs that sent nothing (more) because this host's lease lapsed (`actions::Fence`).
    pub fenced_runs: AtomicU64,
    /// Run durations by action kind: cumulative bucket counts, count, sum.
    duration_buckets: [[AtomicU64; DURATION_BUCKETS.len()]; ACTIONS.len()],
    duration_count: [AtomicU64; ACTIONS.len()],
    duration_sum_us: [AtomicU64; ACTIONS.len()],
    /// Retries by reason.
    retries: [AtomicU64; RETRY_REASONS.len()],
    /// Plugin invocation times by plugin name (without its `@version`).
    plugin_timings: Mutex<BTreeMap<String, Timings>>,
    /// The API's requests by route, method and status.
    pub http: http::HttpMetrics,
}

fn kind_index(kind: PlanKind) -> usize {
    match kind {
        PlanKind::Birth => 0,
        PlanKind::Death => 1,
    }
}

impl Metrics {
    /// Counts one run and, for runs that started, its lateness.
    pub fn record_run(&self, kind: PlanKind, outcome: &str, lateness_ms: Option<i64>) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.runs[kind_index(kind)][i].fetch_add(1, Ordering::Relaxed);
        }
        self.record_lateness(lateness_ms);
    }

    /// Times one run of an action (`webhook` or `plugin`; anything else is not counted).
    pub fn record_duration(&self, action: &str, ms: i64) {
        let Some(a) = ACTIONS.iter().position(|x| *x == action) else {
            return;
        };
        let secs = ms.max(0) as f64 / 1000.0;
        for (bound, bucket) in DURATION_BUCKETS.iter().zip(&self.duration_buckets[a]) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.duration_count[a].fetch_add(1, Ordering::Relaxed);
        self.duration_sum_us[a].fetch_add(ms.max(0) as u64 * 1000, Ordering::Relaxed);
    }

    /// Times one invocation of a plugin (`name` or `name@version`; counted under the
    /// name), from resolving its version to its answer.
    pub fn record_plugin_invocation(&self, spec: &str, elapsed: std::time::Duration) {
        let name = spec.split('@').next().unwrap_or(spec);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let mut timings = self
            .plugin_timings
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(t) = timings.get_mut(name) {
            t.observe(us);
        } else if timings.len() < PLUGIN_SERIES_MAX {
            timings.entry(name.to_string()).or_default().observe(us);
        }
    }

    /// Counts one retry, by its reason ([`retry_reason`]).
    pub fn record_retry(&self, reason: &str) {
        if let Some(i) = RETRY_REASONS.iter().position(|r| *r == reason) {
            self.retries[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one run of a timer, with its lateness.
    pub fn record_timer_run(&self, timer: &str, outcome: &str, lateness_ms: i64) {
        count_named(&self.timer_runs, timer, outcome);
        self.record_lateness(Some(lateness_ms));
    }

    /// Counts one run of a queue's task. No lateness: a task's start also waits for its
    /// queue's rate and concurrency, which is not the engine being late.
    pub fn record_task_run(&self, queue: &str, outcome: &str) {
        count_named(&self.task_runs, queue, outcome);
    }

    fn record_lateness(&self, lateness_ms: Option<i64>) {
        if let Some(ms) = lateness_ms {
            let secs = ms.max(0) as f64 / 1000.0;
            for (bound, bucket) in LATENESS_BUCKETS.iter().zip(&self.lateness_buckets) {
                if secs <= *bound {
                    bucket.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.lateness_count.fetch_add(1, Ordering::Relaxed);
            self.lateness_sum_us
                .fetch_add(ms.max(0) as u64 * 1000, Ordering::Relaxed);
        }
    }

    /// The exposition text; `gauges` and `counters` are name, help and value of figures
    /// read at scrape time.
    pub fn render(&self, gauges: &[(&str, &str, f64)], counters: &[(&str, &str, u64)]) -> String {
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP kairos_bookings_total Bookings by result (accepted, or refused with a 4xx)."
        );
        let _ = writeln!(out, "# TYPE kairos_bookings_total counter");
        let _ = writeln!(
            out,
            "kairos_bookings_total{{result=\"accepted\"}} {}",
            get(&self.bookings_accepted)
        );
        let _ = writeln!(
            out,
            "kairos_bookings_total{{result=\"refused\"}} {}",
            get(&self.bookings_refused)
        );
        let _ = writeln!(
            out,
            "# HELP kairos_runs_total Action runs on this host by Plan kind and outcome."
        );
        let _ = writeln!(out, "# TYPE kairos_runs_total counter");
        for (k, kind) in PLANS.iter().enumerate() {
            for (o, outcome) in OUTCOMES.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "kairos_runs_total{{plan=\"{kind}\",outcome=\"{outcome}\"}} {}",
                    get(&self.runs[k][o])
                );
            }
        }
        for (plan, label, runs) in [
            ("timer", "timer", &self.timer_runs),
            ("task", "queue", &self.task_runs),
        ] {
            let runs = runs.lock().unwrap_or_else(|e| e.into_inner());
            for (name, counts) in &runs.0 {
                let name = label_value(name);
                for (outcome, n) in OUTCOMES.iter().zip(counts) {
                    let _ = writeln!(
                        out,
                        "kairos_runs_total{{plan=\"{plan}\",{label}=\"{name}\",outcome=\"{outcome}\"}} {n}"
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP kairos_fire_lateness_seconds Start of a run minus its fire time."
        );
        let _ = writeln!(out, "# TYPE kairos_fire_lateness_seconds histogram");
        for (bound, bucket) in LATENESS_BUCKETS.iter().zip(&self.lateness_buckets) {
            let _ = writeln!(
                out,
                "kairos_fire_lateness_seconds_bucket{{le=\"{bound}\"}} {}",
                get(bucket)
            );
        }
        let count = get(&self.lateness_count);
        let _ = writeln!(
            out,
            "kairos_fire_lateness_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "kairos_fire_lateness_seconds_sum {}",
            get(&self.lateness_sum_us) as f64 / 1e6
        );
        let _ = writeln!(out, "kairos_fire_lateness_seconds_count {count}");
        let _ = writeln!(
            out,
            "# HELP kairos_run_duration_seconds How long an action's call took, by action kind."
        );
        let _ = writeln!(out, "# TYPE kairos_run_duration_seconds histogram");
        for (a, action) in ACTIONS.iter().enumerate() {
            for (bound, bucket) in DURATION_BUCKETS.iter().zip(&self.duration_buckets[a]) {
                let _ = writeln!(
                    out,
                    "kairos_run_duration_seconds_bucket{{action=\"{action}\",le=\"{bound}\"}} {}",
                    get(bucket)
                );
            }
            let count = get(&self.duration_count[a]);
            let _ = writeln!(
                out,
                "kairos_run_duration_seconds_bucket{{action=\"{action}\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(
                out,
                "kairos_run_duration_seconds_sum{{action=\"{action}\"}} {}",
                get(&self.duration_sum_us[a]) as f64 / 1e6
            );
            let _ = writeln!(
                out,
                "kairos_run_duration_seconds_count{{action=\"{action}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP kairos_plugin_invocation_seconds How long one invocation of a plugin took on this host (resolving its version, instantiating and running it), by plugin name."
        );
        let _ = writeln!(out, "# TYPE kairos_plugin_invocation_seconds histogram");
        let timings = self
            .plugin_timings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (name, t) in &timings {
            let p = label_value(name);
            for (bound, bucket) in DURATION_BUCKETS.iter().zip(&t.buckets) {
                let _ = writeln!(
                    out,
                    "kairos_plugin_invocation_seconds_bucket{{plugin=\"{p}\",le=\"{bound}\"}} {bucket}"
                );
            }
            let _ = writeln!(
                out,
                "kairos_plugin_invocation_seconds_bucket{{plugin=\"{p}\",le=\"+Inf\"}} {}",
                t.count
            );
            let _ = writeln!(
                out,
                "kairos_plugin_invocation_seconds_sum{{plugin=\"{p}\"}} {}",
                t.sum_us as f64 / 1e6
            );
            let _ = writeln!(
                out,
                "kairos_plugin_invocation_seconds_count{{plugin=\"{p}\"}} {}",
                t.count
            );
        }
        let _ = writeln!(
            out,
            "# HELP kairos_retries_total Runs that will be retried, by reason."
        );
        let _ = writeln!(out, "# TYPE kairos_retries_total counter");
        for (r, reason) in RETRY_REASONS.iter().enumerate() {
            let _ = writeln!(
                out,
                "kairos_retries_total{{reason=\"{reason}\"}} {}",
                get(&self.retries[r])
            );
        }
        let _ = writeln!(
            out,
            "# HELP kairos_plans_reclaimed_total Plans taken back from hosts whose lease expired."
        );
        let _ = writeln!(out, "# TYPE kairos_plans_reclaimed_total counter");
        let _ = writeln!(
            out,
            "kairos_plans_reclaimed_total {}",
            get(&self.plans_reclaimed)
        );
        let _ = writeln!(
            out,
            "# HELP kairos_shard_takeovers_total Shards this host took over from a host whose lease had run out.\n# TYPE kairos_shard_takeovers_total counter\nkairos_shard_takeovers_total {}",
            get(&self.shard_takeovers)
        );
        let _ = writeln!(
            out,
            "# HELP kairos_fenced_runs_total Runs that sent no request, or no further one, because this host's lease had lapsed (another host runs them).\n# TYPE kairos_fenced_runs_total counter\nkairos_fenced_runs_total {}",
            get(&self.fenced_runs)
        );
        for (name, help, value) in gauges {
            write_series(&mut out, name, help, "gauge", value);
        }
        for (name, help, value) in counters {
            write_series(&mut out, name, help, "counter", value);
        }
        self.http.render(&mut out);
        process::render(&mut out);
        out
    }
}

/// One series without labels, with its HELP and TYPE lines.
pub(crate) fn write_series(
    out: &mut String,
    name: &str,
    help: &str,
    kind: &str,
    value: impl std::fmt::Display,
) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

fn count_named(runs: &Mutex<NamedRuns>, name: &str, outcome: &str) {
    if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
        runs.lock()
            .unwrap_or_else(|e| e.into_inner())
            .count(name, i);
    }
}

/// A label value as the exposition format quotes it.
pub fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_a_cumulative_histogram() {
        let m = Metrics::default();
        m.record_run(PlanKind::Birth, "success", Some(3));
        m.record_run(PlanKind::Birth, "success", Some(40));
        m.record_run(PlanKind::Death, "retry", Some(0));
        m.record_run(PlanKind::Birth, "invalidated", None);
        m.record_timer_run("tick", "failed", 2);
        m.record_task_run("mail", "retry");
        m.record_duration("webhook", 30);
        m.record_duration("plugin", 2_000);
        m.record_duration("", 5);
        m.record_plugin_invocation("echo@2", std::time::Duration::from_millis(30));
        m.record_plugin_invocation("echo", std::time::Duration::from_millis(3));
        m.record_retry(retry_reason(Some(503), false));
        m.record_retry(retry_reason(Some(599), false));
        m.record_retry(retry_reason(None, true));
        let text = m.render(
            &[
                ("kairos_due_plans", "Plans waiting.", 7.0),
                ("kairos_age_seconds", "An age.", 1.5),
            ],
            &[("kairos_things_total", "Things.", 3)],
        );
        assert!(text.contains("kairos_runs_total{plan=\"birth\",outcome=\"success\"} 2\n"));
        assert!(text.contains("kairos_runs_total{plan=\"death\",outcome=\"retry\"} 1\n"));
        assert!(text.contains("kairos_runs_total{plan=\"birth\",outcome=\"invalidated\"} 1\n"));
        assert!(text
            .contains("kairos_runs_total{plan=\"timer\",timer=\"tick\",outcome=\"failed\"} 1\n"));
        assert!(
            text.contains("kairos_runs_total{plan=\"task\",queue=\"mail\",outcome=\"retry\"} 1\n")
        );
        assert!(text
            .contains("kairos_runs_total{plan=\"task\",queue=\"mail\",outcome=\"success\"} 0\n"));
        assert!(text
            .contains("kairos_run_duration_seconds_bucket{action=\"webhook\",le=\"0.025\"} 0\n"));
        assert!(
            text.contains("kairos_run_duration_seconds_bucket{action=\"webhook\",le=\"0.05\"} 1\n")
        );
        assert!(text.contains("kairos_run_duration_seconds_count{action=\"plugin\"} 1\n"));
        assert!(text.contains("kairos_run_duration_seconds_sum{action=\"plugin\"} 2\n"));
        assert!(text
            .contains("kairos_plugin_invocation_seconds_bucket{plugin=\"echo\",le=\"0.005\"} 1\n"));
        assert!(text
            .contains("kairos_plugin_invocation_seconds_bucket{plugin=\"echo\",le=\"0.05\"} 2\n"));
        assert!(text.contains("kairos_plugin_invocation_seconds_count{plugin=\"echo\"} 2\n"));
        assert!(text.contains("kairos_plugin_invocation_seconds_sum{plugin=\"echo\"} 0.033\n"));
        assert!(text.contains("kairos_retries_total{reason=\"server_error\"} 1\n"));
        assert!(text.contains("kairos_retries_total{reason=\"connect_or_timeout\"} 1\n"));
        assert!(text.contains("kairos_retries_total{reason=\"plugin\"} 1\n"));
        assert!(text.contains("kairos_retries_total{reason=\"rate_limited\"} 0\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_bucket{le=\"0.005\"} 3\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_bucket{le=\"0.05\"} 4\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_count 4\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_sum 0.045\n"));
        assert!(text.contains("# TYPE kairos_due_plans gauge\nkairos_due_plans 7\n"));
        assert!(text.contains("kairos_age_seconds 1.5\n"));
        assert!(text.contains("# TYPE kairos_things_total counter\nkairos_things_total 3\n"));
    }

    #[test]
    fn timer_and_queue_names_are_bounded_and_quoted() {
        let m = Metrics::default();
        for i in 0..NAMED_SERIES_MAX + 20 {
            m.record_task_run(&format!("q{i}"), "success");
        }
        m.record_task_run("q0", "failed");
        m.record_timer_run("say \"hi\"", "success", 0);
        let text = m.render(&[], &[]);
        let task_series = text
            .lines()
            .filter(|l| l.starts_with("kairos_runs_total{plan=\"task\""))
            .count();
        assert_eq!(task_series, (NAMED_SERIES_MAX + 1) * OUTCOMES.len());
        assert!(text.contains(
            "kairos_runs_total{plan=\"task\",queue=\"_other\",outcome=\"success\"} 20\n"
        ));
        assert!(
            text.contains("kairos_runs_total{plan=\"task\",queue=\"q0\",outcome=\"failed\"} 1\n")
        );
        assert!(text.contains(
            "kairos_runs_total{plan=\"timer\",timer=\"say \\\"hi\\\"\",outcome=\"success\"} 1\n"
        ));
    }
}
