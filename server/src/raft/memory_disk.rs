//! A disk in memory, for tests and the simulator: it keeps what was written apart
//! from what was synced, so that a crash (`crash`) loses exactly the writes that were
//! not synced, and a lying disk (`lose_last_synced`) can lose one that was.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use crate::raft::disk::{Batch, Change, Disk, DiskError, Durability, Family};

type Contents = BTreeMap<(Family, Vec<u8>), Vec<u8>>;

#[derive(Default)]
pub struct MemoryDisk {
    state: Mutex<State>,
}

#[derive(Default, Clone)]
struct State {
    /// What reads see: every write so far.
    written: Contents,
    /// What survives a crash.
    synced: Contents,
    /// Writes since the last sync, oldest first: what a crash loses.
    unsynced: Vec<Batch>,
    /// How to undo the last sync that made something durable, for
    /// `lose_last_synced`: each key it changed with the value it had before, in the
    /// order changed (a sync costs what it wrote, not what the disk holds).
    last_sync_undo: Option<Vec<Undo>>,
    /// Set by `fail_writes`: writes and syncs fail with this reason (a full disk).
    failing: Option<String>,
    /// Writes and syncs refused so far.
    refused: usize,
    /// How long each sync of the log takes (`slow`).
    sync_latency: std::time::Duration,
}

/// A key and the value it had before a change (None: it did not exist).
type Undo = ((Family, Vec<u8>), Option<Vec<u8>>);

/// Applies `batch` to `contents`; with `undo`, records what each change replaced.
fn apply(contents: &mut Contents, batch: &Batch, mut undo: Option<&mut Vec<Undo>>) {
    for change in &batch.changes {
        match change {
            Change::Put { family, key, value } => {
                let before = contents.insert((*family, key.clone()), value.clone());
                if let Some(undo) = undo.as_deref_mut() {
                    undo.push(((*family, key.clone()), before));
                }
            }
            Change::Delete { family, key } => {
                let before = contents.remove(&(*family, key.clone()));
                if let Some(undo) = undo.as_deref_mut() {
                    undo.push(((*family, key.clone()), before));
                }
            }
            Change::DeleteRange { family, from, to } => {
                let doomed: Vec<_> = contents
                    .range((Bound::Included((*family, from.clone())), Bound::Excluded((*family, to.clone()))))
                    .map(|(key, _)| key.clone())
                    .collect();
                for key in doomed {
                    let before = contents.remove(&key);
                    if let Some(undo) = undo.as_deref_mut() {
                        undo.push((key, before));
                    }
                }
            }
        }
    }
}

impl State {
    fn sync(&mut self) {
        if self.unsynced.is_empty() {
            return;
        }
        let mut undo = Vec::new();
        for batch in std::mem::take(&mut self.unsynced) {
            apply(&mut self.synced, &batch, Some(&mut undo));
        }
        self.last_sync_undo = Some(undo);
    }
}

impl MemoryDisk {
    pub fn new() -> MemoryDisk {
        MemoryDisk::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("no thread panics while holding the memory disk")
    }

    /// The process died: every write that was not synced is lost.
    pub fn crash(&self) {
        let mut state = self.state();
        state.written = state.synced.clone();
        state.unsynced.clear();
    }

    /// The disk was replaced by an empty one (the process is down).
    pub fn wipe(&self) {
        *self.state() = State::default();
    }

    /// A lying disk: the last sync that made writes durable did not, and the process
    /// died. Answers whether there was such a sync to undo.
    pub fn lose_last_synced(&self) -> bool {
        let mut state = self.state();
        let Some(undo) = state.last_sync_undo.take() else { return false };
        for (key, before) in undo.into_iter().rev() {
            match before {
                Some(value) => state.synced.insert(key, value),
                None => state.synced.remove(&key),
            };
        }
        state.written = state.synced.clone();
        state.unsynced.clear();
        true
    }

    /// From now on (`Some`) every write and sync fails with `reason`, as on a full
    /// disk; `None` heals it.
    pub fn fail_writes(&self, reason: Option<String>) {
        self.state().failing = reason;
    }

    /// From now on each sync of the log takes `latency` (a slow disk; zero heals it).
    pub fn slow(&self, latency: std::time::Duration) {
        self.state().sync_latency = latency;
    }

    /// Writes and syncs refused so far (`fail_writes`).
    pub fn refused_writes(&self) -> usize {
        self.state().refused
    }

    /// Writes not yet synced (what a crash would lose).
    pub fn unsynced_writes(&self) -> usize {
        self.state().unsynced.len()
    }
}

impl Disk for MemoryDisk {
    fn get(&self, family: Family, key: &[u8]) -> Result<Option<Vec<u8>>, DiskError> {
        Ok(self.state().written.get(&(family, key.to_vec())).cloned())
    }

    fn scan_from(
        &self,
        family: Family,
        from: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), DiskError> {
        let state = self.state();
        for ((entry_family, key), value) in state.written.range((family, from.to_vec())..) {
            if *entry_family != family || !visit(key, value) {
                break;
            }
        }
        Ok(())
    }

    fn last(&self, family: Family) -> Result<Option<(Vec<u8>, Vec<u8>)>, DiskError> {
        let state = self.state();
        let last = state
            .written
            .range((family, Vec::new())..)
            .take_while(|((entry_family, _), _)| *entry_family == family)
            .last()
            .map(|((_, key), value)| (key.clone(), value.clone()));
        Ok(last)
    }

    fn write(&self, batch: Batch, durability: Durability) -> Result<(), DiskError> {
        let mut state = self.state();
        if let Some(reason) = state.failing.clone() {
            state.refused += 1;
            return Err(DiskError(reason));
        }
        apply(&mut state.written, &batch, None);
        state.unsynced.push(batch);
        if durability == Durability::Synced {
            state.sync();
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), DiskError> {
        let mut state = self.state();
        if let Some(reason) = state.failing.clone() {
            state.refused += 1;
            return Err(DiskError(reason));
        }
        state.sync();
        Ok(())
    }

    fn sync_latency(&self) -> std::time::Duration {
        self.state().sync_latency
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(disk: &MemoryDisk, family: Family) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        disk.scan_from(family, &[], &mut |key, _| {
            keys.push(key.to_vec());
            true
        })
        .unwrap();
        keys
    }

    #[test]
    fn a_crash_loses_what_was_written_since_the_last_sync_and_nothing_synced() {
        let disk = MemoryDisk::new();
        disk.put(Family::Logs, b"1", b"a".to_vec(), Durability::Written).unwrap();
        disk.put(Family::Meta, b"vote", b"v1".to_vec(), Durability::Synced).unwrap();
        disk.put(Family::Logs, b"2", b"b".to_vec(), Durability::Written).unwrap();
        assert_eq!(keys(&disk, Family::Logs), vec![b"1".to_vec(), b"2".to_vec()], "written is readable");
        assert_eq!(disk.unsynced_writes(), 1);
        disk.crash();
        assert_eq!(keys(&disk, Family::Logs), vec![b"1".to_vec()], "the synced vote made entry 1 durable too");
        assert_eq!(disk.get(Family::Meta, b"vote").unwrap(), Some(b"v1".to_vec()));
        assert_eq!(disk.unsynced_writes(), 0);
    }

    #[test]
    fn ranges_and_families_stay_apart() {
        let disk = MemoryDisk::new();
        let mut batch = Batch::default();
        for index in 1..=5u64 {
            batch.put(Family::Logs, index.to_be_bytes(), vec![index as u8]);
        }
        batch.put(Family::Meta, b"z", b"meta".to_vec());
        disk.write(batch, Durability::Synced).unwrap();
        assert_eq!(disk.last(Family::Logs).unwrap().unwrap().0, 5u64.to_be_bytes().to_vec());
        assert_eq!(disk.last(Family::Meta).unwrap().unwrap().0, b"z".to_vec());

        let mut batch = Batch::default();
        batch.delete_range(Family::Logs, 2u64.to_be_bytes(), 4u64.to_be_bytes());
        disk.write(batch, Durability::Written).unwrap();
        let left: Vec<u64> =
            keys(&disk, Family::Logs).iter().map(|key| u64::from_be_bytes(key[..].try_into().unwrap())).collect();
        assert_eq!(left, vec![1, 4, 5]);
        let mut from_four = Vec::new();
        disk.scan_from(Family::Logs, &4u64.to_be_bytes(), &mut |key, _| {
            from_four.push(key.to_vec());
            false
        })
        .unwrap();
        assert_eq!(from_four, vec![4u64.to_be_bytes().to_vec()], "the visit stops when told");
    }

    #[test]
    fn a_lying_disk_undoes_every_change_of_its_last_sync_and_nothing_before() {
        let disk = MemoryDisk::new();
        let mut batch = Batch::default();
        for index in 1..=4u64 {
            batch.put(Family::Logs, index.to_be_bytes(), vec![index as u8]);
        }
        disk.write(batch, Durability::Synced).unwrap();
        let before: Vec<Vec<u8>> = keys(&disk, Family::Logs);
        // One sync of two batches: a range deleted, a key replaced, a key added, a
        // key put twice.
        let mut batch = Batch::default();
        batch.delete_range(Family::Logs, 2u64.to_be_bytes(), 4u64.to_be_bytes());
        batch.put(Family::Logs, 1u64.to_be_bytes(), vec![10]);
        disk.write(batch, Durability::Written).unwrap();
        let mut batch = Batch::default();
        batch.put(Family::Logs, 9u64.to_be_bytes(), vec![9]);
        batch.put(Family::Logs, 9u64.to_be_bytes(), vec![99]);
        disk.write(batch, Durability::Synced).unwrap();
        assert_eq!(keys(&disk, Family::Logs).len(), 3);
        assert!(disk.lose_last_synced());
        assert_eq!(keys(&disk, Family::Logs), before, "the contents before that sync, key for key");
        assert_eq!(disk.get(Family::Logs, &1u64.to_be_bytes()).unwrap(), Some(vec![1]));
        assert_eq!(disk.get(Family::Logs, &9u64.to_be_bytes()).unwrap(), None);
    }

    #[test]
    fn a_lying_disk_loses_its_last_synced_write_and_a_full_one_refuses_writes() {
        let disk = MemoryDisk::new();
        disk.put(Family::Meta, b"vote", b"v1".to_vec(), Durability::Synced).unwrap();
        disk.put(Family::Meta, b"vote", b"v2".to_vec(), Durability::Synced).unwrap();
        assert!(disk.lose_last_synced());
        assert_eq!(disk.get(Family::Meta, b"vote").unwrap(), Some(b"v1".to_vec()));
        assert!(!disk.lose_last_synced(), "one sync to undo, once");

        disk.fail_writes(Some("no space left on device".into()));
        let error = disk.put(Family::Meta, b"vote", b"v3".to_vec(), Durability::Synced).unwrap_err();
        assert_eq!(error.to_string(), "no space left on device");
        assert_eq!(disk.get(Family::Meta, b"vote").unwrap(), Some(b"v1".to_vec()), "a refused write changes nothing");
        assert!(disk.sync().is_err());
        assert_eq!(disk.refused_writes(), 2, "the write and the sync");
        disk.fail_writes(None);
        disk.put(Family::Meta, b"vote", b"v3".to_vec(), Durability::Synced).unwrap();
    }
}
