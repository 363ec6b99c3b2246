//! A dataplane pinned on the bpffs: its links and maps under one directory.

use std::path::Path;

/// Removes a pinned dataplane: its links (so the programs detach) and maps. Returns
/// whether there was one.
pub fn unpin(dir: &Path) -> std::io::Result<bool> {
    if !dir.exists() {
        return Ok(false);
    }
    std::fs::remove_dir_all(dir)?;
    Ok(true)
}
