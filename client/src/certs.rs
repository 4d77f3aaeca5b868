//! Certificates for a local cluster and for tests (`leasehold cert`): a CA, node
//! certificates naming `node-<id>.leasehold`, and tenant client certificates naming
//! `<tenant>.<tag>.tenant.leasehold` (see `leasehold_proto::identity`). Made with rcgen
//! (ECDSA P-256), no network and no openssl. A production cluster can use any CA
//! that issues the same names.
//!
//! Files in a certificate directory: `ca.pem`, `ca.key`; `node-<id>.pem`,
//! `node-<id>.key`; `tenant-<name>.pem`, `tenant-<name>.key`. Keys are written
//! readable by their owner only.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use leasehold_proto::identity::{certificate_tag, node_identity, tenant_identity, token_hash};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// The subject of every CA made here; an issuer is rebuilt from it and the CA's key.
pub const CA_COMMON_NAME: &str = "Leasehold CA";

/// A certificate and its private key, both PEM.
pub struct Pem {
    pub cert: String,
    pub key: String,
}

fn failed(error: impl std::fmt::Display) -> Error {
    Error::Other(format!("certificate: {error}"))
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

/// A new self-signed CA.
pub fn new_ca() -> Result<Pem> {
    let key = KeyPair::generate().map_err(failed)?;
    let cert = ca_params().self_signed(&key).map_err(failed)?;
    Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
}

/// Signs a leaf certificate for `names` (DNS names or IP addresses) with the CA whose
/// key is `ca_key` (made by `new_ca`). `server` adds the server-authentication use.
fn issue(ca_key: &str, common_name: &str, names: &[String], server: bool) -> Result<Pem> {
    let ca_key = KeyPair::from_pem(ca_key).map_err(failed)?;
    let issuer = Issuer::new(ca_params(), ca_key);
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, common_name);
    params.distinguished_name = subject;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = if server {
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    params.use_authority_key_identifier_extension = true;
    for name in names {
        let san = match name.parse::<IpAddr>() {
            Ok(address) => SanType::IpAddress(address),
            Err(_) => SanType::DnsName(
                name.clone().try_into().map_err(|error| failed(format!("{name:?} is not a DNS name: {error}")))?,
            ),
        };
        params.subject_alt_names.push(san);
    }
    let key = KeyPair::generate().map_err(failed)?;
    let cert = params.signed_by(&key, &issuer).map_err(failed)?;
    Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
}

/// A node's certificate: `node-<id>.leasehold`, and the host names or addresses
/// clients dial it by (its client port is served with the same certificate).
pub fn node_certificate(ca_key: &str, node_id: u64, hosts: &[String]) -> Result<Pem> {
    let mut names = vec![node_identity(node_id)];
    names.extend(hosts.iter().cloned());
    issue(ca_key, &node_identity(node_id), &names, true)
}

/// A tenant's client certificate: `<tenant>.<tag>.tenant.leasehold`, the tag bound
/// to the tenant's current `token`: once the token is rotated, or the tenant removed,
/// the certificate no longer authenticates.
pub fn tenant_certificate(ca_key: &str, tenant: &str, token: &str) -> Result<Pem> {
    let name = tenant_identity(tenant, &certificate_tag(&token_hash(token)));
    issue(ca_key, &name, std::slice::from_ref(&name), false)
}

/// Writes `contents` to `path` through a temporary file and a rename, so that a node
/// reloading on SIGHUP never reads half a file; `secret` files are readable by their
/// owner only.
pub fn write_file(path: &Path, contents: &str, secret: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let temporary = path.with_extension("tmp");
    let mode = if secret { 0o600 } else { 0o644 };
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temporary)
        .and_then(|mut file| file.write_all(contents.as_bytes()))
        .and_then(|()| std::fs::rename(&temporary, path));
    written.map_err(|error| Error::Other(format!("cannot write {}: {error}", path.display())))
}

/// Writes `pem` as `<stem>.pem` and `<stem>.key` in `directory`; returns both paths.
pub fn write_pair(directory: &Path, stem: &str, pem: &Pem) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (directory.join(format!("{stem}.pem")), directory.join(format!("{stem}.key")));
    write_file(&cert, &pem.cert, false)?;
    write_file(&key, &pem.key, true)?;
    Ok((cert, key))
}

/// A new random bearer token: 32 random bytes in hex, after a prefix that says what
/// it is when it turns up in a file or a log.
pub fn new_token(prefix: &str) -> String {
    let bytes: [u8; 32] = rand::random();
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{prefix}_{hex}")
}
