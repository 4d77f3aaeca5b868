//! The data directory's identity. A node refuses, without touching anything, a
//! directory that belongs to another cluster or another node id, that holds files
//! which are not Leasehold's, or whose identity cannot be read.
//!
//! The identity also holds the directory's incarnation: a random number drawn when
//! the directory is first claimed, which the cluster records for each member (see
//! `machine::members`). A wiped directory gets a new one, so the cluster can tell a
//! node that lost its log from the one that had it. And it holds the cluster's
//! random id once this node has learned it from the log.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::raft::types::NodeId;
use crate::shell::entropy::Entropy;

/// The file that says whose data directory this is.
pub const IDENTITY_FILE: &str = "LEASEHOLD";
/// The RocksDB directory inside the data directory.
pub const DATABASE_DIR: &str = "db";
/// 2: tenants, session secrets and callers in every log entry and snapshot (format 1
/// had none, and this build cannot read its log).
const IDENTITY_FORMAT: u32 = 2;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    format: u32,
    cluster_name: String,
    node_id: NodeId,
    /// Drawn when the directory was claimed. Absent in directories claimed before
    /// incarnations existed: `inspect` then draws one and writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    incarnation: Option<u64>,
    /// The cluster's id (hexadecimal) once the log recorded it; a directory that
    /// holds another id belongs to another cluster, whatever its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_id: Option<String>,
}

impl Identity {
    pub fn incarnation(&self) -> u64 {
        self.incarnation.expect("inspect and claim give every identity an incarnation")
    }

    pub fn cluster_id(&self) -> Option<u128> {
        self.cluster_id.as_deref().and_then(|hex| u128::from_str_radix(hex, 16).ok())
    }
}

/// How a cluster id is written: 32 hexadecimal digits.
pub fn cluster_id_text(cluster_id: u128) -> String {
    format!("{cluster_id:032x}")
}

/// A random incarnation of 63 bits (TOML's integers are signed), never 0.
fn new_incarnation(entropy: &Entropy) -> u64 {
    loop {
        let incarnation = entropy.u64() >> 1;
        if incarnation != 0 {
            return incarnation;
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data directory {path}: {message}")]
    Refused { path: PathBuf, message: String },
}

fn refuse<T>(path: &Path, message: impl Into<String>) -> Result<T, DataDirError> {
    Err(DataDirError::Refused { path: path.to_path_buf(), message: message.into() })
}

/// Whether the directory is empty (fresh) or already holds this node's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Fresh,
    Existing(Identity),
}

/// Who may enter a data directory: its owner only. It holds the hashes of tenant
/// tokens and session secrets, and every tenant's names.
pub const DATA_DIR_MODE: u32 = 0o700;

/// Makes the data directory its owner's only (`DATA_DIR_MODE`). Returns the mode it
/// had if that let others in (for a warning), `None` if it was private already.
/// Files made before, with a looser mode, are out of reach once the directory is.
pub fn make_private(path: &Path) -> Result<Option<u32>, DataDirError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = match fs::metadata(path) {
        Ok(metadata) => metadata.permissions().mode() & 0o777,
        Err(error) => return refuse(path, format!("cannot be read: {error}")),
    };
    if mode & !DATA_DIR_MODE == 0 {
        return Ok(None);
    }
    if let Err(error) = fs::set_permissions(path, fs::Permissions::from_mode(DATA_DIR_MODE)) {
        return refuse(path, format!("is open to others (mode {mode:o}) and cannot be made private: {error}"));
    }
    Ok(Some(mode))
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
    if identity.cluster_id.is_some() && identity.cluster_id().is_none() {
        return refuse(path, format!("its {IDENTITY_FILE} file is corrupt: the cluster id is not 32 hex digits"));
    }
    if !path.join(DATABASE_DIR).is_dir() {
        return refuse(path, format!("has an identity but no {DATABASE_DIR}/ directory: it is corrupt"));
    }
    Ok(Claim::Existing(identity))
}

/// Writes the identity of a fresh data directory (durably, before any data), with a
/// new incarnation.
pub fn claim(path: &Path, cluster_name: &str, node_id: NodeId, entropy: &Entropy) -> Result<Identity, DataDirError> {
    if let Err(error) = fs::create_dir_all(path) {
        return refuse(path, format!("cannot be created: {error}"));
    }
    let identity = Identity {
        format: IDENTITY_FORMAT,
        cluster_name: cluster_name.to_string(),
        node_id,
        incarnation: Some(new_incarnation(entropy)),
        cluster_id: None,
    };
    write(path, &identity)?;
    Ok(identity)
}

/// Gives a directory claimed before incarnations existed its incarnation. The
/// cluster has no record of it yet, so any new one is as good.
pub fn with_incarnation(path: &Path, identity: Identity, entropy: &Entropy) -> Result<Identity, DataDirError> {
    if identity.incarnation.is_some() {
        return Ok(identity);
    }
    let identity = Identity { incarnation: Some(new_incarnation(entropy)), ..identity };
    write(path, &identity)?;
    Ok(identity)
}

/// Writes the cluster's id into the identity, once the log recorded it.
pub fn record_cluster_id(path: &Path, identity: &Identity, cluster_id: u128) -> Result<Identity, DataDirError> {
    let identity = Identity { cluster_id: Some(cluster_id_text(cluster_id)), ..identity.clone() };
    write(path, &identity)?;
    Ok(identity)
}

/// Replaces the identity file atomically and durably.
fn write(path: &Path, identity: &Identity) -> Result<(), DataDirError> {
    let text = toml::to_string(identity).expect("identity serializes");
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
        let claimed = claim(&path, "c", 1, &Entropy::os()).unwrap();
        fs::create_dir(path.join(DATABASE_DIR)).unwrap();
        assert_eq!(inspect(&path, "c", 1).unwrap(), Claim::Existing(claimed.clone()));
        assert_ne!(claimed.incarnation(), 0);
        let again = tempfile::tempdir().unwrap();
        assert_ne!(
            claim(again.path(), "c", 1, &Entropy::os()).unwrap().incarnation(),
            claimed.incarnation(),
            "a directory claimed again is another incarnation"
        );
        let recorded = record_cluster_id(&path, &claimed, 0xabc).unwrap();
        assert_eq!(inspect(&path, "c", 1).unwrap(), Claim::Existing(recorded.clone()));
        assert_eq!(recorded.cluster_id(), Some(0xabc));
        assert_eq!(recorded.incarnation(), claimed.incarnation());

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

        fs::write(path.join(IDENTITY_FILE), b"format = 2\ncluster_name = \"c\"\nnode_id = 1\n").unwrap();
        let Claim::Existing(old) = inspect(&path, "c", 1).unwrap() else { panic!("an existing directory") };
        assert_eq!(old.incarnation, None, "claimed before incarnations existed");
        let given = with_incarnation(&path, old, &Entropy::os()).unwrap();
        assert_eq!(inspect(&path, "c", 1).unwrap(), Claim::Existing(given));

        fs::write(path.join(IDENTITY_FILE), b"garbage = [").unwrap();
        let corrupt = inspect(&path, "c", 1).unwrap_err().to_string();
        assert!(corrupt.contains("corrupt"), "{corrupt}");
    }
}
