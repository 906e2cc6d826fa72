//! The agent's logs: `tracing` events written to stderr (the container's log) by
//! `tracing-subscriber`, as text or as one JSON object per line, filtered like `RUST_LOG`.
//!
//! Timestamps are RFC 3339 in UTC with milliseconds, the format the plugin's own small
//! logger prints (`interlock_contract::time`), so both logs sort and grep together.

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// The variable read first for the log filter.
pub const LOG_ENV: &str = "INTERLOCK_LOG";
/// The variable read when [`LOG_ENV`] is unset.
pub const FALLBACK_LOG_ENV: &str = "RUST_LOG";
/// The filter when neither is set.
pub const DEFAULT_FILTER: &str = "info";

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// `<time> <LEVEL> <target>: <message> key=value…`
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the fields.
    Json,
}

/// A log filter that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{var}={value:?} is not a valid log filter ({reason}); use e.g. `info` or `interlock_agent=debug,warn`")]
pub struct LogFilterError {
    /// The variable the filter came from.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What the parser said.
    pub reason: String,
}

/// Which filter applies, and where it came from: `INTERLOCK_LOG`, else `RUST_LOG`, else
/// `info` (an empty variable counts as unset).
pub fn choose_filter(
    interlock_log: Option<String>,
    rust_log: Option<String>,
) -> (&'static str, String) {
    let set = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    if let Some(v) = set(interlock_log) {
        (LOG_ENV, v)
    } else if let Some(v) = set(rust_log) {
        (FALLBACK_LOG_ENV, v)
    } else {
        ("the default", DEFAULT_FILTER.to_string())
    }
}

fn parse_filter(var: &'static str, value: String) -> Result<EnvFilter, LogFilterError> {
    EnvFilter::builder()
        .parse(&value)
        .map_err(|e| LogFilterError {
            var,
            reason: e.to_string(),
            value,
        })
}

/// Writes the time as `2026-11-23T23:35:22.123Z`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rfc3339Millis;

impl FormatTime for Rfc3339Millis {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        let now = interlock_contract::time::now_ms();
        write!(w, "{}", interlock_contract::time::format_ms(now))
    }
}

/// A subscriber writing to `writer` in `format`, keeping what `filter` lets through.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let base = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(Rfc3339Millis)
        .with_ansi(false)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(base.finish()),
        LogFormat::Json => Box::new(base.event_format(JsonLine).finish()),
    }
}

thread_local! {
    /// Set by [`Json`]'s formatting, so that [`JsonLine`] can tell a field written as
    /// JSON text from any other text (`tracing` hands a formatter every non-primitive
    /// field as text, whatever its type).
    static FORMATTED_AS_JSON: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A log field that is a JSON value: an array, an object or an enum's wire name. The text
/// format shows it as JSON text; `--log-format json` puts the value itself in the line
/// (`"bin_dirs":["/opt/cni/bin"]`, not a string holding Rust's debug text). Use it as
/// `field = %Json(&value)`.
pub struct Json<T>(pub T);

impl<T: serde::Serialize> std::fmt::Display for Json<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = serde_json::to_string(&self.0).map_err(|_| std::fmt::Error)?;
        FORMATTED_AS_JSON.with(|c| c.set(true));
        f.write_str(&text)
    }
}

impl<T: serde::Serialize> std::fmt::Debug for Json<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// One JSON object per event: `timestamp`, `level`, the fields (`message` first) and
/// `target`, as tracing-subscriber's flattened JSON format writes them, except that
/// numbers and booleans stay numbers and booleans and a [`Json`] field is its value.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonLine;

#[derive(Default)]
struct JsonFields(serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for JsonFields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        FORMATTED_AS_JSON.with(|c| c.set(false));
        let text = format!("{value:?}");
        let value = if FORMATTED_AS_JSON.with(|c| c.replace(false)) {
            serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
        } else {
            serde_json::Value::String(text)
        };
        self.0.insert(field.name().to_string(), value);
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
}

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JsonLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut fields = JsonFields::default();
        event.record(&mut fields);
        let mut line = serde_json::Map::new();
        line.insert(
            "timestamp".into(),
            interlock_contract::time::format_ms(interlock_contract::time::now_ms()).into(),
        );
        line.insert("level".into(), meta.level().as_str().into());
        if let Some(m) = fields.0.remove("message") {
            line.insert("message".into(), m);
        }
        for (k, v) in fields.0 {
            line.entry(k).or_insert(v);
        }
        line.insert("target".into(), meta.target().into());
        let text = serde_json::to_string(&line).map_err(|_| std::fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// Installs the process-wide logger (stderr, `format`, the filter from the environment).
/// A second call keeps the first logger.
pub fn init_logging(format: LogFormat) -> Result<(), LogFilterError> {
    let (var, value) = choose_filter(
        std::env::var(LOG_ENV).ok(),
        std::env::var(FALLBACK_LOG_ENV).ok(),
    );
    let filter = parse_filter(var, value)?;
    let _ = tracing::subscriber::set_global_default(subscriber(format, filter, std::io::stderr));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[test]
    fn filter_comes_from_interlock_log_then_rust_log() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            choose_filter(s("debug"), s("warn")),
            (LOG_ENV, "debug".into())
        );
        assert_eq!(
            choose_filter(None, s("warn")),
            (FALLBACK_LOG_ENV, "warn".into())
        );
        assert_eq!(
            choose_filter(s(" "), s("warn")),
            (FALLBACK_LOG_ENV, "warn".into())
        );
        assert_eq!(choose_filter(None, None).1, "info");
        let e = parse_filter(LOG_ENV, "interlock_agent=loud".into()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("INTERLOCK_LOG=\"interlock_agent=loud\""),
            "{msg}"
        );
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buf {
        type Writer = Buf;
        fn make_writer(&'w self) -> Buf {
            self.clone()
        }
    }

    fn capture(format: LogFormat, filter: &str) -> String {
        let buf = Buf::default();
        let sub = subscriber(format, EnvFilter::new(filter), buf.clone());
        tracing::subscriber::with_default(sub, || {
            tracing::debug!("hidden at info");
            tracing::info!(
                file = "00-interlock.conflist",
                bytes = 565,
                "wrote the owned config"
            );
            tracing::error!(error = "No space left on device", "cannot write the marker");
        });
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    fn is_rfc3339_millis(t: &str) -> bool {
        let b = t.as_bytes();
        b.len() == 24
            && b[4] == b'-'
            && b[10] == b'T'
            && b[19] == b'.'
            && b[23] == b'Z'
            && t[..4].parse::<u32>().is_ok()
            && t[20..23].parse::<u32>().is_ok()
    }

    #[test]
    fn text_lines_carry_time_level_and_fields() {
        let out = capture(LogFormat::Text, "info");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        let (time, rest) = lines[0].split_once(' ').unwrap();
        assert!(is_rfc3339_millis(time), "{time}");
        assert!(rest.trim_start().starts_with("INFO "), "{rest}");
        assert!(
            rest.contains("wrote the owned config file=\"00-interlock.conflist\" bytes=565"),
            "{rest}"
        );
        assert!(lines[1].contains("ERROR "), "{}", lines[1]);
    }

    #[test]
    fn json_lines_are_objects_with_the_fields() {
        let out = capture(LogFormat::Json, "debug");
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{out}");
        let info = &lines[1];
        assert!(
            is_rfc3339_millis(info["timestamp"].as_str().unwrap()),
            "{info}"
        );
        assert_eq!(info["level"], "INFO");
        assert_eq!(info["message"], "wrote the owned config");
        assert_eq!(info["file"], "00-interlock.conflist");
        assert_eq!(info["bytes"], 565);
        assert_eq!(lines[2]["level"], "ERROR");
    }
}
