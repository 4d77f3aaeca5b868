//! `snapshot save FILE`: a backup of the whole replicated state (admin credential).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use leasehold::{Client, Error};

use super::arguments::SnapshotAction;
use super::exit::EXIT_SUCCESS;

pub async fn run(client: &Client, action: SnapshotAction) -> Result<u8, Error> {
    match action {
        SnapshotAction::Save { file } => {
            let snapshot = client.snapshot().await?;
            write_durably(&file, &snapshot.file)
                .map_err(|error| Error::Other(format!("cannot write {}: {error}", file.display())))?;
            println!(
                "saved {}: {} bytes, the state at index {}, cluster id {}, sha256 {}",
                file.display(),
                snapshot.file.len(),
                snapshot.index,
                if snapshot.cluster_id.is_empty() { "(none yet)" } else { snapshot.cluster_id.as_str() },
                snapshot.sha256
            );
            Ok(EXIT_SUCCESS)
        }
    }
}

/// Who may read a backup file: its owner only.
const BACKUP_FILE_MODE: u32 = 0o600;

/// Writes `bytes` to a temporary file beside `path`, syncs it, and renames it over
/// `path`: a crash leaves the old file or the new one, never half of one.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".partial");
    let temporary = std::path::PathBuf::from(temporary);
    let written = (|| {
        // The backup holds token and secret hashes and every tenant's names: its
        // owner's only, whatever the umask, and whatever an old partial file had.
        let _ = std::fs::remove_file(&temporary);
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(BACKUP_FILE_MODE).open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if written.is_err() {
        // A failed save leaves nothing behind, and an earlier FILE as it was.
        let _ = std::fs::remove_file(&temporary);
    }
    written
}
