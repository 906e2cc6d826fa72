//! Plugin logging: one line per event to `logFile` (appended) or stderr — never stdout,
//! which belongs to the protocol.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use interlock_contract::config::LogLevel;

/// Where and how much to log.
#[derive(Debug, Clone)]
pub struct Logger {
    level: LogLevel,
    file: Option<PathBuf>,
    context: String,
}

impl Logger {
    /// Logs at `level` and above to `file`, or stderr when `None`.
    pub fn new(level: LogLevel, file: Option<PathBuf>) -> Logger {
        Logger {
            level,
            file,
            context: String::new(),
        }
    }

    /// Prefix every line with `context` (e.g. `ADD c1/eth0`).
    pub fn with_context(mut self, context: String) -> Logger {
        self.context = context;
        self
    }

    /// Logs `msg` if `level` is enabled. Failures to write are ignored: logging must
    /// never change the protocol outcome.
    pub fn log(&self, level: LogLevel, msg: &str) {
        if level > self.level {
            return;
        }
        let label = match level {
            LogLevel::Error => "ERROR",
            LogLevel::Warn => "WARN",
            LogLevel::Info => "INFO",
            LogLevel::Debug => "DEBUG",
        };
        let line = format!(
            "{} {label} interlock-cni[{}] {}{}{msg}\n",
            interlock_contract::time::format_ms(interlock_contract::time::now_ms()),
            std::process::id(),
            self.context,
            if self.context.is_empty() { "" } else { ": " }
        );
        let written = self.file.as_ref().is_some_and(|path| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(line.as_bytes()))
                .is_ok()
        });
        if !written {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }

    /// Logs at error level.
    pub fn error(&self, msg: &str) {
        self.log(LogLevel::Error, msg)
    }

    /// Logs at warn level.
    pub fn warn(&self, msg: &str) {
        self.log(LogLevel::Warn, msg)
    }

    /// Logs at info level.
    pub fn info(&self, msg: &str) {
        self.log(LogLevel::Info, msg)
    }

    /// Logs at debug level.
    pub fn debug(&self, msg: &str) {
        self.log(LogLevel::Debug, msg)
    }

    /// Logs at debug level the message `msg` builds, building it only when debug is
    /// enabled: a pod's identity with its annotations is worth formatting only then, not on
    /// every ADD at the default level.
    pub fn debug_with(&self, msg: impl FnOnce() -> String) {
        if LogLevel::Debug <= self.level {
            self.log(LogLevel::Debug, &msg())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_to_file_filtered_by_level() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("il.log");
        let l = Logger::new(LogLevel::Info, Some(path.clone())).with_context("ADD c/eth0".into());
        l.info("hello");
        l.debug("hidden");
        l.debug_with(|| unreachable!("a debug message is not built at info level"));
        l.error("bad");
        let s = std::fs::read_to_string(&path).unwrap();
        assert!(
            s.contains("INFO interlock-cni[") && s.contains("ADD c/eth0: hello"),
            "{s}"
        );
        assert!(!s.contains("hidden"));
        assert_eq!(s.lines().count(), 2);
        let d = Logger::new(LogLevel::Debug, Some(path.clone()));
        d.debug_with(|| "built".into());
        let s = std::fs::read_to_string(&path).unwrap();
        assert!(
            s.contains("DEBUG interlock-cni[") && s.contains("built"),
            "{s}"
        );
    }
}
