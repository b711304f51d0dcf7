//! The chaos suite, short: three hosts on one redis-server under a steady booking load
//! for 75 s while every kind of fault happens (kill -9, SIGTERM, SIGSTOP longer than the
//! lease, redis-server killed and restarted), then the checker of `kairos_e2e::chaos`.
//! The whole test takes at most about 3 minutes. The long run is the `kairos-chaos`
//! binary (`--duration 10m`, any `--seed`).

use kairos_e2e::chaos::check::render;
use kairos_e2e::chaos::{run, ChaosConfig, FaultKind};
use kairos_e2e::shared_data_dir;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_chaos_run_with_every_fault_kind_is_clean() {
    let seed = std::env::var("KAIROS_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_123);
    let report_file = shared_data_dir().join("../chaos-report.json");
    let cfg = ChaosConfig {
        duration_ms: 75_000,
        seed,
        fault_every_ms: 6_000,
        faults: FaultKind::ALL.to_vec(),
        tail_ms: 10_000,
        drain_max_ms: Some(70_000),
        report: Some(report_file.clone()),
        ..ChaosConfig::default()
    };
    let report = run(&cfg).await;
    let text = render(&report);
    eprintln!("{text}");
    let missing: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| !report.faults.iter().any(|f| f.kind == *k))
        .collect();
    assert!(
        missing.is_empty(),
        "seed {seed}: the schedule left out {missing:?}\n{text}"
    );
    assert!(
        report.passed,
        "seed {seed} (KAIROS_CHAOS_SEED reruns it; JSON in {}): {} check(s) failed:\n{}",
        report_file.display(),
        report.failures().len(),
        text
    );
}
