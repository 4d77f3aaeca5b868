//! Who acts: the cluster, the admin or a tenant, with the hash of the secret a
//! request presented. The gRPC layer derives a `Caller` from each request's credential
//! and every command reaches the machine with one.

use serde::{Deserialize, Serialize};

/// A tenant's number: given in order of creation, never reused.
pub type TenantId = u32;

/// The admin's own namespace: sessions made with the admin credential live here. It
/// always exists, has no token (the admin credential is each node's own file) and no
/// quotas.
pub const ADMIN_TENANT: TenantId = 0;
pub const ADMIN_TENANT_NAME: &str = "admin";

/// A truncated SHA-256 of a secret (a session secret or a tenant token): 128 bits, as
/// many as the secrets have, and nothing a replica's disk would give away.
pub type SecretHash = [u8; 16];

/// Who a command comes from, as the gRPC layer authenticated it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The cluster itself: the leader's `ExpireSessions`. Never derived from a request.
    Cluster,
    /// The admin credential, acting in the admin namespace or on tenants.
    Admin {
        /// The hash of the session secret the request presented (zeros without one);
        /// for `CreateSession`, of the new session's secret.
        secret: SecretHash,
    },
    /// A tenant's credential.
    Tenant { tenant: TenantId, secret: SecretHash },
}

impl Caller {
    /// The namespace the caller acts in; `None` for the cluster.
    pub fn tenant(&self) -> Option<TenantId> {
        match self {
            Caller::Cluster => None,
            Caller::Admin { .. } => Some(ADMIN_TENANT),
            Caller::Tenant { tenant, .. } => Some(*tenant),
        }
    }

    pub(super) fn secret(&self) -> Option<&SecretHash> {
        match self {
            Caller::Cluster => None,
            Caller::Admin { secret } | Caller::Tenant { secret, .. } => Some(secret),
        }
    }
}
