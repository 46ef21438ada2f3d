//! Figures from `/proc`: a process's memory and CPU time, and the machine's CPU time.

/// The value of a `/proc/<pid>/status` line (`Threads`, `VmRSS:`, ...; the colon is optional),
/// trimmed.
pub fn status_field(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let name = field.strip_suffix(':').unwrap_or(field);
    status.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key == name).then(|| value.trim().to_owned())
    })
}

/// A `/proc/<pid>/status` memory figure (`VmHWM:` peak RSS, `VmRSS:` current, `RssAnon:`, ...)
/// in MiB.
pub fn rss_mib(pid: u32, field: &str) -> Option<f64> {
    let kb: f64 = status_field(pid, field)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Resets process `pid`'s peak RSS (`VmHWM`) to its current RSS, so that the `VmHWM` read after
/// a phase is that phase's peak: writes `5` to `/proc/<pid>/clear_refs` (Linux 4.0 and later;
/// the process must be this user's).
pub fn reset_peak_rss(pid: u32) -> Result<(), String> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .map_err(|e| format!("resetting the peak RSS of process {pid}: {e}"))
}

/// The fields of `/proc/<pid>/stat` after the command (`state` first), or `None` once the
/// process is gone.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The process's state letter (`R`, `S`, `Z` for a zombie, ...).
pub fn state(pid: u32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// CPU seconds (user, system) process `pid` has used, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    let fields = stat_fields(pid)?;
    // After the command: state is field 3, utime 14 and stime 15 (1-based). USER_HZ is 100 on
    // every Linux configuration that matters here.
    let seconds = |i: usize| Some(fields.get(i)?.parse::<f64>().ok()? / 100.0);
    Some((seconds(11)?, seconds(12)?))
}

/// CPU seconds (user + system) process `pid` has used.
pub fn cpu_total(pid: u32) -> Option<f64> {
    cpu_seconds(pid).map(|(user, system)| user + system)
}

/// The machine's CPU seconds since boot, all CPUs together, from the first line of `/proc/stat`.
#[derive(Clone, Copy, Debug)]
pub struct MachineCpu {
    /// Neither idle nor waiting for I/O.
    pub busy: f64,
    /// Stolen by the hypervisor.
    pub steal: f64,
    pub total: f64,
}

pub fn machine_cpu() -> Option<MachineCpu> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal, in USER_HZ (100) ticks.
    let total: f64 = ticks.iter().sum();
    let busy = total - ticks.get(3)? - ticks.get(4)?;
    Some(MachineCpu {
        busy: busy / 100.0,
        steal: ticks.get(7)? / 100.0,
        total: total / 100.0,
    })
}

#[cfg(test)]
mod tests {
    /// A phase's peak is only its own once the peak before it is forgotten.
    #[test]
    fn resetting_the_peak_forgets_memory_touched_and_freed_before() {
        let pid = std::process::id();
        const SPIKE: usize = 64 << 20;
        // Written to, so every page is resident; freed at once (an allocation this large is its
        // own mapping, returned to the system on free).
        let spike = std::hint::black_box(vec![1u8; SPIKE]);
        drop(spike);
        let hwm = |what| super::rss_mib(pid, "VmHWM:").expect(what);
        let before = hwm("VmHWM before the reset");
        super::reset_peak_rss(pid).expect("reset");
        let after = hwm("VmHWM after the reset");
        assert!(
            after < before - 32.0,
            "the peak was {before:.1} MiB with the 64 MiB spike, {after:.1} MiB after the reset"
        );
    }

    /// The soak bench asked for `VmRSS` (no colon) and printed NaN for an hour's first minutes.
    #[test]
    fn a_status_field_is_found_with_or_without_its_colon_and_only_whole() {
        let pid = std::process::id();
        let with = super::rss_mib(pid, "VmRSS:").expect("VmRSS:");
        let without = super::rss_mib(pid, "VmRSS").expect("VmRSS");
        assert!(with > 0.0 && without > 0.0, "{with} {without}");
        assert!(super::status_field(pid, "Threads").is_some());
        assert_eq!(
            super::status_field(pid, "VmRS"),
            None,
            "a prefix is not a field"
        );
    }
}
