//! Embeds the XDP object built by `cargo xtask build`. Without it (plain `cargo check`,
//! clippy, unit tests) an empty object is embedded and loading the dataplane fails with a
//! message saying how to build it.
use std::{env, fs, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let object = match env::var_os("XAGG_EBPF_OBJECT") {
        Some(p) => PathBuf::from(p),
        None => env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| manifest.join("../target"))
            .join("ebpf/bpfel-unknown-none/release/xagg"),
    };
    println!("cargo:rerun-if-env-changed=XAGG_EBPF_OBJECT");
    println!("cargo:rerun-if-changed={}", object.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("xagg.bpf.o");
    let bytes = fs::read(&object).unwrap_or_default();
    fs::write(out, bytes).unwrap();
}
