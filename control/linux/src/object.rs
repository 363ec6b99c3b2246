//! An XDP object's bytes, as a binary embeds them (`xagg-objects`) and hands them to the
//! library that loads them.

use std::fmt;

/// An XDP object (an ELF file's bytes; the binary embedding it aligns them to 8 bytes, as
/// the ELF loader wants).
#[derive(Clone, Copy)]
pub struct XdpObject(&'static [u8]);

impl XdpObject {
    pub const fn new(bytes: &'static [u8]) -> Self {
        Self(bytes)
    }

    /// The object's bytes, or what to do where the build carried none.
    pub fn bytes(&self) -> Result<&'static [u8], &'static str> {
        if self.0.is_empty() {
            Err("this build carries no XDP object: run `cargo xtask build` (or `cargo xtask demo`) and rebuild")
        } else {
            Ok(self.0)
        }
    }
}

impl fmt::Debug for XdpObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "XdpObject({} bytes)", self.0.len())
    }
}
