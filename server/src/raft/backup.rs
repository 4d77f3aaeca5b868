//! The backup file: the replicated state at one log index, as `leasehold snapshot
//! save` writes it and `leasehold-server restore` reads it.
//!
//! ```text
//! "LEASEHOLD BACKUP\n"                 magic, 17 bytes
//! u32 little-endian                    the header's length
//! header                               a versioned postcard blob (`BackupHeader`)
//! body                                 the state as snapshots hold it (format version, then
//!                                      `StateMachine::snapshot_into`)
//! ```
//!
//! The header names the cluster, the index the state was read at, and the body's
//! length and SHA-256, so that a truncated or altered file is refused whole.

use serde::{Deserialize, Serialize};

use crate::machine::StateMachine;
use crate::raft::codec;

pub const BACKUP_MAGIC: &[u8] = b"LEASEHOLD BACKUP\n";
/// 1: the first.
const BACKUP_FORMAT: u32 = 1;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BackupHeader {
    pub format: u32,
    pub cluster_name: String,
    /// None when the cluster's first leader had not recorded one yet.
    pub cluster_id: Option<u128>,
    /// The log index the state was read at: the state applied every entry up to it.
    pub index: u64,
    /// The leader's wall clock when it read the state, for people.
    pub taken_unix_ms: u64,
    pub body_bytes: u64,
    pub body_sha256: [u8; 32],
}

/// A backup file read back and checked.
#[derive(Debug)]
pub struct Backup {
    pub header: BackupHeader,
    pub machine: StateMachine,
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut hash = [0; 32];
    hash.copy_from_slice(digest.as_ref());
    hash
}

/// The hex text of a SHA-256, as `leasehold snapshot save` prints it.
pub fn sha256_text(bytes: &[u8]) -> String {
    sha256(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The backup file of `machine`, read at `index` (its last applied index).
pub fn encode(cluster_name: &str, machine: &StateMachine, taken_unix_ms: u64) -> (BackupHeader, Vec<u8>) {
    let body = machine.snapshot_into(codec::versioned_buffer());
    let header = BackupHeader {
        format: BACKUP_FORMAT,
        cluster_name: cluster_name.to_string(),
        cluster_id: machine.cluster_record().cluster_id,
        index: machine.last_applied_index(),
        taken_unix_ms,
        body_bytes: body.len() as u64,
        body_sha256: sha256(&body),
    };
    let header_bytes = codec::encode(&header);
    let mut file = Vec::with_capacity(BACKUP_MAGIC.len() + 4 + header_bytes.len() + body.len());
    file.extend_from_slice(BACKUP_MAGIC);
    file.extend_from_slice(&(header_bytes.len() as u32).to_le_bytes());
    file.extend_from_slice(&header_bytes);
    file.extend_from_slice(&body);
    (header, file)
}

/// Reads a backup file, refusing one that is not a Leasehold backup, of another
/// format, truncated, altered, or whose state breaks an invariant.
pub fn decode(file: &[u8]) -> Result<Backup, String> {
    let rest = file.strip_prefix(BACKUP_MAGIC).ok_or("not a Leasehold backup file (no LEASEHOLD BACKUP line)")?;
    let (length, rest) = rest.split_first_chunk::<4>().ok_or("the file ends inside its header")?;
    let length = u32::from_le_bytes(*length) as usize;
    if rest.len() < length {
        return Err("the file ends inside its header".into());
    }
    let (header_bytes, body) = rest.split_at(length);
    let header: BackupHeader =
        codec::decode(header_bytes).map_err(|error| format!("the backup's header is corrupt: {error}"))?;
    if header.format != BACKUP_FORMAT {
        return Err(format!("backup format {} is not supported (this build reads {BACKUP_FORMAT})", header.format));
    }
    if body.len() as u64 != header.body_bytes {
        return Err(format!(
            "the backup holds {} bytes of state, its header says {}: truncated?",
            body.len(),
            header.body_bytes
        ));
    }
    if sha256(body) != header.body_sha256 {
        return Err("the backup's state does not match its SHA-256: the file was altered or damaged".into());
    }
    let machine = StateMachine::from_snapshot(
        codec::versioned_body(body).map_err(|error| format!("the backup's state is corrupt: {error}"))?,
    )
    .map_err(|error| format!("the backup's state is corrupt: {error}"))?;
    if machine.last_applied() != Some(header.index) && !(header.index == 0 && machine.last_applied().is_none()) {
        return Err(format!(
            "the backup's header says index {}, its state applied up to {:?}",
            header.index,
            machine.last_applied()
        ));
    }
    crate::shell::fail_stop::catching(|| machine.check_invariants())
        .map_err(|reason| format!("the backup's state breaks an invariant: {reason}"))?;
    Ok(Backup { header, machine })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Caller, Command, RequestId};

    fn machine() -> StateMachine {
        let mut machine = StateMachine::new();
        let create = Command::CreateSession {
            request: RequestId { client_id: 1, sequence: 1 },
            ttl_ms: 10_000,
            client_name: "worker".into(),
        };
        machine.apply_as(3, 0, &Caller::Admin { secret: [1; 16] }, &create);
        machine
    }

    #[test]
    fn a_backup_reads_back_as_written() {
        let machine = machine();
        let (header, file) = encode("payments", &machine, 1_700_000_000_000);
        assert_eq!(header.index, 3);
        let backup = decode(&file).unwrap();
        assert_eq!(backup.header, header);
        assert_eq!(backup.machine, machine);
    }

    #[test]
    fn a_damaged_or_foreign_file_is_refused() {
        let (_, file) = encode("payments", &machine(), 0);
        assert!(decode(b"hello").unwrap_err().contains("not a Leasehold backup"));
        let truncated = decode(&file[..file.len() - 1]).unwrap_err();
        assert!(truncated.contains("truncated"), "{truncated}");
        let mut altered = file.clone();
        let last = altered.len() - 1;
        altered[last] ^= 1;
        assert!(decode(&altered).unwrap_err().contains("SHA-256"));
        assert!(decode(&file[..BACKUP_MAGIC.len() + 2]).unwrap_err().contains("header"));
    }
}
