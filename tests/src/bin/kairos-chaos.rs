//! kairos-chaos: three kairos hosts on one redis-server under a steady booking load while
//! a seeded schedule kills, terminates and stops hosts and restarts Redis; then checks
//! that nothing acknowledged was lost, nothing ran twice at once, resources kept their
//! order, and takeover after a kill -9 stayed within its bound. Prints a report, writes
//! it as JSON with --report, exits 1 when a must-be-zero count is not zero.
//!
//! ```sh
//! KAIROS_BIN=target/debug/kairos cargo run -p kairos-e2e --bin kairos-chaos -- \
//!     --duration 120s --seed 7 --faults kill9,term,stop,redis --report chaos.json
//! ```

use std::path::PathBuf;

use kairos_e2e::chaos::{parse_duration_ms, run, ChaosConfig, FaultKind};

const USAGE: &str = "kairos-chaos [flags]
  --duration D       load time (default 60s; D is ms or 500ms/30s/3m)
  --seed N           seed of the load, the faults and the sink's delays (default 1)
  --hosts N          kairos hosts (default 3)
  --lease D          --lease-ttl for the hosts (default: the host's own default)
  --fault-every D    mean time between faults (default 15s)
  --faults LIST      kinds, comma separated: kill9,term,stop,redis (default all; '' none)
  --takeover-ms N    lateness bound after a kill -9 (default 6000)
  --tail D           how far past the load's end bookings may be due (default 15s)
  --drain-max D      longest wait for delivery after the load (default: as needed)
  --resources N      resources the resource-bound Lives use (default 6)
  --host-flag F      one more `kairos serve` argument (repeat: --host-flag --workers --host-flag 16)
  --report FILE      write the JSON report there
  --keep             keep the data directory (host logs, Redis files, observed.json)
  --recheck FILE     run no processes: check again the observed.json a --keep run left
The kairos binary is $KAIROS_BIN, or target/debug/kairos.";

struct Args {
    cfg: ChaosConfig,
    recheck: Option<PathBuf>,
    takeover_given: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut cfg = ChaosConfig::default();
    let mut recheck = None;
    let mut takeover_given = false;
    let mut i = 0;
    while i < args.len() {
        let (flag, inline) = match args[i].split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (args[i].clone(), None),
        };
        i += 1;
        if flag == "--keep" {
            cfg.keep = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = args
                    .get(i)
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))?;
                i += 1;
                v
            }
        };
        let dur = |v: &str| {
            parse_duration_ms(v).ok_or_else(|| format!("{flag}: `{v}` is not a duration"))
        };
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: `{v}` is not a number"))
        };
        match flag.as_str() {
            "--duration" => cfg.duration_ms = dur(&value)?,
            "--seed" => cfg.seed = num(&value)?,
            "--hosts" => cfg.hosts = num(&value)?.max(1) as usize,
            "--lease" => cfg.lease_ms = Some(dur(&value)?),
            "--fault-every" => cfg.fault_every_ms = dur(&value)?.max(100),
            "--faults" => {
                cfg.faults = value
                    .split(',')
                    .filter(|w| !w.trim().is_empty())
                    .map(FaultKind::parse)
                    .collect::<Result<_, _>>()?
            }
            "--takeover-ms" => {
                cfg.takeover_ms = num(&value)? as i64;
                takeover_given = true;
            }
            "--recheck" => recheck = Some(PathBuf::from(value)),
            "--tail" => cfg.tail_ms = dur(&value)?,
            "--drain-max" => cfg.drain_max_ms = Some(dur(&value)?),
            "--resources" => cfg.resources = num(&value)?.max(1) as usize,
            "--host-flag" => cfg.host_flags.push(value),
            "--report" => cfg.report = Some(PathBuf::from(value)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        cfg,
        recheck,
        takeover_given,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Args {
        cfg,
        recheck,
        takeover_given,
    } = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("kairos-chaos: {e}\n");
            }
            eprintln!("{USAGE}");
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };
    if let Some(file) = recheck {
        let takeover = takeover_given.then_some(cfg.takeover_ms);
        match kairos_e2e::chaos::recheck(&file, takeover) {
            Ok(report) => {
                println!("{}", kairos_e2e::chaos::check::render(&report));
                std::process::exit(if report.passed { 0 } else { 1 });
            }
            Err(e) => {
                eprintln!("kairos-chaos: {e}");
                std::process::exit(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let report = runtime.block_on(run(&cfg));
    println!("{}", kairos_e2e::chaos::check::render(&report));
    runtime.shutdown_background();
    std::process::exit(if report.passed { 0 } else { 1 });
}
