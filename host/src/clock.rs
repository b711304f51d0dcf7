//! The one source of "now" for the host, so that tests and tools can reason about time
//! in one place. Everything stores and compares epoch milliseconds.

/// Where the host reads the current time.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The machine's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        chrono::Utc::now().timestamp_millis()
    }
}

/// The clock of `kairos serve --clock manual`, for users' integration tests: it runs with
/// the machine's clock and can be moved ahead, never back (`POST /clock`), so that a
/// week of schedules plays out in seconds (Temporal's time-skipping test server).
/// Schedules, fire times, lateness and history use it; the host's leases and heartbeats
/// stay on the machine's clock, and Redis's own clock (which judges a birth too late to
/// run, or a task past its `expire_after`) is never ahead of it.
#[derive(Debug, Default)]
pub struct ManualClock {
    /// How far ahead of the machine's clock it is (ms, never negative).
    ahead_ms: std::sync::atomic::AtomicI64,
}

impl ManualClock {
    /// Moves the clock to `at_ms` when that is ahead of it; returns the time it shows.
    pub fn move_to(&self, at_ms: i64) -> i64 {
        use std::sync::atomic::Ordering;
        let system = SystemClock.now_ms();
        let wanted = at_ms.saturating_sub(system);
        let ahead = self
            .ahead_ms
            .fetch_max(wanted, Ordering::AcqRel)
            .max(wanted);
        system + ahead
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.ahead_ms.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_ahead_never_back() {
        let clock = ManualClock::default();
        let start = clock.now_ms();
        let ahead = clock.move_to(start + 3_600_000);
        assert!(ahead >= start + 3_600_000 && ahead < start + 3_601_000);
        assert!(clock.now_ms() >= start + 3_600_000);
        let after_back = clock.move_to(start);
        assert!(after_back >= start + 3_600_000, "it never goes back");
    }
}
