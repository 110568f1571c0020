//! The per-deployment webhook signing secret: from an environment variable
//! the operator names, or else a random one kept in a private file (created
//! on first start) that receivers are configured with.

use std::path::Path;

use crate::error::{ApprovalError, Result};

/// Shortest accepted secret, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// Loads the secret. With `env_name`, the variable must be set and at least
/// [`MIN_SECRET_BYTES`] long; without, `file` is read, or created with 32
/// random bytes as 64 hex characters (mode 0600). The HMAC key is the
/// secret's UTF-8 bytes, exactly as a receiver holds the text.
pub fn load_signing_secret(env_name: Option<&str>, file: &Path) -> Result<Vec<u8>> {
    if let Some(name) = env_name {
        let value = std::env::var(name).map_err(|_| {
            ApprovalError::Config(format!(
                "webhook_signing_secret_env names `{name}`, which is not set in the environment"
            ))
        })?;
        return check(value.trim().as_bytes().to_vec(), &format!("`{name}`"));
    }
    if file.exists() {
        let text = std::fs::read_to_string(file).map_err(|err| {
            ApprovalError::Config(format!("cannot read {}: {err}", file.display()))
        })?;
        return check(text.trim().as_bytes().to_vec(), &file.display().to_string());
    }
    use rand::RngCore as _;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let secret = hex::encode(bytes);
    write_private(file, secret.as_bytes())?;
    tracing::info!(file = %file.display(), "generated the webhook signing secret; configure receivers with its contents");
    Ok(secret.into_bytes())
}

fn check(secret: Vec<u8>, source: &str) -> Result<Vec<u8>> {
    if secret.len() < MIN_SECRET_BYTES {
        return Err(ApprovalError::Config(format!(
            "the webhook signing secret in {source} is shorter than {MIN_SECRET_BYTES} bytes"
        )));
    }
    Ok(secret)
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let fail = |err: std::io::Error| {
        ApprovalError::Config(format!("cannot write {}: {err}", path.display()))
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(fail)?;
    file.write_all(bytes).map_err(fail)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_secret_is_kept_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secrets/webhook-signing.secret");
        let first = load_signing_secret(None, &file).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(load_signing_secret(None, &file).unwrap(), first);
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&file, "short").unwrap();
        assert!(load_signing_secret(None, &file).is_err());
        let err = load_signing_secret(Some("KG_APPROVAL_TEST_SURELY_UNSET_VAR"), &file)
            .err()
            .unwrap();
        assert!(err.to_string().contains("not set"), "{err}");
    }
}
