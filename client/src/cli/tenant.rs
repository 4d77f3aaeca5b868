//! `tenant add | list | rotate-token | set-quotas | remove`: the tenants, their
//! quotas and their tokens, with the admin credential. A new token exists in one
//! answer only (the cluster keeps its hash), so it is printed or written to
//! --token-file, and a file that cannot be written is found out before the request.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use leasehold::proto as pb;
use leasehold::{Client, Error};

use super::arguments::{QuotaArguments, TenantAction};
use super::exit::EXIT_SUCCESS;
use super::render;

/// The mode of a token file: a secret, readable by its owner only.
const TOKEN_FILE_MODE: u32 = 0o600;

pub async fn run(client: &Client, action: TenantAction) -> Result<u8, Error> {
    match action {
        TenantAction::Add { name, quotas, token_file } => {
            let output = TokenOutput::prepare(token_file)?;
            let added =
                client.add_tenant(&name, quotas_with(quotas, pb::Quotas::default())).await.inspect_err(|error| {
                    if matches!(error, Error::Indeterminate(_)) {
                        eprintln!(
                            "leasehold: tenant {name} may have been added without its token reaching us; if \
                             `leasehold tenant list` shows it, `leasehold tenant rotate-token {name}` gives it a new \
                             token"
                        );
                    }
                })?;
            output.deliver(&added.token, &name)?;
        }
        TenantAction::List { json } => {
            print!("{}", render::tenants(&client.list_tenants().await?, json));
        }
        TenantAction::RotateToken { name, token_file } => {
            let output = TokenOutput::prepare(token_file)?;
            let token = client.rotate_tenant_token(&name).await.inspect_err(|error| {
                if matches!(error, Error::Indeterminate(_)) {
                    eprintln!(
                        "leasehold: the token of tenant {name} may have been replaced by one that did not reach us; \
                         rotate it again"
                    );
                }
            })?;
            output.deliver(&token, &name)?;
        }
        TenantAction::SetQuotas { name, quotas } => {
            // A quota not given goes as 0, which the cluster leaves as it is.
            let tenant = client.set_tenant_quotas(&name, quotas_with(quotas, pb::Quotas::default())).await?;
            print!("{}", render::tenants(&[tenant], false));
        }
        TenantAction::Remove { name } => {
            let sessions_ended = client.remove_tenant(&name).await?;
            let plural = if sessions_ended == 1 { "" } else { "s" };
            println!("tenant {name} removed: {sessions_ended} session{plural} ended");
        }
    }
    Ok(EXIT_SUCCESS)
}

/// The quotas given on the command line, and `otherwise`'s for those not given (a
/// zero is the cluster's default in `add` and "as it is" in `set-quotas`).
fn quotas_with(given: QuotaArguments, otherwise: pb::Quotas) -> pb::Quotas {
    pb::Quotas {
        max_sessions: given.max_sessions.unwrap_or(otherwise.max_sessions),
        max_holds: given.max_holds.unwrap_or(otherwise.max_holds),
        max_waiters: given.max_waiters.unwrap_or(otherwise.max_waiters),
        weight: given.weight.unwrap_or(otherwise.weight),
        max_ops_per_second: given.max_ops_per_second.or(otherwise.max_ops_per_second),
    }
}

/// Where a new token goes: stdout, or a file made ready (a temporary file beside it,
/// mode 0600) before the request that creates the token.
enum TokenOutput {
    Stdout,
    File(PendingTokenFile),
}

impl TokenOutput {
    fn prepare(token_file: Option<PathBuf>) -> Result<TokenOutput, Error> {
        Ok(match token_file {
            None => TokenOutput::Stdout,
            Some(path) => TokenOutput::File(PendingTokenFile::create(path)?),
        })
    }

    /// Prints the token, or writes it and prints the file's path. A write that fails
    /// now has lost the token, and the error says how to get another.
    fn deliver(self, token: &str, tenant: &str) -> Result<(), Error> {
        match self {
            TokenOutput::Stdout => {
                println!("{token}");
                eprintln!("leasehold: this is the only time the token of tenant {tenant} is shown; keep it");
            }
            TokenOutput::File(pending) => {
                let path = pending.commit(token).map_err(|error| {
                    Error::Other(format!(
                        "{error}; the token of tenant {tenant} is lost: `leasehold tenant rotate-token {tenant}` gives \
                         it another one"
                    ))
                })?;
                println!("{}", path.display());
            }
        }
        Ok(())
    }
}

/// A token file being written: the temporary file beside `path`, renamed over it
/// once the token is in, so that a reader never sees half a token. Dropped without
/// that (the request failed), it removes the temporary file.
struct PendingTokenFile {
    path: PathBuf,
    temporary: PathBuf,
    file: Option<File>,
}

impl PendingTokenFile {
    fn create(path: PathBuf) -> Result<PendingTokenFile, Error> {
        let cannot = |reason: String| {
            Error::InvalidArgument(format!("cannot write the token file {}: {reason}", path.display()))
        };
        let file_name = match path.file_name() {
            Some(file_name) if !path.is_dir() => file_name.to_string_lossy().into_owned(),
            _ => return Err(cannot("it is a directory".into())),
        };
        let directory = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let temporary = directory.join(format!(".{file_name}.{}.tmp", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(TOKEN_FILE_MODE)
            .open(&temporary)
            .map_err(|error| cannot(error.to_string()))?;
        Ok(PendingTokenFile { path, temporary, file: Some(file) })
    }

    /// Writes `token` (one line), makes it durable and puts it in place.
    fn commit(mut self, token: &str) -> Result<PathBuf, Error> {
        let mut file = self.file.take().expect("committed once");
        let written = file
            .write_all(format!("{token}\n").as_bytes())
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&self.temporary, &self.path));
        written
            .map_err(|error| Error::Other(format!("cannot write the token file {}: {error}", self.path.display())))?;
        sync_directory_of(&self.path);
        Ok(self.path.clone())
    }
}

impl Drop for PendingTokenFile {
    fn drop(&mut self) {
        // After the rename there is nothing left to remove.
        let _ = std::fs::remove_file(&self.temporary);
    }
}

/// Makes the rename that put `path` in place durable. Best effort: the token is
/// already in the file, and a directory that cannot be synced is no reason to say
/// it was lost.
fn sync_directory_of(path: &Path) {
    let directory = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Ok(directory) = File::open(directory) {
        let _ = directory.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn quotas_not_given_keep_the_other_values() {
        let current = pb::Quotas { max_sessions: 5, max_holds: 50, max_waiters: 500, ..pb::Quotas::default() };
        let given = QuotaArguments { max_holds: Some(7), max_ops_per_second: Some(100), ..QuotaArguments::default() };
        assert_eq!(
            quotas_with(given, current),
            pb::Quotas { max_sessions: 5, max_holds: 7, max_waiters: 500, weight: 0, max_ops_per_second: Some(100) }
        );
        let defaults = quotas_with(QuotaArguments::default(), pb::Quotas::default());
        assert_eq!(defaults, pb::Quotas::default(), "0 (or unset) asks for the default");
    }

    #[test]
    fn a_token_file_is_replaced_whole_and_readable_by_its_owner_only() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("payments.token");
        std::fs::write(&path, "old-token\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let pending = PendingTokenFile::create(path.clone()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old-token\n", "untouched until the token is in");
        assert_eq!(pending.commit("tenant_abc").unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "tenant_abc\n");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, TOKEN_FILE_MODE);
        let names: Vec<_> =
            std::fs::read_dir(directory.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("payments.token")], "no temporary file is left");
    }

    #[test]
    fn a_token_file_that_cannot_be_written_is_refused_before_anything_is_sent() {
        let directory = tempfile::tempdir().unwrap();
        let error = PendingTokenFile::create(directory.path().join("missing/payments.token")).err().unwrap();
        assert!(matches!(error, Error::InvalidArgument(_)), "{error:?}");
        let error = PendingTokenFile::create(directory.path().to_path_buf()).err().unwrap();
        assert!(error.to_string().contains("is a directory"), "{error}");
        // An abandoned one (the request failed) leaves nothing behind.
        drop(PendingTokenFile::create(directory.path().join("payments.token")).unwrap());
        assert_eq!(std::fs::read_dir(directory.path()).unwrap().count(), 0);
    }
}
