//! The KeepAlive stream's contract, through the raw gRPC API, on a 3-node cluster of
//! real processes: what a client library other than ours relies on.

use std::time::Duration;

use futures::channel::mpsc;
use futures::SinkExt;
use leasehold::client::Transport;
use leasehold::proto::leasehold_client::LeaseholdClient;
use leasehold::proto::{self as pb};
use leasehold_jepsen::cluster::{ClusterOptions, TestCluster};
use tonic::{Code, Streaming};

const LEADER_DEADLINE: Duration = Duration::from_secs(20);
const ANSWER_DEADLINE: Duration = Duration::from_secs(5);
/// Long enough that a loaded CI machine answering slowly does not fail the test.
const TTL_MS: u64 = 2_000;

type Raw = LeaseholdClient<Transport>;

/// The generated client on one node's connection, with the test tenant's TLS and token.
async fn raw_client(cluster: &TestCluster, address: &str) -> Raw {
    LeaseholdClient::new(cluster.client().raw_channel(address).expect("a channel"))
}

/// A session made through the raw API: its id and its secret.
async fn raw_session(raw: &mut Raw, sequence: u64) -> (u64, Vec<u8>) {
    let request_id = Some(pb::RequestId { client_id: 5151, sequence });
    let created = raw
        .create_session(pb::CreateSessionRequest { request_id, ttl_ms: TTL_MS, client_name: "raw".into() })
        .await
        .expect("create session")
        .into_inner();
    (created.session_id, created.session_secret)
}

async fn exists(raw: &mut Raw, session_id: u64) -> bool {
    match raw.describe_session(pb::DescribeSessionRequest { session_id, stale: false }).await {
        Ok(_) => true,
        Err(status) if status.code() == Code::NotFound => false,
        Err(status) => panic!("describe session {session_id}: {status}"),
    }
}

/// One keepalive stream: what is sent, and the answers.
struct Stream {
    requests: mpsc::UnboundedSender<pb::KeepAliveRequest>,
    answers: Streaming<pb::KeepAliveResponse>,
}

impl Stream {
    async fn open(raw: &mut Raw) -> Result<Stream, tonic::Status> {
        let (requests, outgoing) = mpsc::unbounded();
        let answers = raw.keep_alive(outgoing).await?.into_inner();
        Ok(Stream { requests, answers })
    }

    async fn send(&mut self, session_id: u64, secret: &[u8]) {
        let keepalive = pb::KeepAliveRequest { session_id, session_secret: secret.to_vec() };
        self.requests.send(keepalive).await.expect("the stream is open");
    }

    async fn answer(&mut self) -> pb::KeepAliveResponse {
        tokio::time::timeout(ANSWER_DEADLINE, self.answers.message())
            .await
            .expect("a keepalive is answered within the deadline")
            .expect("no stream error")
            .expect("the stream goes on")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_are_answered_in_order_and_keep_only_their_session_alive() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let mut raw = raw_client(&cluster, &cluster.nodes[&leader].client_addr).await;
    let (kept, kept_secret) = raw_session(&mut raw, 1).await;
    let (idle, idle_secret) = raw_session(&mut raw, 2).await;
    let (closed, closed_secret) = raw_session(&mut raw, 3).await;
    raw.close_session(pb::CloseSessionRequest {
        request_id: Some(pb::RequestId { client_id: 5151, sequence: 4 }),
        session_id: closed,
        session_secret: closed_secret.clone(),
    })
    .await
    .expect("close session");
    let mut stream = Stream::open(&mut raw).await.expect("the leader accepts a keepalive stream");

    // A burst on one stream: answered one by one, in the order sent; a session that
    // is unknown or closed is reported not alive, and the stream goes on.
    let unknown = kept + idle + closed + 1_000;
    for (session, secret) in
        [(kept, &kept_secret), (unknown, &kept_secret), (closed, &closed_secret), (kept, &kept_secret)]
    {
        stream.send(session, secret).await;
    }
    let answers: Vec<(u64, bool)> = {
        let mut answers = Vec::new();
        for _ in 0..4 {
            let answer = stream.answer().await;
            answers.push((answer.session_id, answer.alive));
            if answer.alive {
                assert!(answer.ttl_ms > 0 && answer.ttl_ms <= TTL_MS, "ttl left {} of {TTL_MS}", answer.ttl_ms);
            } else {
                assert_eq!(answer.ttl_ms, 0, "a session that is gone has no time left");
            }
        }
        answers
    };
    assert_eq!(answers, vec![(kept, true), (unknown, false), (closed, false), (kept, true)]);

    // Kept alive every quarter TTL for three TTLs: the kept session lives. The idle
    // one gets keepalives too, with its id but without its secret (the kept session's
    // instead): each is answered not alive, renews nothing, and the session expires.
    let mut cadence = tokio::time::interval(Duration::from_millis(TTL_MS / 4));
    for _ in 0..12 {
        cadence.tick().await;
        stream.send(kept, &kept_secret).await;
        let answer = stream.answer().await;
        assert_eq!((answer.session_id, answer.alive), (kept, true));
        stream.send(idle, &kept_secret).await;
        let answer = stream.answer().await;
        assert_eq!((answer.session_id, answer.alive), (idle, false), "a keepalive without the secret");
    }
    assert!(exists(&mut raw, kept).await, "a session kept alive for 3 TTLs still exists");
    leasehold_jepsen::wait::until(Duration::from_secs(10), "the idle session to expire", || {
        let mut raw = raw.clone();
        async move { (!exists(&mut raw, idle).await).then_some(()) }
    })
    .await;
    stream.send(idle, &idle_secret).await;
    let answer = stream.answer().await;
    assert_eq!((answer.session_id, answer.alive, answer.ttl_ms), (idle, false, 0), "an expired session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_stream_on_a_follower_is_refused_naming_the_leader() {
    let cluster = TestCluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(LEADER_DEADLINE).await;
    let leader_addr = cluster.nodes[&leader].client_addr.clone();
    let follower = *cluster.nodes.keys().find(|id| **id != leader).expect("3 nodes");
    // The follower must know the leader before it can name it.
    cluster.wait_applied(follower, 1, LEADER_DEADLINE).await;
    let raw = raw_client(&cluster, &cluster.nodes[&follower].client_addr).await;
    let refused = leasehold_jepsen::wait::until(Duration::from_secs(10), "the follower to name the leader", || {
        let mut raw = raw.clone();
        let leader_addr = leader_addr.clone();
        async move {
            let status = match Stream::open(&mut raw).await {
                Ok(_) => panic!("a follower accepted a keepalive stream"),
                Err(status) => status,
            };
            let named = status.metadata().get("leasehold-leader").and_then(|value| value.to_str().ok());
            (named == Some(leader_addr.as_str())).then_some(status)
        }
    })
    .await;
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(refused.message().contains(&leader_addr), "the message names the leader: {}", refused.message());
}
