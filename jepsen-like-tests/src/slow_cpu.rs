//! The slow-cpu nemesis: a node's process in a CPU cgroup of its own, limited to a
//! few percent of one core (the CFS bandwidth limit: `cpu.max` with cgroup v2,
//! `cpu.cfs_quota_us` with v1's cpu controller, whichever the machine mounts).
//! Every thread of the process moves with it (RocksDB's too). Lifting the limit moves
//! the process back where it was and removes the cgroup.

use std::path::{Path, PathBuf};

/// The CFS period of the limit: short, so that a starved node runs in many small
/// slices (a long period would make it a string of pauses instead).
const PERIOD_US: u64 = 20_000;

/// A process held to a share of a core until `lift`.
#[derive(Debug)]
pub struct CpuLimit {
    /// The cgroup made for it.
    directory: PathBuf,
    /// The cgroup it came from (its `cgroup.procs`).
    parent: PathBuf,
}

/// Where the CPU controller is mounted: cgroup v2's unified root when it offers
/// `cpu`, else v1's `cpu` hierarchy.
fn controller_root() -> Result<(PathBuf, bool), String> {
    let unified = Path::new("/sys/fs/cgroup");
    if std::fs::read_to_string(unified.join("cgroup.controllers"))
        .is_ok_and(|text| text.split_whitespace().any(|c| c == "cpu"))
    {
        return Ok((unified.to_path_buf(), true));
    }
    for v1 in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"] {
        if Path::new(v1).join("cpu.cfs_quota_us").exists() {
            return Ok((PathBuf::from(v1), false));
        }
    }
    Err("no CPU cgroup controller is mounted (neither cgroup v2 with cpu nor v1's cpu)".into())
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|error| format!("cannot write {value:?} to {}: {error}", path.display()))
}

/// Holds process `pid` to `per_mille` thousandths of one core, in a cgroup named
/// `name` (unique per node and run).
pub fn limit(pid: i32, per_mille: u64, name: &str) -> Result<CpuLimit, String> {
    let (root, v2) = controller_root()?;
    let directory = root.join(name);
    match std::fs::create_dir(&directory) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(format!("cannot make {}: {error}", directory.display())),
    }
    let quota_us = (PERIOD_US * per_mille / 1_000).max(1_000);
    let limited = if v2 {
        // The root must hand the cpu controller down to its children.
        let _ = write(&root.join("cgroup.subtree_control"), "+cpu");
        write(&directory.join("cpu.max"), &format!("{quota_us} {PERIOD_US}"))
    } else {
        write(&directory.join("cpu.cfs_period_us"), &PERIOD_US.to_string())
            .and_then(|()| write(&directory.join("cpu.cfs_quota_us"), &quota_us.to_string()))
    };
    let limit = CpuLimit { directory, parent: root };
    let moved = limited.and_then(|()| write(&limit.directory.join("cgroup.procs"), &pid.to_string()));
    if let Err(error) = moved {
        limit.lift();
        return Err(error);
    }
    Ok(limit)
}

impl CpuLimit {
    /// Moves every process of the cgroup back and removes it.
    pub fn lift(self) {
        let procs = std::fs::read_to_string(self.directory.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace() {
            let _ = write(&self.parent.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.directory);
    }
}
