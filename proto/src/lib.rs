//! Leasehold's gRPC API: the types and services generated from `proto/leasehold.proto`,
//! and `errors`, the one place where an error status gets its machine-readable reason
//! and where a client reads it back.

tonic::include_proto!("leasehold.v1");

pub mod errors;
