//! Where a program finds its cluster and its credentials: the `LEASEHOLD_*`
//! environment variables (or the same values from flags), turned into a `Client`.
//!
//! | variable | what |
//! |---|---|
//! | `LEASEHOLD_ENDPOINTS` | the nodes' client addresses, comma-separated |
//! | `LEASEHOLD_CA_FILE` | the CA (PEM) that signed the nodes' client-port certificates |
//! | `LEASEHOLD_TOKEN_FILE` | a file whose first line is the bearer token (a tenant's) |
//! | `LEASEHOLD_TOKEN` | the bearer token itself (prefer the file: the environment leaks) |
//! | `LEASEHOLD_CERT_FILE`, `LEASEHOLD_KEY_FILE` | a client certificate and its key, instead of a token |
//! | `LEASEHOLD_INSECURE_PLAINTEXT` | `1`: no TLS, for a cluster started with --insecure-plaintext |

use std::path::{Path, PathBuf};

use crate::client::{parse_endpoints, Client, DEFAULT_ENDPOINTS};
use crate::error::{Error, Result};

pub const ENV_ENDPOINTS: &str = "LEASEHOLD_ENDPOINTS";
pub const ENV_CA_FILE: &str = "LEASEHOLD_CA_FILE";
pub const ENV_TOKEN_FILE: &str = "LEASEHOLD_TOKEN_FILE";
pub const ENV_TOKEN: &str = "LEASEHOLD_TOKEN";
pub const ENV_CERT_FILE: &str = "LEASEHOLD_CERT_FILE";
pub const ENV_KEY_FILE: &str = "LEASEHOLD_KEY_FILE";
pub const ENV_INSECURE_PLAINTEXT: &str = "LEASEHOLD_INSECURE_PLAINTEXT";
/// The admin credential's file, for the CLI's admin commands.
pub const ENV_ADMIN_TOKEN_FILE: &str = "LEASEHOLD_ADMIN_TOKEN_FILE";

/// How to reach a cluster and prove who we are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub endpoints: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    pub token: Option<String>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub insecure_plaintext: bool,
}

fn path_from_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from)
}

/// The first line of a secret file, trimmed.
pub fn read_token_file(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| Error::InvalidArgument(format!("cannot read the token file {}: {error}", path.display())))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(Error::InvalidArgument(format!("the token file {} is empty", path.display())));
    }
    Ok(token)
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|error| Error::InvalidArgument(format!("cannot read the {what} {}: {error}", path.display())))
}

impl Settings {
    /// The settings in this process's environment (see the module's table).
    pub fn from_env() -> Settings {
        let endpoints = std::env::var(ENV_ENDPOINTS).unwrap_or_else(|_| DEFAULT_ENDPOINTS.to_string());
        Settings {
            endpoints: parse_endpoints(&endpoints),
            ca_file: path_from_env(ENV_CA_FILE),
            token_file: path_from_env(ENV_TOKEN_FILE),
            token: std::env::var(ENV_TOKEN).ok().filter(|token| !token.is_empty()),
            cert_file: path_from_env(ENV_CERT_FILE),
            key_file: path_from_env(ENV_KEY_FILE),
            insecure_plaintext: std::env::var(ENV_INSECURE_PLAINTEXT).is_ok_and(|value| value == "1"),
        }
    }

    /// A client configured by these settings (it connects on first use). Refuses
    /// settings that contradict themselves, naming the variables.
    pub fn client(&self) -> Result<Client> {
        let mut client = Client::lazy(&self.endpoints)?;
        match (&self.ca_file, self.insecure_plaintext) {
            (Some(_), true) => {
                return Err(Error::InvalidArgument(format!(
                    "{ENV_CA_FILE} and {ENV_INSECURE_PLAINTEXT} contradict each other: choose TLS or plaintext"
                )))
            }
            (None, false) => {
                return Err(Error::InvalidArgument(format!(
                    "no CA to verify the cluster with: set {ENV_CA_FILE} (or --ca-file) to the CA that signed the \
                     nodes' certificates, or {ENV_INSECURE_PLAINTEXT}=1 for a cluster started with \
                     --insecure-plaintext"
                )))
            }
            (Some(ca_file), false) => client = client.with_ca_certificate(read_file("CA file", ca_file)?),
            (None, true) => {}
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                if self.insecure_plaintext {
                    return Err(Error::InvalidArgument("a client certificate needs TLS".into()));
                }
                client = client.with_client_certificate(read_file("certificate", cert)?, read_file("key", key)?);
            }
            (None, None) => {}
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{ENV_CERT_FILE} and {ENV_KEY_FILE} go together: give both or neither"
                )))
            }
        }
        let token = match (&self.token, &self.token_file) {
            (Some(_), Some(_)) => {
                return Err(Error::InvalidArgument(format!("give {ENV_TOKEN} or {ENV_TOKEN_FILE}, not both")))
            }
            (Some(token), None) => Some(token.clone()),
            (None, Some(file)) => Some(read_token_file(file)?),
            (None, None) => None,
        };
        if let Some(token) = token {
            client = client.with_token(&token)?;
        }
        Ok(client)
    }
}
