//! The `process_*` series that every official Prometheus client exports, with their
//! standard names and units, so that the usual dashboards and alerts work on kairos as
//! on any other service: CPU seconds, resident and virtual memory, open and most file
//! descriptors, and the start time. Read from `/proc` at scrape time; where there is no
//! `/proc` (not Linux), none are written.

use super::write_series as series;

/// What `/proc/self/stat` says of this process, in the units of the exposition.
#[derive(Debug, PartialEq)]
struct Stat {
    cpu_seconds: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
    start_time_seconds: f64,
}

/// Parses `/proc/self/stat` (proc(5)). The command name, field 2, is in parentheses and
/// may hold spaces and parentheses itself, so the fields are counted from the last `)`:
/// field 3 (`state`) is the first after it.
fn parse_stat(stat: &str, ticks_per_second: f64, page_bytes: u64, boot_time: u64) -> Option<Stat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let (utime, stime) = (field(14)?, field(15)?);
    Some(Stat {
        cpu_seconds: (utime + stime) as f64 / ticks_per_second,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page_bytes,
        start_time_seconds: boot_time as f64 + field(22)? as f64 / ticks_per_second,
    })
}

/// The `btime` line of `/proc/stat`: when the machine booted, in seconds since the epoch.
fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|t| t.trim().parse().ok())
}

fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf reads a configuration value; it has no memory effects.
    let value = unsafe { libc::sysconf(name) };
    u64::try_from(value).ok().filter(|v| *v > 0)
}

/// The soft limit on open file descriptors (`RLIMIT_NOFILE`).
fn max_fds() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the limit into the struct it is given, which lives here.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Appends the `process_*` series of this process to `out`.
pub fn render(out: &mut String) {
    let stat = (|| {
        let ticks = sysconf(libc::_SC_CLK_TCK)? as f64;
        let page = sysconf(libc::_SC_PAGESIZE)?;
        let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
        parse_stat(
            &std::fs::read_to_string("/proc/self/stat").ok()?,
            ticks,
            page,
            boot,
        )
    })();
    if let Some(s) = stat {
        series(
            out,
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
            s.cpu_seconds,
        );
        series(
            out,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            "gauge",
            s.virtual_bytes as f64,
        );
        series(
            out,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            "gauge",
            s.resident_bytes as f64,
        );
        series(
            out,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            "gauge",
            s.start_time_seconds,
        );
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        // The directory's own descriptor, open while it is read, is not counted.
        let open = fds.count().saturating_sub(1);
        series(
            out,
            "process_open_fds",
            "Number of open file descriptors.",
            "gauge",
            open as f64,
        );
        if let Some(max) = max_fds() {
            series(
                out,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                "gauge",
                max as f64,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_after_a_command_name_with_spaces_and_parentheses() {
        // Fields 1–24 of proc(5), the command name holding ") (" to mislead a naive split.
        let stat = "4242 (kairos (a) b) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 150 0 0 20 0 8 0 12000 987654321 2048 18446744073709551615 0";
        let got = parse_stat(stat, 100.0, 4096, 1_700_000_000).unwrap();
        assert_eq!(
            got,
            Stat {
                cpu_seconds: 4.0,
                virtual_bytes: 987_654_321,
                resident_bytes: 2048 * 4096,
                start_time_seconds: 1_700_000_120.0,
            }
        );
        assert_eq!(parse_stat("4242 (cut", 100.0, 4096, 0), None);
        assert_eq!(parse_stat("4242 (x) S 1 2", 100.0, 4096, 0), None);
    }

    #[test]
    fn the_boot_time_is_the_btime_line() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1764000000\nprocesses 9\n"),
            Some(1_764_000_000)
        );
        assert_eq!(parse_boot_time("cpu 1 2 3\n"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_cpu_memory_descriptors_and_a_start_time() {
        let mut out = String::new();
        render(&mut out);
        let value = |name: &str| -> f64 {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{out}"));
            line[name.len() + 1..].parse().unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} vs {now}"
        );
        assert!(value("process_cpu_seconds_total") >= 0.0);
    }
}
