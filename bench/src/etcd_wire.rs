//! The few messages of etcd's v3 gRPC API the benchmark uses, declared by hand.
//!
//! Why by hand: the `etcd-client` crates generate their types at build time and need
//! `protoc` (0.9 and later), or bundle it through prost-build 0.9 (0.8.x), whose
//! default `regex` features reach bindgen's build graph and force RocksDB's C++ to be
//! compiled again. The messages below are the documented wire format of etcd's
//! stable v3 API (field numbers and types); only the fields the benchmark reads are
//! declared, which protobuf allows (unknown fields are skipped).

use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::transport::Transport;

/// How long connecting to one member may take.
pub const CONNECT_TIMEOUT_MS: u64 = 1_000;

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl_seconds: i64,
    /// Zero: the server picks the id.
    #[prost(int64, tag = "2")]
    pub id: i64,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl_seconds: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    /// Zero or less when the lease is gone.
    #[prost(int64, tag = "3")]
    pub ttl_seconds: i64,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct StatusRequest {}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(string, tag = "2")]
    pub version: String,
    /// The member id of the leader (0 when none is known).
    #[prost(uint64, tag = "4")]
    pub leader: u64,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LockRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub name: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LockResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    /// The key that holds the lock until it is deleted (Unlock) or its lease ends.
    #[prost(bytes = "vec", tag = "2")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UnlockRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UnlockResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
pub const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
pub const MAINTENANCE_STATUS: &str = "/etcdserverpb.Maintenance/Status";
pub const LOCK: &str = "/v3lockpb.Lock/Lock";
pub const UNLOCK: &str = "/v3lockpb.Lock/Unlock";

/// The members of one etcd cluster and how to reach them.
#[derive(Debug, Clone)]
pub struct EtcdMembers {
    /// Each member's client address, host:port (no scheme).
    pub endpoints: Vec<String>,
    /// The CA that signed the members' client-port certificates: with it every
    /// connection is TLS (https) and trusts that CA only; without it, plaintext.
    pub ca: Option<Certificate>,
}

impl EtcdMembers {
    pub fn transport(&self) -> Transport {
        if self.ca.is_some() {
            Transport::Tls
        } else {
            Transport::Plaintext
        }
    }

    /// A new connection to member `index` (its own TCP connection and, with TLS, its
    /// own handshake), as an etcd client process would have.
    pub async fn connect(&self, index: usize) -> Result<EtcdConnection, tonic::transport::Error> {
        let endpoint = &self.endpoints[index];
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        let mut builder = Endpoint::from_shared(format!("{scheme}://{endpoint}"))?
            .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .tcp_nodelay(true);
        if let Some(ca) = &self.ca {
            // The members' certificates name 127.0.0.1 (an IP SAN), which is what is dialled.
            builder = builder.tls_config(ClientTlsConfig::new().ca_certificate(ca.clone()))?;
        }
        let channel = builder.connect().await?;
        Ok(EtcdConnection { grpc: tonic::client::Grpc::new(channel) })
    }
}

/// A connection to one etcd member.
#[derive(Clone)]
pub struct EtcdConnection {
    grpc: tonic::client::Grpc<Channel>,
}

impl EtcdConnection {
    pub async fn unary<Request, Response>(
        &mut self,
        path: &'static str,
        request: Request,
    ) -> Result<Response, tonic::Status>
    where
        Request: prost::Message + Send + Sync + 'static,
        Response: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc.ready().await.map_err(|error| tonic::Status::unavailable(error.to_string()))?;
        let codec = tonic_prost::ProstCodec::<Request, Response>::default();
        let response = self.grpc.unary(tonic::Request::new(request), PathAndQuery::from_static(path), codec).await?;
        Ok(response.into_inner())
    }

    /// Opens a lease keepalive stream whose first request is `first`; later requests
    /// go to the returned sender. The first request is queued before the stream is
    /// opened: etcd sends the response headers only with its first answer.
    pub async fn keep_alive_stream(
        &mut self,
        first: LeaseKeepAliveRequest,
    ) -> Result<
        (tokio::sync::mpsc::Sender<LeaseKeepAliveRequest>, tonic::codec::Streaming<LeaseKeepAliveResponse>),
        tonic::Status,
    > {
        let (sender, requests) = tokio::sync::mpsc::channel(1);
        sender.try_send(first).expect("an empty channel of capacity 1 takes one request");
        self.grpc.ready().await.map_err(|error| tonic::Status::unavailable(error.to_string()))?;
        let codec = tonic_prost::ProstCodec::<LeaseKeepAliveRequest, LeaseKeepAliveResponse>::default();
        let stream = tokio_stream::wrappers::ReceiverStream::new(requests);
        let response = self
            .grpc
            .streaming(tonic::Request::new(stream), PathAndQuery::from_static(LEASE_KEEP_ALIVE), codec)
            .await?;
        Ok((sender, response.into_inner()))
    }
}
