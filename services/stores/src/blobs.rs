//! Content-addressed blobs in a local directory.
//!
//! The key of a blob is the lowercase hex SHA-256 of its bytes, stored at
//! `root/ab/cd/abcd…` (two fan-out levels keep directories small). Writes go to a temp file in
//! the target directory and are renamed into place, so a reader never sees a partial blob and
//! concurrent writers of the same content are harmless.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::{StoreError, StoreKind};

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
        if tokio::fs::try_exists(&path).await.map_err(io_err)? {
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
        if let Err(err) = tokio::fs::rename(&tmp, &path).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(io_err(err));
        }
        Ok(key)
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
}
