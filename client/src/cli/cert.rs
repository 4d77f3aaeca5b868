//! `cert ca | node | tenant` and `new-token`: certificates and tokens for a local or
//! test cluster, written to a directory (keys readable by their owner only).

use leasehold::{certs, Error};

use super::arguments::CertAction;
use super::exit::EXIT_SUCCESS;

fn read_ca_key(directory: &std::path::Path) -> Result<String, Error> {
    let path = directory.join("ca.key");
    std::fs::read_to_string(&path).map_err(|error| {
        Error::InvalidArgument(format!(
            "cannot read {}: {error} (make a CA first: leasehold cert ca {})",
            path.display(),
            directory.display()
        ))
    })
}

pub fn run(action: CertAction) -> Result<u8, Error> {
    let written = match action {
        CertAction::Ca { directory } => {
            if directory.join("ca.key").exists() {
                return Err(Error::InvalidArgument(format!(
                    "{} already holds a CA; certificates it signed would stop verifying if it were replaced",
                    directory.display()
                )));
            }
            std::fs::create_dir_all(&directory)
                .map_err(|error| Error::Other(format!("cannot create {}: {error}", directory.display())))?;
            certs::write_pair(&directory, "ca", &certs::new_ca()?)?
        }
        CertAction::Node { directory, id, hosts } => {
            if id == 0 {
                return Err(Error::InvalidArgument("--id must be a positive node id".into()));
            }
            let pem = certs::node_certificate(&read_ca_key(&directory)?, id, &hosts)?;
            certs::write_pair(&directory, &format!("node-{id}"), &pem)?
        }
        CertAction::Tenant { directory, name, token_file } => {
            let Some(token_file) = token_file else {
                return Err(Error::InvalidArgument(format!(
                    "a tenant certificate is bound to the tenant's token: give --token-file FILE, the file `leasehold \
                     tenant add {name} --token-file FILE` (or `tenant rotate-token`) wrote"
                )));
            };
            let token = leasehold::settings::read_token_file(&token_file)?;
            let pem = certs::tenant_certificate(&read_ca_key(&directory)?, &name, &token)?;
            certs::write_pair(&directory, &format!("tenant-{name}"), &pem)?
        }
    };
    println!("{}\n{}", written.0.display(), written.1.display());
    Ok(EXIT_SUCCESS)
}

pub fn new_token(prefix: &str) -> Result<u8, Error> {
    if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(Error::InvalidArgument("--prefix is letters, digits and '-'".into()));
    }
    println!("{}", certs::new_token(prefix));
    Ok(EXIT_SUCCESS)
}
