//! `xagg keygen`: a new job key and secret for a job workers join.

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

use anyhow::{Context, Result};

/// Writes a new secret to `secret_file` (readable by its owner only, never overwriting
/// one) and prints a new job key.
pub fn run(secret_file: &Path) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(secret_file)
        .with_context(|| {
            format!(
                "creating {} (it must not exist: a secret is never overwritten)",
                secret_file.display()
            )
        })?;
    let secret = xagg_worker::Secret::random();
    let hex: String = secret.0.iter().map(|b| format!("{b:02x}")).collect();
    f.write_all(hex.as_bytes())?;
    println!("{}", xagg_worker::JobKey::random());
    Ok(())
}
