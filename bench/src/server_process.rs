//! What the servers spend: CPU time and resident memory of their processes, read
//! from `/proc/<pid>/stat` and `/proc/<pid>/status`.

/// CPU seconds (user + system) that process `pid` has used, or None when it is gone.
pub fn cpu_seconds(pid: i32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count the
    // fields after the last ')'. utime and stime are fields 14 and 15 of the line,
    // so 12th and 13th after the name.
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let user_ticks: u64 = fields.get(11)?.parse().ok()?;
    let system_ticks: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    assert!(ticks_per_second > 0, "sysconf(_SC_CLK_TCK) must be positive");
    Some((user_ticks + system_ticks) as f64 / ticks_per_second as f64)
}

/// Resident memory of process `pid` in bytes (VmRSS), or None when it is gone.
pub fn resident_bytes(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kibibytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kibibytes * 1024)
}

/// CPU seconds of every process in `pids` at one moment; None for a gone process.
pub fn cpu_sample(pids: &[i32]) -> Vec<Option<f64>> {
    pids.iter().map(|pid| cpu_seconds(*pid)).collect()
}

/// CPU seconds spent between two samples, summed over the processes alive at both;
/// and whether every process was.
pub fn cpu_spent(before: &[Option<f64>], after: &[Option<f64>]) -> (f64, bool) {
    let mut total = 0.0;
    let mut complete = true;
    for (before, after) in before.iter().zip(after) {
        match (before, after) {
            (Some(before), Some(after)) => total += after - before,
            _ => complete = false,
        }
    }
    (total, complete)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_process() {
        let pid = std::process::id() as i32;
        assert!(cpu_seconds(pid).is_some());
        assert!(resident_bytes(pid).unwrap() > 0);
    }

    #[test]
    fn a_gone_process_makes_the_sum_incomplete() {
        let (total, complete) = cpu_spent(&[Some(1.0), Some(2.0)], &[Some(1.5), None]);
        assert_eq!(total, 0.5);
        assert!(!complete);
    }
}
