//! Log lines that land in the run's entry of the Plan's history.
//!
//! The host keeps the first 64 lines and 16 KiB of each run. Anything the plugin prints
//! to standard output or error is kept too, as `stdout`/`stderr` lines.

use crate::bindings::kairos::plugin0_1_0::log::Level;

/// To the host's `log` import; in a native test, to the test kit.
fn log(level: Level, message: &str) {
    #[cfg(target_family = "wasm")]
    crate::bindings::kairos::plugin0_1_0::log::log(level, message);
    #[cfg(not(target_family = "wasm"))]
    crate::testing::log(
        match level {
            Level::Trace => "trace",
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        },
        message,
    );
}

pub fn trace(message: &str) {
    log(Level::Trace, message)
}

pub fn debug(message: &str) {
    log(Level::Debug, message)
}

pub fn info(message: &str) {
    log(Level::Info, message)
}

pub fn warn(message: &str) {
    log(Level::Warn, message)
}

pub fn error(message: &str) {
    log(Level::Error, message)
}

/// `info!("sent {} bytes", n)`: formats and logs at info level.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::log::info(&::std::format!($($arg)*)) };
}

/// `warn!("target answered {}", status)`: formats and logs at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::log::warn(&::std::format!($($arg)*)) };
}

/// `error!(...)`: formats and logs at error level.
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => { $crate::log::error(&::std::format!($($arg)*)) };
}
