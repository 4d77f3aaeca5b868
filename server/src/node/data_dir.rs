//! The data directory's identity. A node refuses, without touching anything, a
//! directory that belongs to another cluster or another node id, that holds files
//! which are not Leasehold's, or whose identity cannot be read.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::raft::types::NodeId;

/// The file that says whose data directory this is.
pub const IDENTITY_FILE: &str = "LEASEHOLD";
/// The RocksDB directory inside the data directory.
pub const DATABASE_DIR: &str = "db";
/// 2: tenants, session secrets and callers in every log entry and snapshot (format 1
/// had none, and this build cannot read its log).
const IDENTITY_FORMAT: u32 = 2;

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct Identity {
    format: u32,
    cluster_name: String,
    node_id: NodeId,
}

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data directory {path}: {message}")]
    Refused { path: PathBuf, message: String },
}

fn refuse<T>(path: &Path, message: impl Into<String>) -> Result<T, DataDirError> {
    Err(DataDirError::Refused { path: path.to_path_buf(), message: message.into() })
}

/// Whether the directory was just claimed (fresh) or already held this node's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    Fresh,
    Existing,
}

/// Checks that `path` is this node's data directory, or empty/absent. Touches
/// nothing; call `claim` afterwards to write the identity of a fresh directory.
pub fn inspect(path: &Path, cluster_name: &str, node_id: NodeId) -> Result<Claim, DataDirError> {
    match fs::metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Claim::Fresh),
        Err(error) => return refuse(path, format!("cannot be read: {error}")),
        Ok(metadata) if !metadata.is_dir() => return refuse(path, "is not a directory"),
        Ok(_) => {}
    }
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(error) => return refuse(path, format!("cannot be read: {error}")),
    };
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => names.push(entry.file_name().to_string_lossy().into_owned()),
            Err(error) => return refuse(path, format!("cannot be read: {error}")),
        }
    }
    if names.is_empty() {
        return Ok(Claim::Fresh);
    }
    if !names.iter().any(|name| name == IDENTITY_FILE) {
        names.sort();
        names.truncate(5);
        return refuse(
            path,
            format!(
                "is not empty and is not a Leasehold data directory (no {IDENTITY_FILE} file; found {}); \
                 refusing to touch it",
                names.join(", ")
            ),
        );
    }
    let identity_path = path.join(IDENTITY_FILE);
    let text = match fs::read_to_string(&identity_path) {
        Ok(text) => text,
        Err(error) => return refuse(path, format!("its {IDENTITY_FILE} file cannot be read: {error}")),
    };
    let identity: Identity = match toml::from_str(&text) {
        Ok(identity) => identity,
        Err(error) => return refuse(path, format!("its {IDENTITY_FILE} file is corrupt: {error}")),
    };
    if identity.format != IDENTITY_FORMAT {
        return refuse(
            path,
            format!(
                "was written in format {} but this build reads format {IDENTITY_FORMAT} (its log and snapshots \
                 differ); run the version that wrote it, or start this node on an empty directory and add it to \
                 the cluster again",
                identity.format
            ),
        );
    }
    if identity.cluster_name != cluster_name {
        return refuse(
            path,
            format!("belongs to cluster {:?}, not to cluster {cluster_name:?}", identity.cluster_name),
        );
    }
    if identity.node_id != node_id {
        return refuse(path, format!("belongs to node {}, not to node {node_id}", identity.node_id));
    }
    if !path.join(DATABASE_DIR).is_dir() {
        return refuse(path, format!("has an identity but no {DATABASE_DIR}/ directory: it is corrupt"));
    }
    Ok(Claim::Existing)
}

/// Writes the identity of a fresh data directory (durably, before any data).
pub fn claim(path: &Path, cluster_name: &str, node_id: NodeId) -> Result<(), DataDirError> {
    if let Err(error) = fs::create_dir_all(path) {
        return refuse(path, format!("cannot be created: {error}"));
    }
    let identity = Identity { format: IDENTITY_FORMAT, cluster_name: cluster_name.to_string(), node_id };
    let text = toml::to_string(&identity).expect("identity serializes");
    let temporary = path.join(format!("{IDENTITY_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(&temporary)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        fs::rename(&temporary, path.join(IDENTITY_FILE))?;
        fs::File::open(path)?.sync_all()
    };
    write().or_else(|error| refuse(path, format!("cannot write its identity: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_claimed_then_recognised_and_foreign_refused() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("node1");
        assert_eq!(inspect(&path, "c", 1).unwrap(), Claim::Fresh);
        claim(&path, "c", 1).unwrap();
        fs::create_dir(path.join(DATABASE_DIR)).unwrap();
        assert_eq!(inspect(&path, "c", 1).unwrap(), Claim::Existing);

        let other_node = inspect(&path, "c", 2).unwrap_err().to_string();
        assert!(other_node.contains("belongs to node 1"), "{other_node}");
        let other_cluster = inspect(&path, "d", 1).unwrap_err().to_string();
        assert!(other_cluster.contains("belongs to cluster \"c\""), "{other_cluster}");

        let foreign = root.path().join("photos");
        fs::create_dir(&foreign).unwrap();
        fs::write(foreign.join("cat.jpg"), b"meow").unwrap();
        let message = inspect(&foreign, "c", 1).unwrap_err().to_string();
        assert!(message.contains("not a Leasehold data directory"), "{message}");
        assert_eq!(fs::read_dir(&foreign).unwrap().count(), 1);

        fs::write(path.join(IDENTITY_FILE), b"garbage = [").unwrap();
        let corrupt = inspect(&path, "c", 1).unwrap_err().to_string();
        assert!(corrupt.contains("corrupt"), "{corrupt}");
    }
}
