//! Leasehold's gRPC API: the types and services generated from `proto/leasehold.proto`;
//! `errors`, the one place where an error status gets its machine-readable reason and
//! where a client reads it back; `identity`, how certificates name nodes and
//! tenants; and `lease`, the timings of the lease contract both sides keep.

tonic::include_proto!("leasehold.v1");

pub mod errors;
pub mod identity;
pub mod lease;
