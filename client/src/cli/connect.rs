//! The client a command runs with: the endpoints and credentials of the command line
//! (or their LEASEHOLD_* variables), as the tenant or, for admin commands, as the admin.
//! A command without the credential it needs is refused here, as not permitted (exit
//! 77, as the server would), before anything is sent.

use std::time::Duration;

use leasehold::settings::{ENV_ADMIN_TOKEN_FILE, ENV_TOKEN_FILE};
use leasehold::{Client, Error, Settings};

use super::arguments::CredentialArguments;

/// Whose credential a command presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The tenant's token or client certificate.
    Tenant,
    /// The admin token (member, tenant, status with it).
    Admin,
    /// The admin token when one is given, else the tenant's credential.
    AdminIfGiven,
}

pub fn client(
    endpoints: &str,
    request_timeout: Duration,
    credentials: &CredentialArguments,
    role: Role,
) -> Result<Client, Error> {
    let admin = match role {
        Role::Tenant => false,
        Role::AdminIfGiven => credentials.admin_token_file.is_some(),
        Role::Admin => {
            if credentials.admin_token_file.is_none() {
                return Err(Error::Unauthenticated(format!(
                    "this command needs the admin credential: give --admin-token-file (or {ENV_ADMIN_TOKEN_FILE})"
                )));
            }
            true
        }
    };
    let settings = Settings {
        endpoints: leasehold::parse_endpoints(endpoints),
        ca_file: credentials.ca_file.clone(),
        token_file: if admin { credentials.admin_token_file.clone() } else { credentials.token_file.clone() },
        token: None,
        cert_file: if admin { None } else { credentials.cert_file.clone() },
        key_file: if admin { None } else { credentials.key_file.clone() },
        insecure_plaintext: credentials.insecure_plaintext,
    };
    if !admin && settings.token_file.is_none() && settings.cert_file.is_none() {
        return Err(Error::Unauthenticated(format!(
            "no credential: give --token-file (or {ENV_TOKEN_FILE}) with the tenant's token, or --cert-file and \
             --key-file with its client certificate"
        )));
    }
    Ok(settings.client()?.with_request_deadline(request_timeout))
}
