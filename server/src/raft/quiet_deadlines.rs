//! Where a node keeps, for every checkpoint of a quiet session it applied, the
//! deadline that checkpoint gave on this machine's monotonic clock, so that the node
//! restarted on the same boot starts the session from what it has left then, not
//! from the checkpoint's whole remaining time again.
//!
//! A checkpoint (`Command::CheckpointSessions`) says how long a session had left when
//! the leader proposed it; a node that applies it at time A starts the session at A
//! plus that (see `shell::session_deadlines`). A node restarted from its disk applies
//! the checkpoint again (from its snapshot or its log) at a later time, and without
//! this record would give the dead session its downtime on top. The record is keyed
//! by the session and the index of the checkpoint's entry, which names one proposal,
//! and holds the machine's boot id and the CLOCK_MONOTONIC deadline of the first
//! apply on this boot: it is written once and never moved later, and after a reboot
//! (another boot id, a clock that started again) it is not used. Writes are not
//! synced: they reach the disk with the next log append's fsync, and survive the
//! process being killed; one that is lost only means the later, safe deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use leasehold_proto::lease::with_drift_ms;

use crate::machine::SessionId;
use crate::raft::codec;
use crate::raft::disk::{Batch, Disk, Durability, Family};
use crate::shell::clock::Clock;

/// Keys: this prefix, the session and the checkpoint's index (big-endian).
const KEY_PREFIX: &[u8] = b"quiet-deadline/";

pub struct QuietDeadlines {
    disk: Arc<dyn Disk>,
    /// Read for the machine's boot time (`Clock::boot_ms`), never skewed.
    clock: Clock,
    /// None when the boot id cannot be read: nothing is then written or believed.
    boot_id: Option<String>,
    /// The checkpoint index of each session with a record, so that a resumed or ended
    /// session's record is deleted.
    recorded: Mutex<BTreeMap<SessionId, u64>>,
}

fn key(session: SessionId, index: u64) -> Vec<u8> {
    let mut key = KEY_PREFIX.to_vec();
    key.extend_from_slice(&session.to_be_bytes());
    key.extend_from_slice(&index.to_be_bytes());
    key
}

fn parse_key(key: &[u8]) -> Option<(SessionId, u64)> {
    let rest = key.strip_prefix(KEY_PREFIX)?;
    let session = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let index = u64::from_be_bytes(rest.get(8..16)?.try_into().ok()?);
    (rest.len() == 16).then_some((session, index))
}

impl QuietDeadlines {
    pub fn new(disk: Arc<dyn Disk>, clock: Clock) -> QuietDeadlines {
        let boot_id = clock.boot_id();
        QuietDeadlines { disk, clock, boot_id, recorded: Mutex::new(BTreeMap::new()) }
    }

    #[cfg(test)]
    fn with_boot_id(disk: Arc<dyn Disk>, clock: Clock, boot_id: &str) -> QuietDeadlines {
        QuietDeadlines { disk, clock, boot_id: Some(boot_id.to_string()), recorded: Mutex::new(BTreeMap::new()) }
    }

    /// The time `session` has left now by the checkpoint at entry `index`, which said
    /// `remaining_ms` when proposed, with the clock-drift allowance: from this boot's
    /// record of the checkpoint if there is one, else all of it, recorded now.
    pub fn remaining_ms(&self, session: SessionId, index: u64, remaining_ms: u64) -> u64 {
        let remaining_ms = with_drift_ms(remaining_ms);
        let Some(boot_id) = &self.boot_id else { return remaining_ms };
        let now = self.clock.boot_ms();
        let key = key(session, index);
        let stored = self.disk.get(Family::Meta, &key).ok().flatten();
        let believed = stored.and_then(|bytes| codec::decode::<(String, u64)>(&bytes).ok());
        self.recorded.lock().unwrap().insert(session, index);
        match believed {
            Some((recorded_boot, deadline)) if recorded_boot == *boot_id => {
                deadline.saturating_sub(now).min(remaining_ms)
            }
            _ => {
                let record = codec::encode(&(boot_id.as_str(), now + remaining_ms));
                if let Err(error) = self.disk.put(Family::Meta, &key, record, Durability::Written) {
                    tracing::warn!(%error, session, "cannot record a quiet session's deadline");
                }
                remaining_ms
            }
        }
    }

    /// The session is no longer quiet (resumed or ended): its record goes.
    pub fn forget(&self, session: SessionId) {
        let Some(index) = self.recorded.lock().unwrap().remove(&session) else { return };
        let mut batch = Batch::default();
        batch.delete(Family::Meta, key(session, index));
        if let Err(error) = self.disk.write(batch, Durability::Written) {
            tracing::warn!(%error, session, "cannot delete a quiet session's deadline");
        }
    }

    /// At start, or when a snapshot taken at `snapshot_index` is installed: deletes the
    /// records of checkpoints up to that index but those in `current` (the snapshot's
    /// quiet sessions): their sessions resumed or ended before it. Records of later
    /// entries stay: the log applies those entries again.
    pub fn retain(&self, snapshot_index: u64, current: &BTreeSet<(SessionId, u64)>) {
        self.recorded
            .lock()
            .unwrap()
            .retain(|session, index| *index > snapshot_index || current.contains(&(*session, *index)));
        let mut stale = Batch::default();
        let _ = self.disk.scan_from(Family::Meta, KEY_PREFIX, &mut |key, _| {
            if !key.starts_with(KEY_PREFIX) {
                return false;
            }
            if parse_key(key).is_none_or(|pair| pair.1 <= snapshot_index && !current.contains(&pair)) {
                stale.delete(Family::Meta, key);
            }
            true
        });
        let _ = self.disk.write(stale, Durability::Written);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::storage;

    #[test]
    fn a_checkpoint_applied_again_on_the_same_boot_keeps_its_first_deadline() {
        let directory = tempfile::tempdir().unwrap();
        let db: Arc<dyn Disk> = storage::open(directory.path(), true).unwrap();
        let clock = Clock::manual();
        let deadlines = QuietDeadlines::with_boot_id(db.clone(), clock.clone(), "boot-a");
        // 5 s and the drift allowance (0.1 %).
        assert_eq!(deadlines.remaining_ms(7, 100, 5_000), 5_005, "the first apply records now + 5.005 s");
        clock.advance(std::time::Duration::from_millis(30));
        assert_eq!(deadlines.remaining_ms(7, 100, 5_000), 4_975, "applied again 30 ms later");
        // Another checkpoint of the same session is another record.
        assert_eq!(deadlines.remaining_ms(7, 200, 3_000), 3_003);

        // Another boot: the monotonic clock started again; nothing is believed.
        let rebooted = QuietDeadlines::with_boot_id(db.clone(), clock, "boot-b");
        assert_eq!(rebooted.remaining_ms(7, 100, 5_000), 5_005);

        // A resumed session's record goes; so does, at start, one not in the state.
        deadlines.forget(7);
        assert_eq!(deadlines.remaining_ms(7, 200, 3_000), 3_003, "recorded afresh");
        deadlines.remaining_ms(8, 300, 1_000);
        deadlines.remaining_ms(9, 400, 1_000);
        // A snapshot at 350 holds session 8's checkpoint; 9's comes after it.
        deadlines.retain(350, &BTreeSet::from([(8, 300)]));
        let mut left = Vec::new();
        db.scan_from(Family::Meta, KEY_PREFIX, &mut |key, _| {
            left.extend(parse_key(key));
            key.starts_with(KEY_PREFIX)
        })
        .unwrap();
        assert_eq!(left, vec![(8, 300), (9, 400)], "session 7's record of entry 200 is gone");
    }
}
