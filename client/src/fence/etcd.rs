//! Fenced writes to etcd v3 (feature `fence-etcd`), over etcd's gRPC API with tonic.
//!
//! A resource is two keys, `leasehold/fence/<resource>/token` (20 zero-padded digits:
//! etcd compares values as bytes, so byte order must be number order) and
//! `…/value`. One transaction decides and writes:
//!
//! - if the token key's `create_revision` is 0 (it does not exist): put both keys;
//! - else a nested transaction: once per grant, `value(token key) < ours` puts both
//!   and anything else reads the stored token; many per grant, `value > ours` reads
//!   the stored token (refused) and anything else puts both.
//!
//! (etcd fails every value comparison on a missing key, hence the outer check.)
//! Linearizable and durable once acknowledged; one Raft entry per write.
//!
//! The few messages of etcd's stable v3 API used here are declared by hand (field
//! numbers and types as etcd publishes them): generating them needs `protoc` or a
//! build-time dependency that reaches RocksDB's build graph.

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use super::{
    check_resource, check_write, padded, parse_stored, FenceError, FencedStore, FencingToken, Mode, Outcome, Record,
};

const STORE: &str = "etcd";

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "leasehold/fence/";

const TXN: &str = "/etcdserverpb.KV/Txn";

// Compare.CompareResult and Compare.CompareTarget.
const EQUAL: i32 = 0;
const GREATER: i32 = 1;
const LESS: i32 = 2;
const TARGET_CREATE: i32 = 1;
const TARGET_VALUE: i32 = 3;

#[derive(Clone, PartialEq, ::prost::Message)]
struct Compare {
    #[prost(int32, tag = "1")]
    result: i32,
    #[prost(int32, tag = "2")]
    target: i32,
    #[prost(bytes = "vec", tag = "3")]
    key: Vec<u8>,
    /// One of the `target_union` oneof's members; only the one matching `target` is set.
    #[prost(int64, optional, tag = "5")]
    create_revision: Option<i64>,
    #[prost(bytes = "vec", optional, tag = "7")]
    value: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, ::prost::Oneof)]
enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "4")]
    Txn(TxnRequest),
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 4")]
    request: Option<Request>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    failure: Vec<RequestOp>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct RangeResponse {
    #[prost(message, repeated, tag = "2")]
    kvs: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct PutResponse {}

#[derive(Clone, PartialEq, ::prost::Oneof)]
enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
    #[prost(message, tag = "2")]
    Put(PutResponse),
    #[prost(message, tag = "4")]
    Txn(TxnResponse),
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct ResponseOp {
    #[prost(oneof = "Response", tags = "1, 2, 4")]
    response: Option<Response>,
}

#[derive(Clone, PartialEq, ::prost::Message)]
struct TxnResponse {
    #[prost(bool, tag = "2")]
    succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    responses: Vec<ResponseOp>,
}

fn store_error(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> FenceError {
    FenceError::store(STORE, error)
}

/// Fenced keys in one etcd cluster, through one gRPC channel.
#[derive(Clone)]
pub struct EtcdFence {
    channel: Channel,
    prefix: String,
}

impl EtcdFence {
    /// Connects to one member, `http://host:port` (plain gRPC).
    pub async fn connect(url: &str) -> Result<Self, FenceError> {
        let endpoint =
            Endpoint::from_shared(url.to_string()).map_err(|error| FenceError::Invalid(error.to_string()))?;
        let channel = endpoint
            .connect_timeout(std::time::Duration::from_secs(5))
            .timeout(std::time::Duration::from_secs(10))
            .connect()
            .await
            .map_err(store_error)?;
        Ok(EtcdFence::with_prefix(channel, DEFAULT_PREFIX))
    }

    /// The caller's channel (with its TLS and timeouts) and a key prefix.
    pub fn with_prefix(channel: Channel, prefix: &str) -> Self {
        EtcdFence { channel, prefix: prefix.to_string() }
    }

    fn keys(&self, resource: &str) -> (Vec<u8>, Vec<u8>) {
        (
            format!("{}{resource}/token", self.prefix).into_bytes(),
            format!("{}{resource}/value", self.prefix).into_bytes(),
        )
    }

    async fn unary<Q, A>(&self, path: &'static str, request: Q) -> Result<A, FenceError>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(store_error)?;
        let codec = tonic_prost::ProstCodec::<Q, A>::default();
        let answer = grpc
            .unary(tonic::Request::new(request), PathAndQuery::from_static(path), codec)
            .await
            .map_err(store_error)?;
        Ok(answer.into_inner())
    }

    async fn run(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: Option<&[u8]>,
    ) -> Result<Outcome, FenceError> {
        check_write(resource, token)?;
        let (token_key, value_key) = self.keys(resource);
        let ours = padded(token.get()).into_bytes();
        let put = |key: &[u8], value: &[u8]| RequestOp {
            request: Some(Request::Put(PutRequest { key: key.to_vec(), value: value.to_vec() })),
        };
        let mut puts = vec![put(&token_key, &ours)];
        if let Some(value) = value {
            puts.push(put(&value_key, value));
        }
        let read = vec![RequestOp { request: Some(Request::Range(RangeRequest { key: token_key.clone() })) }];
        let compare_value = |result| Compare {
            result,
            target: TARGET_VALUE,
            key: token_key.clone(),
            create_revision: None,
            value: Some(ours.clone()),
        };
        let nested = match mode {
            Mode::OncePerGrant => {
                TxnRequest { compare: vec![compare_value(LESS)], success: puts.clone(), failure: read }
            }
            Mode::ManyPerGrant => {
                TxnRequest { compare: vec![compare_value(GREATER)], success: read, failure: puts.clone() }
            }
        };
        let request = TxnRequest {
            compare: vec![Compare {
                result: EQUAL,
                target: TARGET_CREATE,
                key: token_key.clone(),
                create_revision: Some(0),
                value: None,
            }],
            success: puts,
            failure: vec![RequestOp { request: Some(Request::Txn(nested)) }],
        };
        let answer: TxnResponse = self.unary(TXN, request).await?;
        if answer.succeeded {
            return Ok(Outcome::Accepted);
        }
        let Some(ResponseOp { response: Some(Response::Txn(nested)) }) = answer.responses.into_iter().next() else {
            return Err(store_error("the fence transaction answered without its nested transaction"));
        };
        let accepted = match mode {
            Mode::OncePerGrant => nested.succeeded,
            Mode::ManyPerGrant => !nested.succeeded,
        };
        if accepted {
            return Ok(Outcome::Accepted);
        }
        match nested.responses.into_iter().next() {
            Some(ResponseOp { response: Some(Response::Range(range)) }) => match range.kvs.first() {
                Some(stored) => Ok(Outcome::Superseded { seen: parse_stored(STORE, &stored.value)?, ours: token }),
                None => Err(store_error("the fence key vanished after a refusal")),
            },
            other => Err(store_error(format!("the fence transaction answered {other:?}"))),
        }
    }
}

impl FencedStore for EtcdFence {
    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        mode: Mode,
        value: &[u8],
    ) -> Result<Outcome, FenceError> {
        self.run(resource, token, mode, Some(value)).await
    }

    async fn advance(&self, resource: &str, token: FencingToken, mode: Mode) -> Result<Outcome, FenceError> {
        self.run(resource, token, mode, None).await
    }

    async fn read(&self, resource: &str) -> Result<Option<Record>, FenceError> {
        check_resource(resource)?;
        let (token_key, value_key) = self.keys(resource);
        // Both keys in one linearizable transaction, so they come from one revision.
        let range = |key: Vec<u8>| RequestOp { request: Some(Request::Range(RangeRequest { key })) };
        let request =
            TxnRequest { compare: vec![], success: vec![range(token_key), range(value_key)], failure: vec![] };
        let answer: TxnResponse = self.unary(TXN, request).await?;
        let mut found = answer.responses.into_iter().map(|op| match op.response {
            Some(Response::Range(range)) => range.kvs.into_iter().next().map(|kv| kv.value),
            _ => None,
        });
        let (token, value) = (found.next().flatten(), found.next().flatten());
        match token {
            None => Ok(None),
            Some(token) => Ok(Some(Record { token: parse_stored(STORE, &token)?, value })),
        }
    }
}
