//! The operator: a turmoil client host that runs the README's admin commands
//! (`member remove`, `member add`) with the real client library when the run asks,
//! and hands each answer back. Each command is given up after `STEP_DEADLINE`, as a
//! person at a terminal would press Ctrl-C; the run decides what to do next.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::host::{client_endpoint, node_ip, ADMIN_TOKEN, CLIENT_PORT, PEER_PORT};
use crate::network;

/// How long the operator waits for one command before giving it up.
pub const STEP_DEADLINE: Duration = Duration::from_secs(3);

/// An admin command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `leasehold member remove N`.
    Remove(u64),
    /// `leasehold member add N CLIENT_ADDR PEER_ADDR`.
    Add(u64),
}

/// The run's side: sends steps, takes their answers.
pub struct Operator {
    steps: Option<mpsc::UnboundedSender<Step>>,
    answers: Arc<Mutex<VecDeque<(Step, Result<(), String>)>>>,
}

impl Operator {
    /// The operator of a cluster of `nodes`, and the host software that runs its
    /// commands (a turmoil client), which ends once `finish` is called.
    pub fn new(nodes: u64) -> (Operator, impl std::future::Future<Output = turmoil::Result> + 'static) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let answers = Arc::new(Mutex::new(VecDeque::new()));
        let host = run(nodes, receiver, answers.clone());
        (Operator { steps: Some(sender), answers }, host)
    }

    pub fn send(&self, step: Step) {
        if let Some(steps) = &self.steps {
            let _ = steps.send(step);
        }
    }

    /// The next answer, if one came.
    pub fn answer(&self) -> Option<(Step, Result<(), String>)> {
        self.answers.lock().unwrap().pop_front()
    }

    /// No more commands: the operator's host ends once it answered what it has.
    pub fn finish(&mut self) {
        self.steps = None;
    }
}

async fn run(
    nodes: u64,
    mut steps: mpsc::UnboundedReceiver<Step>,
    answers: Arc<Mutex<VecDeque<(Step, Result<(), String>)>>>,
) -> turmoil::Result {
    let endpoints: Vec<String> = (1..=nodes).map(client_endpoint).collect();
    let client = leasehold::Client::lazy(&endpoints)?
        .with_dialer(network::dialer())
        .with_token(ADMIN_TOKEN)?
        .with_client_name("operator")
        .with_request_deadline(STEP_DEADLINE);
    while let Some(step) = steps.recv().await {
        let done = match step {
            Step::Remove(node) => tokio::time::timeout(STEP_DEADLINE, client.remove_member(node)).await,
            Step::Add(node) => {
                let (client_addr, peer_addr) =
                    (format!("{}:{CLIENT_PORT}", node_ip(node)), format!("{}:{PEER_PORT}", node_ip(node)));
                tokio::time::timeout(STEP_DEADLINE, client.add_member(node, &client_addr, &peer_addr, false)).await
            }
        };
        // An answer to a command given up earlier may have landed: the node is
        // already out, or already a voter, which is what the operator wanted.
        let answer = match done {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(leasehold::Error::NotFound(_))) if matches!(step, Step::Remove(_)) => Ok(()),
            Ok(Err(error)) if matches!(step, Step::Add(_)) && error.to_string().contains("is already a voter") => {
                Ok(())
            }
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {} s: given up", STEP_DEADLINE.as_secs())),
        };
        answers.lock().unwrap().push_back((step, answer));
    }
    Ok(())
}

/// The id of a node the operator adds that never answers: its host accepts
/// connections on both ports and never reads or writes a byte, as a machine whose
/// process hangs, or a firewall that swallows the traffic, would.
pub const SILENT_NODE: u64 = 9;

/// The software of `SILENT_NODE`'s host.
pub async fn silent_node() -> turmoil::Result {
    let any = std::net::Ipv4Addr::UNSPECIFIED;
    let client = turmoil::net::TcpListener::bind((any, CLIENT_PORT)).await?;
    let peer = turmoil::net::TcpListener::bind((any, PEER_PORT)).await?;
    let mut held = Vec::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = client.accept() => accepted?,
            accepted = peer.accept() => accepted?,
        };
        held.push(stream);
    }
}

/// Where the operator's add of `SILENT_NODE` is: `member add`, which must be refused
/// or given up (the node never catches up), then `member remove` until it is done,
/// as the README says for a learner left by a refused add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SilentAdd {
    /// The add is sent at `at_ms` (simulated).
    Planned {
        at_ms: u64,
    },
    Adding,
    Removing,
    /// The removal is sent again at `at_ms`.
    RetryRemove {
        at_ms: u64,
    },
    /// Removed; `added`: the add was acknowledged (it must not be).
    Done {
        added: bool,
    },
}
