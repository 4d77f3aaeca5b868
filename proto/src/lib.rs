//! Leasehold's gRPC API: the types and services generated from `proto/leasehold.proto`;
//! `errors`, the one place where an error status gets its machine-readable reason and
//! where a client reads it back; and `identity`, how certificates name nodes and
//! tenants.

tonic::include_proto!("leasehold.v1");

pub mod errors;
pub mod identity;
