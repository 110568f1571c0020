//! Content-addressed blobs in a local directory.
//!
//! The key of a blob is the lowercase hex SHA-256 of its bytes, stored at
//! `root/ab/cd/abcd…` (two fan-out levels keep directories small). Writes go to a temp file in
//! the target directory and are renamed into place, so a reader never sees a partial blob and
//! concurrent writers of the same content are harmless.
//!
//! [`BlobStore::sweep`] removes the blobs no version needs any more. A blob is stored before
//! the version that names it is registered, so only blobs older than a grace period go, and a
//! `put` of content already stored renews its blob's modification time. The two take a lock
//! file in the root (shared by puts, exclusive for each removal): a put never reports a blob
//! that a sweep removes the next instant, across processes sharing the directory.

use std::collections::HashSet;
use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{FlockOperation, flock};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::{StoreError, StoreKind};

/// The lock file in the root that orders puts and sweeps (see the module's comment).
const LOCK_FILE: &str = ".lock";

/// What a [`BlobStore::sweep`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Blobs a version still names.
    pub kept: u64,
    /// Blobs no version names, kept because they were written or renewed within the grace.
    pub young: u64,
    /// Blobs (and dead writes' temp files) removed.
    pub removed: u64,
    /// Their bytes.
    pub removed_bytes: u64,
}

/// A blob store rooted at a local directory.
#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
}

impl BlobStore {
    /// A store at `root`; the directory is created on the first `put`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        BlobStore { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Stores `bytes` and returns their key (sha256 hex). Storing the same bytes twice is a no-op.
    pub async fn put(&self, bytes: &[u8]) -> Result<String, StoreError> {
        let key = hex::encode(Sha256::digest(bytes));
        let path = self.path_of(&key);
        tokio::fs::create_dir_all(&self.root)
            .await
            .map_err(io_err)?;
        // Already stored: renewed, so a sweep's grace period counts from this upload. One that
        // cannot be renewed (missing, or read-only: restored from a backup, say) is written
        // again below, which renews it as well.
        let renewed = self
            .locked(FlockOperation::LockShared, {
                let path = path.clone();
                move || {
                    Ok(File::options()
                        .write(true)
                        .open(&path)
                        .and_then(|file| file.set_modified(SystemTime::now()))
                        .is_ok())
                }
            })
            .await?;
        if renewed {
            return Ok(key);
        }
        let dir = path
            .parent()
            .ok_or_else(|| StoreError::internal(StoreKind::Blobs, "blob path has no parent"))?;
        tokio::fs::create_dir_all(dir).await.map_err(io_err)?;
        // A unique temp name in the same directory, so the rename is atomic.
        let tmp = dir.join(format!(".{key}.{}.tmp", unique_suffix()));
        let written = write_file(&tmp, bytes).await;
        if let Err(err) = written {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(io_err(err));
        }
        let placed = self
            .locked(FlockOperation::LockShared, {
                let (tmp, path) = (tmp.clone(), path.clone());
                move || std::fs::rename(&tmp, &path)
            })
            .await;
        if let Err(err) = placed {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(err);
        }
        Ok(key)
    }

    /// Removes every blob whose key `referenced` lacks and that was last written (or renewed
    /// by a `put`) at least `grace` ago, and temp files left by writes that died as old.
    pub async fn sweep(
        &self,
        referenced: HashSet<String>,
        grace: Duration,
    ) -> Result<Swept, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.sweep_blocking(&referenced, grace))
            .await
            .map_err(|err| StoreError::internal(StoreKind::Blobs, err))?
            .map_err(io_err)
    }

    fn sweep_blocking(
        &self,
        referenced: &HashSet<String>,
        grace: Duration,
    ) -> std::io::Result<Swept> {
        let mut swept = Swept::default();
        let fan_out = |dir: &Path| -> std::io::Result<Vec<PathBuf>> {
            match std::fs::read_dir(dir) {
                Ok(entries) => entries
                    .map(|entry| entry.map(|e| e.path()))
                    .filter(|path| {
                        path.as_ref().map_or(true, |p| {
                            p.is_dir() && p.file_name().is_some_and(|n| n.len() == 2)
                        })
                    })
                    .collect(),
                Err(err) if err.kind() == ErrorKind::NotFound => Ok(Vec::new()),
                Err(err) => Err(err),
            }
        };
        for first in fan_out(&self.root)? {
            for second in fan_out(&first)? {
                for entry in std::fs::read_dir(&second)? {
                    let entry = entry?;
                    let name = entry.file_name();
                    let Some(name) = name.to_str() else { continue };
                    let temp = name.starts_with('.') && name.ends_with(".tmp");
                    if validate_key(name).is_err() && !temp {
                        continue;
                    }
                    if !temp && referenced.contains(name) {
                        swept.kept += 1;
                        continue;
                    }
                    let path = entry.path();
                    let lock = self.lock_file()?;
                    flock(&lock, FlockOperation::LockExclusive)?;
                    let metadata = match std::fs::symlink_metadata(&path) {
                        Ok(metadata) => metadata,
                        Err(err) if err.kind() == ErrorKind::NotFound => continue,
                        Err(err) => return Err(err),
                    };
                    let age = metadata.modified()?.elapsed().unwrap_or(Duration::ZERO);
                    if age < grace {
                        swept.young += 1;
                        continue;
                    }
                    match std::fs::remove_file(&path) {
                        Ok(()) => {
                            swept.removed += 1;
                            swept.removed_bytes += metadata.len();
                        }
                        Err(err) if err.kind() == ErrorKind::NotFound => {}
                        Err(err) => return Err(err),
                    }
                }
            }
        }
        Ok(swept)
    }

    /// Runs `f` on a blocking thread holding the root's lock file as `how` says.
    async fn locked<T: Send + 'static>(
        &self,
        how: FlockOperation,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            let lock = store.lock_file()?;
            flock(&lock, how)?;
            f()
        })
        .await
        .map_err(|err| StoreError::internal(StoreKind::Blobs, err))?
        .map_err(io_err)
    }

    /// The root's lock file, opened (created when missing); unlocked when dropped.
    fn lock_file(&self) -> std::io::Result<File> {
        File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.root.join(LOCK_FILE))
    }

    /// Reads the blob with `key`. `NotFound` when absent; `InvalidInput` when `key` is not 64
    /// lowercase hex characters (so a key can never name a path outside the store).
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        validate_key(key)?;
        match tokio::fs::read(self.path_of(key)).await {
            Ok(bytes) => Ok(bytes),
            Err(err) if err.kind() == ErrorKind::NotFound => Err(StoreError::NotFound {
                what: "blob".into(),
            }),
            Err(err) => Err(io_err(err)),
        }
    }

    /// Whether a blob with `key` exists.
    pub async fn contains(&self, key: &str) -> Result<bool, StoreError> {
        validate_key(key)?;
        tokio::fs::try_exists(self.path_of(key))
            .await
            .map_err(io_err)
    }

    fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(&key[0..2]).join(&key[2..4]).join(key)
    }
}

fn validate_key(key: &str) -> Result<(), StoreError> {
    if key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(StoreError::InvalidInput {
            what: "blob key",
            reason: "expected 64 lowercase hex characters (sha256)".into(),
        })
    }
}

async fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await?;
    file.write_all(bytes).await?;
    file.sync_all().await?;
    Ok(())
}

fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn io_err(err: std::io::Error) -> StoreError {
    StoreError::internal(StoreKind::Blobs, err)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_common::error::{ErrorCode, ErrorExt};

    #[tokio::test]
    async fn put_get_round_trip_with_fan_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path().join("blobs"));
        let key = store.put(b"hello").await.unwrap();
        assert_eq!(
            key,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert!(dir.path().join("blobs/2c/f2").join(&key).is_file());
        assert_eq!(store.get(&key).await.unwrap(), b"hello");
        assert!(store.contains(&key).await.unwrap());
        // Same content again: same key, no temp files left behind.
        assert_eq!(store.put(b"hello").await.unwrap(), key);
        let entries: Vec<_> = std::fs::read_dir(dir.path().join("blobs/2c/f2"))
            .unwrap()
            .collect();
        assert_eq!(entries.len(), 1);
        // Empty blobs are valid.
        let empty = store.put(b"").await.unwrap();
        assert_eq!(store.get(&empty).await.unwrap(), b"");
    }

    #[tokio::test]
    async fn missing_and_malformed_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path());
        let missing = "0".repeat(64);
        let err = store.get(&missing).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound);
        assert!(!store.contains(&missing).await.unwrap());
        for bad in [
            "",
            "abc",
            &"A".repeat(64),
            &format!("../{}", "a".repeat(61)),
            &"g".repeat(64),
            &"a".repeat(65),
        ] {
            let err = store.get(bad).await.unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidArgument, "{bad}");
        }
    }

    /// Backdates a blob (or any file) by `age`, as if written that long ago.
    fn age_by(path: &Path, age: Duration) {
        let file = File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
    }

    #[tokio::test]
    async fn a_sweep_removes_old_unreferenced_blobs_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path().join("blobs"));
        let hour = Duration::from_secs(3600);
        let named = store.put(b"named by a version").await.unwrap();
        let orphan = store.put(b"named by none").await.unwrap();
        let fresh = store.put(b"just uploaded").await.unwrap();
        let dead_write = store.path_of(&orphan).with_file_name(".dead.1-2-3.tmp");
        std::fs::write(&dead_write, b"half").unwrap();
        for path in [
            store.path_of(&named),
            store.path_of(&orphan),
            dead_write.clone(),
        ] {
            age_by(&path, 2 * hour);
        }
        let referenced = HashSet::from([named.clone()]);

        let swept = store.sweep(referenced.clone(), hour).await.unwrap();
        assert_eq!(
            swept,
            Swept {
                kept: 1,
                young: 1,
                removed: 2,
                removed_bytes: 13 + 4,
            }
        );
        assert!(store.contains(&named).await.unwrap());
        assert!(store.contains(&fresh).await.unwrap());
        assert!(!store.contains(&orphan).await.unwrap());
        assert!(!dead_write.exists());

        // Past its grace the fresh one goes too; an empty or missing store sweeps to nothing.
        let swept = store.sweep(referenced, Duration::ZERO).await.unwrap();
        assert_eq!((swept.kept, swept.young, swept.removed), (1, 0, 1));
        let missing = BlobStore::new(dir.path().join("none"));
        assert_eq!(
            missing.sweep(HashSet::new(), Duration::ZERO).await.unwrap(),
            Swept::default()
        );
    }

    /// Content uploaded again renews its blob: a version about to name it is not swept from
    /// under it, however long ago the bytes were first stored.
    #[tokio::test]
    async fn a_put_of_stored_content_renews_its_blob() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path().join("blobs"));
        let hour = Duration::from_secs(3600);
        let key = store.put(b"uploaded twice").await.unwrap();
        age_by(&store.path_of(&key), 2 * hour);
        assert_eq!(store.put(b"uploaded twice").await.unwrap(), key);
        let swept = store.sweep(HashSet::new(), hour).await.unwrap();
        assert_eq!((swept.young, swept.removed), (1, 0));
        assert_eq!(store.get(&key).await.unwrap(), b"uploaded twice");
    }
}
