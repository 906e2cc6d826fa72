//! Minimal timestamped logging to stderr (the agent's log is its container's log).

// One clock and one timestamp format for the plugin's and the agent's logs.
pub use interlock_contract::time::{format_ms as rfc3339, now_ms};

/// Writes one log line: `<time> <level> <message>`.
pub fn line(level: &str, msg: std::fmt::Arguments<'_>) {
    eprintln!("{} {level} {msg}", rfc3339(now_ms()));
}

/// Logs at INFO.
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::log::line("INFO", format_args!($($t)*)) };
}

/// Logs at WARN.
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::log::line("WARN", format_args!($($t)*)) };
}
