//! openraft's own conformance suite for storage, run on Leasehold's RocksDB log store
//! and state machine store: initial state, votes, reading, appending, truncating and
//! purging the log (through the in-memory run of recent entries), membership,
//! snapshots and their transfer.

use leasehold_server::raft::log_store::LogStore;
use leasehold_server::raft::state_machine_store::StateMachineStore;
use leasehold_server::raft::storage;
use leasehold_server::raft::types::{StorageError, TypeConfig};
use leasehold_server::shell::clock::Clock;
use leasehold_server::shell::lock_delays::LockDelays;
use leasehold_server::shell::session_deadlines::SessionDeadlines;
use openraft::testing::{StoreBuilder, Suite};

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let db = storage::open(&dir.path().join("db"), true).expect("open a fresh database");
        let state_machine = StateMachineStore::open(
            db.clone(),
            SessionDeadlines::new(Clock::system()),
            LockDelays::new(Clock::system()),
        )
        .expect("open the state machine store");
        Ok((dir, LogStore::new(db), state_machine))
    }
}

#[test]
fn the_rocksdb_stores_pass_openraft_storage_suite() {
    Suite::test_all(RocksBuilder).expect("every storage test of the suite passes");
}
