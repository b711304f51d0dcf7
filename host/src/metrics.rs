//! Prometheus metrics of one host, served at `/metrics` in the text exposition format.
//!
//! Counters and gauges are plain atomics updated on the hot paths (no locks); the
//! lateness histogram has fixed buckets. Cluster-wide figures that live in Redis (Plans
//! due, hosts alive) are read at scrape time.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::PlanKind;

/// Upper bounds (seconds) of the fire-lateness histogram buckets.
const LATENESS_BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// Plan labels of `kairos_runs_total`: a Life's birth or death, a timer's run, a queue
/// task's run.
const PLANS: [&str; 4] = ["birth", "death", "timer", "task"];

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

/// The host's metrics.
#[derive(Default)]
pub struct Metrics {
    /// Bookings accepted by `POST /schedules` and `/defer`.
    pub bookings_accepted: AtomicU64,
    /// Requests refused with a 4xx by the booking routes.
    pub bookings_refused: AtomicU64,
    /// Runs by plan (birth, death, timer, task) and outcome.
    runs: [[AtomicU64; OUTCOMES.len()]; PLANS.len()],
    /// Fire lateness (start of the run − its fire time): cumulative bucket counts.
    lateness_buckets: [AtomicU64; LATENESS_BUCKETS.len()],
    lateness_count: AtomicU64,
    lateness_sum_us: AtomicU64,
    /// Plans taken back from hosts whose lease expired.
    pub plans_reclaimed: AtomicU64,
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
        self.record_plan_run(kind_index(kind), outcome, lateness_ms);
    }

    /// Counts one run of a timer, with its lateness.
    pub fn record_timer_run(&self, outcome: &str, lateness_ms: i64) {
        self.record_plan_run(2, outcome, Some(lateness_ms));
    }

    /// Counts one run of a queue task. No lateness: a task's start also waits for its
    /// queue's rate and concurrency, which is not the engine being late.
    pub fn record_task_run(&self, outcome: &str) {
        self.record_plan_run(3, outcome, None);
    }

    fn record_plan_run(&self, plan: usize, outcome: &str, lateness_ms: Option<i64>) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.runs[plan][i].fetch_add(1, Ordering::Relaxed);
        }
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
            "# HELP kairos_plans_reclaimed_total Plans taken back from hosts whose lease expired."
        );
        let _ = writeln!(out, "# TYPE kairos_plans_reclaimed_total counter");
        let _ = writeln!(
            out,
            "kairos_plans_reclaimed_total {}",
            get(&self.plans_reclaimed)
        );
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {value}");
        }
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {value}");
        }
        out
    }
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
        m.record_timer_run("failed", 2);
        m.record_task_run("retry");
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
        assert!(text.contains("kairos_runs_total{plan=\"timer\",outcome=\"failed\"} 1\n"));
        assert!(text.contains("kairos_runs_total{plan=\"task\",outcome=\"retry\"} 1\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_bucket{le=\"0.005\"} 3\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_bucket{le=\"0.05\"} 4\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_count 4\n"));
        assert!(text.contains("kairos_fire_lateness_seconds_sum 0.045\n"));
        assert!(text.contains("# TYPE kairos_due_plans gauge\nkairos_due_plans 7\n"));
        assert!(text.contains("kairos_age_seconds 1.5\n"));
        assert!(text.contains("# TYPE kairos_things_total counter\nkairos_things_total 3\n"));
    }
}
