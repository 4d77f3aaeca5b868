//! Who a request's credential is, answered without touching the replicated state: the
//! tenants' token hashes and names as of the last applied entry, swapped whole when a
//! tenant is added, rotated or removed (rare), read by every request (often).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use leasehold_proto::identity::certificate_tag;

use crate::machine::{SecretHash, StateMachine, TenantId, ADMIN_TENANT};

/// The admin credential (and the scrape token) is a secret like any other: at least
/// 128 bits' worth of text.
pub const ADMIN_TOKEN_BYTES_MIN: usize = 16;
pub const ADMIN_TOKEN_BYTES_MAX: usize = 4_096;

/// Reads the admin credential from its file: the first line, trimmed.
pub fn read_admin_token(path: &std::path::Path) -> Result<String, String> {
    read_token_file("admin", path)
}

/// Reads a node's credential (`what`: "admin", "scrape") from its file: the first
/// line, trimmed, `ADMIN_TOKEN_BYTES_MIN` to `ADMIN_TOKEN_BYTES_MAX` bytes.
pub fn read_token_file(what: &str, path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read the {what} token file {}: {error}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.len() < ADMIN_TOKEN_BYTES_MIN || token.len() > ADMIN_TOKEN_BYTES_MAX {
        return Err(format!(
            "the {what} token in {} is {} bytes on its first line; it must be {ADMIN_TOKEN_BYTES_MIN} to \
             {ADMIN_TOKEN_BYTES_MAX} (ADMIN_TOKEN_BYTES_MIN, ADMIN_TOKEN_BYTES_MAX)",
            path.display(),
            token.len()
        ));
    }
    Ok(token)
}

/// A tenant as requests are checked against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownTenant {
    pub id: TenantId,
    pub name: Arc<str>,
    /// The tag its client certificates must carry (`identity::certificate_tag` of
    /// its token's hash); `None` for the admin namespace, which has no token.
    pub certificate_tag: Option<Arc<str>>,
}

#[derive(Debug, Default)]
struct Index {
    by_token: BTreeMap<SecretHash, KnownTenant>,
    by_name: BTreeMap<Arc<str>, KnownTenant>,
}

#[derive(Debug)]
pub struct Credentials {
    index: RwLock<Arc<Index>>,
    /// Counts the changes of what a credential may be (tenants added, rotated or
    /// removed; the admin token read again), so that an open stream checks its
    /// credential again only after one.
    generation: watch::Sender<u64>,
}

impl Default for Credentials {
    fn default() -> Credentials {
        Credentials { index: RwLock::default(), generation: watch::Sender::new(0) }
    }
}

impl Credentials {
    /// Rebuilds the index from `machine`'s tenants (after an entry that changed them, or
    /// a snapshot).
    pub fn refresh(&self, machine: &StateMachine) {
        let mut index = Index::default();
        for (id, tenant) in machine.tenants() {
            let known = KnownTenant {
                id,
                name: Arc::from(&*tenant.name),
                certificate_tag: tenant.token_hash.map(|hash| Arc::from(certificate_tag(&hash))),
            };
            if let Some(token_hash) = tenant.token_hash {
                index.by_token.insert(token_hash, known.clone());
            }
            if id != ADMIN_TENANT {
                index.by_name.insert(known.name.clone(), known);
            }
        }
        *self.index.write().unwrap() = Arc::new(index);
        self.changed();
    }

    /// Tells open streams that credentials changed (also the admin token's reload).
    pub fn changed(&self) {
        self.generation.send_modify(|generation| *generation += 1);
    }

    /// The number of changes so far.
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Wakes on every later change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The tenant whose token hashes to `token_hash`.
    pub fn by_token(&self, token_hash: &SecretHash) -> Option<KnownTenant> {
        self.index.read().unwrap().by_token.get(token_hash).cloned()
    }

    /// The tenant named `name` (as a client certificate names it).
    pub fn by_name(&self, name: &str) -> Option<KnownTenant> {
        self.index.read().unwrap().by_name.get(name).cloned()
    }
}

/// The hash a secret is kept and compared as: SHA-256, truncated to 128 bits.
pub fn secret_hash(secret: &[u8]) -> SecretHash {
    let digest = ring::digest::digest(&ring::digest::SHA256, secret);
    let mut hash = SecretHash::default();
    let length = hash.len();
    hash.copy_from_slice(&digest.as_ref()[..length]);
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `leasehold cert tenant` derives a certificate's tag from the token's hash as
    /// the client computes it; the nodes from the hash they keep. They must agree.
    #[test]
    fn a_token_hashes_here_as_the_certificate_maker_hashes_it() {
        let token = "tenant_00112233445566778899aabbccddeeff";
        assert_eq!(secret_hash(token.as_bytes()), leasehold_proto::identity::token_hash(token));
    }
}
