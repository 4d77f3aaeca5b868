//! A fenced store: keeps, per resource, the highest fencing token it accepted and
//! rejects writes that carry a lower one — the `UPDATE … WHERE fence_token < $t`
//! rule, in memory. Served over a line protocol on loopback so that worker
//! processes write to it:
//!
//! ```text
//! WRITE <resource> <token> <value>\n   ->  ACCEPTED\n | REJECTED <highest token>\n
//! READ <resource>\n                    ->  VALUE <token> <value>\n | EMPTY\n
//! FREAD <resource> <token>\n           ->  VALUE <token> <value>\n | EMPTY\n | REJECTED <fence>\n
//! ```
//!
//! `FREAD` is the fenced read of a read-modify-write: it refuses a token below the
//! resource's fence and raises the fence to its token, so a holder that was
//! superseded after it read cannot write back what it read over the newer holder's
//! write (a fence on writes alone loses that update). A write needs a token above
//! every accepted write's and at least the fence.
//!
//! With fencing switched off (the control) every write is accepted, which is what a
//! store without the check does.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// One write the store received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub resource: String,
    pub token: u64,
    pub value: String,
    pub accepted: bool,
}

#[derive(Default)]
struct State {
    highest: BTreeMap<String, (u64, String)>,
    /// The highest token seen by a fenced read or an accepted write, per resource.
    fence: BTreeMap<String, u64>,
    writes: Vec<Write>,
}

#[derive(Clone)]
pub struct FencedStore {
    state: Arc<Mutex<State>>,
    fencing: bool,
}

impl FencedStore {
    pub fn new(fencing: bool) -> Self {
        Self { state: Arc::default(), fencing }
    }

    /// Applies one write: accepted when its token is above every token accepted
    /// for the resource (or always, with fencing off).
    pub fn write(&self, resource: &str, token: u64, value: &str) -> Result<(), u64> {
        let mut state = self.state.lock().unwrap();
        let highest = state.highest.get(resource).map(|(token, _)| *token).unwrap_or(0);
        let fence = state.fence.get(resource).copied().unwrap_or(0);
        let accepted = !self.fencing || (token > highest && token >= fence);
        state.writes.push(Write { resource: resource.into(), token, value: value.into(), accepted });
        if accepted {
            state.highest.insert(resource.to_string(), (token.max(highest), value.to_string()));
            state.fence.insert(resource.to_string(), token.max(fence));
            Ok(())
        } else {
            Err(highest.max(fence))
        }
    }

    /// A fenced read: refused (with the fence) when `token` is below the
    /// resource's fence, else raises the fence to `token` and returns the value.
    pub fn fenced_read(&self, resource: &str, token: u64) -> Result<Option<(u64, String)>, u64> {
        let mut state = self.state.lock().unwrap();
        let fence = state.fence.get(resource).copied().unwrap_or(0);
        if self.fencing && token < fence {
            return Err(fence);
        }
        state.fence.insert(resource.to_string(), token.max(fence));
        Ok(state.highest.get(resource).cloned())
    }

    pub fn read(&self, resource: &str) -> Option<(u64, String)> {
        self.state.lock().unwrap().highest.get(resource).cloned()
    }

    pub fn writes(&self) -> Vec<Write> {
        self.state.lock().unwrap().writes.clone()
    }

    pub fn accepted_writes(&self, resource: &str) -> Vec<Write> {
        self.writes().into_iter().filter(|write| write.resource == resource && write.accepted).collect()
    }

    /// Serves the line protocol on an ephemeral loopback port.
    pub async fn serve(&self) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let store = self.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let store = store.clone();
                tokio::spawn(async move {
                    let (reader, mut writer) = stream.into_split();
                    let mut lines = BufReader::new(reader).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let reply = store.answer(&line);
                        if writer.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(address)
    }

    fn answer(&self, line: &str) -> String {
        let parts: Vec<&str> = line.splitn(4, ' ').collect();
        match parts.as_slice() {
            ["WRITE", resource, token, value] => match token.parse::<u64>() {
                Ok(token) => match self.write(resource, token, value) {
                    Ok(()) => "ACCEPTED\n".into(),
                    Err(highest) => format!("REJECTED {highest}\n"),
                },
                Err(_) => "ERROR token is not a number\n".into(),
            },
            ["FREAD", resource, token] => match token.parse::<u64>() {
                Ok(token) => match self.fenced_read(resource, token) {
                    Ok(Some((token, value))) => format!("VALUE {token} {value}\n"),
                    Ok(None) => "EMPTY\n".into(),
                    Err(fence) => format!("REJECTED {fence}\n"),
                },
                Err(_) => "ERROR token is not a number\n".into(),
            },
            ["READ", resource] => match self.read(resource) {
                Some((token, value)) => format!("VALUE {token} {value}\n"),
                None => "EMPTY\n".into(),
            },
            _ => "ERROR unknown request\n".into(),
        }
    }
}

/// Sends one request line and returns the answer line.
pub async fn remote_request(store: SocketAddr, line: &str) -> std::io::Result<String> {
    let stream = tokio::net::TcpStream::connect(store).await?;
    let (reader, mut writer) = stream.into_split();
    writer.write_all(format!("{line}\n").as_bytes()).await?;
    let mut lines = BufReader::new(reader).lines();
    match lines.next_line().await? {
        Some(answer) => Ok(answer),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the store closed the connection without answering",
        )),
    }
}

/// A client of the line protocol, for worker processes.
pub async fn remote_write(store: SocketAddr, resource: &str, token: u64, value: &str) -> std::io::Result<String> {
    let stream = tokio::net::TcpStream::connect(store).await?;
    let (reader, mut writer) = stream.into_split();
    writer.write_all(format!("WRITE {resource} {token} {value}\n").as_bytes()).await?;
    let mut lines = BufReader::new(reader).lines();
    Ok(lines.next_line().await?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_tokens_are_rejected_only_with_fencing() {
        let fenced = FencedStore::new(true);
        assert_eq!(fenced.write("orders/42", 10, "charge-b"), Ok(()));
        assert_eq!(fenced.write("orders/42", 7, "charge-a"), Err(10));
        assert_eq!(fenced.accepted_writes("orders/42").len(), 1);

        let unfenced = FencedStore::new(false);
        assert_eq!(unfenced.write("orders/42", 10, "charge-b"), Ok(()));
        assert_eq!(unfenced.write("orders/42", 7, "charge-a"), Ok(()));
        assert_eq!(unfenced.accepted_writes("orders/42").len(), 2);
    }

    #[test]
    fn a_fenced_read_stops_the_superseded_writer() {
        let store = FencedStore::new(true);
        assert_eq!(store.fenced_read("counter", 5), Ok(None));
        assert_eq!(store.fenced_read("counter", 9), Ok(None));
        // The holder of 5 read before 9 did; its write back must be refused.
        assert_eq!(store.write("counter", 5, "a"), Err(9));
        assert_eq!(store.write("counter", 9, "b"), Ok(()));
        assert_eq!(store.fenced_read("counter", 7), Err(9));
        assert_eq!(store.answer("FREAD counter 9"), "VALUE 9 b\n");

        let unfenced = FencedStore::new(false);
        assert_eq!(unfenced.fenced_read("counter", 9), Ok(None));
        assert_eq!(unfenced.write("counter", 5, "a"), Ok(()));
    }
}
