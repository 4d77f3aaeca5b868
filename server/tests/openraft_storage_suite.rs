//! openraft's own conformance suite for storage, run on Leasehold's log store and
//! state machine store as a node runs them (RocksDB, threads) and as the simulator
//! does (the in-memory disk, blocking work inline): initial state, votes, reading, appending, truncating and purging
//! the log (through the in-memory run of recent entries), membership, snapshots and
//! their transfer.

use std::sync::Arc;

use leasehold_server::raft::blocking::Blocking;
use leasehold_server::raft::disk::Disk;
use leasehold_server::raft::log_store::LogStore;
use leasehold_server::raft::memory_disk::MemoryDisk;
use leasehold_server::raft::state_machine_store::StateMachineStore;
use leasehold_server::raft::storage;
use leasehold_server::raft::types::{StorageError, TypeConfig};
use leasehold_server::shell::clock::Clock;
use leasehold_server::shell::lock_delays::LockDelays;
use leasehold_server::shell::session_deadlines::SessionDeadlines;
use openraft::testing::{StoreBuilder, Suite};

fn stores(disk: Arc<dyn Disk>, blocking: Blocking) -> (LogStore, StateMachineStore) {
    let state_machine = StateMachineStore::open(
        disk.clone(),
        SessionDeadlines::new(Clock::system()),
        LockDelays::new(Clock::system()),
        blocking,
    )
    .expect("open the state machine store");
    (LogStore::new(disk, blocking, Default::default()), state_machine)
}

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let disk = storage::open(&dir.path().join("db"), true).expect("open a fresh database");
        let (log, state_machine) = stores(disk, Blocking::Threads);
        Ok((dir, log, state_machine))
    }
}

struct MemoryBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, ()> for MemoryBuilder {
    async fn build(&self) -> Result<((), LogStore, StateMachineStore), StorageError> {
        let (log, state_machine) = stores(Arc::new(MemoryDisk::new()), Blocking::Inline);
        Ok(((), log, state_machine))
    }
}

#[test]
fn the_rocksdb_stores_pass_openraft_storage_suite() {
    Suite::test_all(RocksBuilder).expect("every storage test of the suite passes");
}

#[test]
fn the_stores_on_the_memory_disk_pass_openraft_storage_suite() {
    Suite::test_all(MemoryBuilder).expect("every storage test of the suite passes");
}
