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

/// Mounts a bpffs at /sys/fs/bpf if `pin` is under it and none is mounted there.
/// Returns whether it mounted one.
pub fn ensure_bpffs(pin: &Path) -> crate::Result<bool> {
    let root = Path::new("/sys/fs/bpf");
    if !pin.starts_with(root) || crate::proc::mounted(root, "bpf")? {
        return Ok(false);
    }
    nix::mount::mount(
        Some("bpf"),
        root,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|errno| crate::Error::MountBpffs { errno })?;
    Ok(true)
}
