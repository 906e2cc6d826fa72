//! The standard `process_*` series of the agent's own process (the names and meanings
//! every Prometheus client library exports), read from `/proc/self` on each scrape:
//! CPU time, resident and virtual memory, open and maximum descriptors, start time.
//! A value that cannot be read is left out of that scrape rather than reported as 0.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The unit of the times in `/proc/<pid>/stat` (`USER_HZ`): 100 on every Linux
/// architecture's user-space ABI, whatever the kernel's own tick.
const USER_HZ: f64 = 100.0;

/// The collector; register it with `Registry::register_collector`.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<i64>,
    /// Virtual memory size, bytes.
    pub virtual_bytes: Option<i64>,
    /// Open file descriptors.
    pub open_fds: Option<i64>,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<i64>,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads the calling process's figures.
    pub fn read() -> ProcessStats {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let mut stats = parse_stat(&stat, boot);
        stats.resident_bytes = vm_rss_bytes(&status);
        stats.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as i64);
        stats.max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .ok()
            .map(|(soft, _)| i64::try_from(soft).unwrap_or(i64::MAX));
        stats
    }
}

/// CPU time, virtual size and start time from `/proc/<pid>/stat` (`boot`: `btime` of
/// `/proc/stat`). The command name (field 2) may hold spaces and parentheses, so the
/// fields are counted after its last `)`.
pub fn parse_stat(stat: &str, boot: Option<u64>) -> ProcessStats {
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return ProcessStats::default();
    };
    // After the name: field 3 (state) is index 0, so field n is index n - 3.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    ProcessStats {
        cpu_seconds: num(14).zip(num(15)).map(|(u, s)| (u + s) as f64 / USER_HZ),
        virtual_bytes: num(23).map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
        start_time_seconds: num(22)
            .zip(boot)
            .map(|(ticks, boot)| boot as f64 + ticks as f64 / USER_HZ),
        ..ProcessStats::default()
    }
}

/// `btime` (boot time, seconds since the epoch) from `/proc/stat`.
pub fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// `VmRSS` of `/proc/<pid>/status`, in bytes.
pub fn vm_rss_bytes(status: &str) -> Option<i64> {
    let kb: i64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = ProcessStats::read();
        if let Some(v) = s.cpu_seconds {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                c.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                s.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis, as /proc prints it.
        let stat = "4242 (inter lock)) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 123400 104857600 2000 18446744073709551615";
        let s = parse_stat(stat, Some(1_700_000_000));
        assert_eq!(s.cpu_seconds, Some(3.0));
        assert_eq!(s.virtual_bytes, Some(104_857_600));
        assert_eq!(s.start_time_seconds, Some(1_700_000_000.0 + 1234.0));
        assert_eq!(parse_stat("garbage", None), ProcessStats::default());
    }

    #[test]
    fn rss_and_boot_time_parse() {
        assert_eq!(
            vm_rss_bytes("Name:\tx\nVmRSS:\t   2048 kB\n"),
            Some(2048 * 1024)
        );
        assert_eq!(vm_rss_bytes("Name:\tx\n"), None);
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn this_process_reads_as_alive() {
        let s = ProcessStats::read();
        assert!(s.resident_bytes.unwrap() > 0);
        assert!(s.open_fds.unwrap() >= 3);
        assert!(s.max_fds.unwrap() >= s.open_fds.unwrap());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = s.start_time_seconds.unwrap();
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{start}"
        );
        assert!(s.cpu_seconds.unwrap() >= 0.0);
    }
}
