//! Page-aligned memory the kernel reads and writes by address, as an AF_XDP socket's
//! buffers are: mapped private, populated up front, unmapped when dropped.

use std::{num::NonZeroUsize, ptr::NonNull};

use nix::sys::mman::{mmap_anonymous, munmap, MapFlags, ProtFlags};

use crate::{Error, Result};

pub struct Pages(NonNull<[u8]>);

impl Pages {
    /// `size` bytes (rounded up to pages by the kernel), zeroed.
    pub fn map(size: usize) -> Result<Self> {
        let len = NonZeroUsize::new(size).ok_or(Error::EmptyMapping)?;
        // Safety: a fresh private anonymous mapping aliases nothing.
        let ptr = unsafe {
            mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_POPULATE,
            )
        }
        .map_err(|errno| Error::Map { size, errno })?;
        Ok(Self(NonNull::slice_from_raw_parts(ptr.cast::<u8>(), size)))
    }

    /// The whole mapping (to register with the kernel).
    pub fn as_non_null(&self) -> NonNull<[u8]> {
        self.0
    }

    /// Its first byte.
    pub fn base(&self) -> *mut u8 {
        self.0.cast::<u8>().as_ptr()
    }

    /// Its length in bytes.
    pub fn size(&self) -> usize {
        self.0.len()
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // Safety: mapped in `map` with this length; whoever shared it with the kernel
        // dropped that first (its owner keeps the pages last).
        let _ = unsafe { munmap(self.0.cast(), self.0.len()) };
    }
}
