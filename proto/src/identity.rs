//! Who a certificate says it is. Nodes and tenants are named by DNS names in their
//! certificates' subject alternative names, so that any CA can issue them and rustls
//! can check a node's name when a peer connects to it:
//!
//! * a node: `node-<id>.leasehold` (on both ports; peers refuse any other);
//! * a tenant's client certificate: `<tenant>.tenant.leasehold`.

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

/// The DNS name that identifies tenant `name` in a client certificate.
pub fn tenant_identity(name: &str) -> String {
    format!("{name}.tenant.leasehold")
}

/// The tenant a DNS name identifies, if it is a tenant's name.
pub fn tenant_of(name: &str) -> Option<&str> {
    let tenant = name.strip_suffix(".tenant.leasehold")?;
    (!tenant.is_empty() && !tenant.contains('.')).then_some(tenant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_refused() {
        assert_eq!(node_id_of(&node_identity(3)), Some(3));
        assert_eq!(tenant_of(&tenant_identity("payments")), Some("payments"));
        for not_a_node in ["node-.leasehold", "node-03.leasehold", "node-3.leasehold.evil", "node-x.leasehold", "3"] {
            assert_eq!(node_id_of(not_a_node), None, "{not_a_node}");
        }
        for not_a_tenant in [".tenant.leasehold", "a.b.tenant.leasehold", "node-1.leasehold"] {
            assert_eq!(tenant_of(not_a_tenant), None, "{not_a_tenant}");
        }
    }
}
