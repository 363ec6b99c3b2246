//! With the `object` feature, embeds the XDP object built by `cargo xtask build`. Without
//! it (plain `cargo check`, clippy, unit tests) an empty object is embedded, and whatever
//! loads it fails with a message saying how to build it.
use std::{env, fs, path::PathBuf};

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("xagg.bpf.o");
    println!("cargo:rerun-if-env-changed=XAGG_EBPF_OBJECT");
    if env::var_os("CARGO_FEATURE_OBJECT").is_none() {
        fs::write(out, []).unwrap();
        return;
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let object = match env::var_os("XAGG_EBPF_OBJECT") {
        Some(p) => PathBuf::from(p),
        None => env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| manifest.join("../../target"))
            .join("ebpf/bpfel-unknown-none/release/xagg"),
    };
    println!("cargo:rerun-if-changed={}", object.display());
    let bytes = fs::read(&object).unwrap_or_default();
    fs::write(out, bytes).unwrap();
}
