//! What a node takes from the world it runs in, handed to `start` in one value: its
//! clock, its randomness, where its blocking work runs, its disk, where its
//! connections come from and how it stops. A node that serves clients
//! takes the machine's (`Environment::os`); a simulator hands in its own, so that one
//! seed fixes every choice and every reading.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::raft::blocking::Blocking;
use crate::raft::disk::Disk;
use crate::shell::clock::Clock;
use crate::shell::entropy::Entropy;
use crate::shell::fail_stop::Exit;
use crate::shell::sockets::Sockets;

pub struct Environment {
    /// The node's only clock.
    pub clock: Clock,
    /// The node's only source of random choices (incarnations, ids, secrets).
    pub entropy: Arc<Entropy>,
    /// Threads, or inline under a simulator.
    pub blocking: Blocking,
    /// None: RocksDB in the data directory. A simulator's disk otherwise (the data
    /// directory still holds the node's identity).
    pub disk: Option<Arc<dyn Disk>>,
    /// None: the operating system's TCP (and TLS, as configured). A simulator's
    /// network serves both ports in plaintext and has no metrics or status listener.
    pub sockets: Option<Arc<dyn Sockets>>,
    /// How the node stops itself when it must: the process exits, or a simulator is
    /// told the code.
    pub exit: Exit,
    /// What tells the node to read its admin token and certificates again.
    pub reloads: Reloads,
}

/// Where the node's reload requests come from.
#[derive(Clone)]
pub enum Reloads {
    /// SIGHUP.
    Hangup,
    /// A simulator's notification (it has no signals, and runs no I/O driver).
    Notified(Arc<Notify>),
}

impl Environment {
    /// The machine's clocks, the operating system's randomness, threads.
    pub fn os() -> Environment {
        Environment {
            clock: Clock::system(),
            entropy: Arc::new(Entropy::os()),
            blocking: Blocking::Threads,
            disk: None,
            sockets: None,
            exit: Exit::Process,
            reloads: Reloads::Hangup,
        }
    }
}
