//! Who a certificate says it is. Nodes and tenants are named by DNS names in their
//! certificates' subject alternative names, so that any CA can issue them and rustls
//! can check a node's name when a peer connects to it:
//!
//! * a node: `node-<id>.leasehold` (on both ports; peers refuse any other);
//! * a tenant's client certificate: `<tenant>.<tag>.tenant.leasehold`, where the tag
//!   is derived from the tenant's current token (`certificate_tag`). A certificate is
//!   so bound to the tenant as it is now, not to its name alone: rotating the token,
//!   or removing the tenant (a later tenant of the same name gets a new token), makes
//!   every certificate made before stop working, as the old token does.

/// What every tenant certificate's DNS name ends with.
pub const TENANT_NAME_SUFFIX: &str = ".tenant.leasehold";

/// Hex digits in a certificate tag (64 bits of a hash of the token's hash).
pub const CERTIFICATE_TAG_DIGITS: usize = 16;

/// The DNS name that identifies node `id` in its certificate.
pub fn node_identity(id: u64) -> String {
    format!("node-{id}.leasehold")
}

/// The node id a DNS name identifies, if it is a node's name.
pub fn node_id_of(name: &str) -> Option<u64> {
    let id = name.strip_prefix("node-")?.strip_suffix(".leasehold")?;
    if id.is_empty() || !id.bytes().all(|byte| byte.is_ascii_digit()) || id.starts_with('0') {
        return None;
    }
    id.parse().ok()
}

/// The hash a tenant's token is kept as by the cluster: SHA-256, first 128 bits.
pub fn token_hash(token: &str) -> [u8; 16] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut hash = [0u8; 16];
    hash.copy_from_slice(&digest.as_ref()[..16]);
    hash
}

/// The tag that binds a tenant certificate to the tenant's token, from the token's
/// hash (which every node keeps). Not a secret: it proves nothing without the CA's
/// signature, and names a token without revealing it.
pub fn certificate_tag(token_hash: &[u8; 16]) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(b"leasehold tenant certificate tag\0");
    context.update(token_hash);
    let digest = context.finish();
    digest.as_ref()[..CERTIFICATE_TAG_DIGITS / 2].iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The DNS name that identifies tenant `name`, holding the token whose hash gives
/// `tag`, in a client certificate.
pub fn tenant_identity(name: &str, tag: &str) -> String {
    format!("{name}.{tag}{TENANT_NAME_SUFFIX}")
}

/// A tenant certificate's name, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantName<'a> {
    /// `<tenant>.<tag>.tenant.leasehold`.
    Tagged { tenant: &'a str, tag: &'a str },
    /// `<tenant>.tenant.leasehold`: the form before certificates were bound to a
    /// token, which no longer authenticates (refused with a reason that says so).
    Untagged { tenant: &'a str },
}

impl<'a> TenantName<'a> {
    pub fn tenant(&self) -> &'a str {
        match self {
            TenantName::Tagged { tenant, .. } | TenantName::Untagged { tenant } => tenant,
        }
    }
}

/// The tenant a DNS name identifies, if it is a tenant's name.
pub fn tenant_of(name: &str) -> Option<TenantName<'_>> {
    let rest = name.strip_suffix(TENANT_NAME_SUFFIX)?;
    match rest.split_once('.') {
        None => (!rest.is_empty()).then_some(TenantName::Untagged { tenant: rest }),
        Some((tenant, tag)) => {
            let tag_is_hex = tag.len() == CERTIFICATE_TAG_DIGITS
                && tag.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte));
            (!tenant.is_empty() && tag_is_hex).then_some(TenantName::Tagged { tenant, tag })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        assert_eq!(node_id_of(&node_identity(3)), Some(3));
        let tag = certificate_tag(&token_hash("tenant_0123456789abcdef"));
        assert_eq!(tag.len(), CERTIFICATE_TAG_DIGITS);
        assert_eq!(
            tenant_of(&tenant_identity("payments", &tag)),
            Some(TenantName::Tagged { tenant: "payments", tag: &tag })
        );
        assert_eq!(tenant_of("payments.tenant.leasehold"), Some(TenantName::Untagged { tenant: "payments" }));
        for not_a_node in ["node-.leasehold", "node-03.leasehold", "node-3.leasehold.evil", "node-x.leasehold", "3"] {
            assert_eq!(node_id_of(not_a_node), None, "{not_a_node}");
        }
        let too_short = format!("a.{}.tenant.leasehold", &tag[1..]);
        let upper = format!("a.{}.tenant.leasehold", tag.to_uppercase());
        let extra_label = format!("a.b.{tag}.tenant.leasehold");
        let no_tenant = format!(".{tag}.tenant.leasehold");
        for not_a_tenant in [
            ".tenant.leasehold",
            "node-1.leasehold",
            &too_short,
            &upper,
            &extra_label,
            &no_tenant,
            "a.b.tenant.leasehold",
        ] {
            assert_eq!(tenant_of(not_a_tenant), None, "{not_a_tenant}");
        }
    }

    #[test]
    fn a_new_token_gives_a_new_tag() {
        let first = certificate_tag(&token_hash("tenant_first"));
        assert_eq!(first, certificate_tag(&token_hash("tenant_first")));
        assert_ne!(first, certificate_tag(&token_hash("tenant_second")));
    }
}
