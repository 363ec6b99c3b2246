//! Embeds the XDP objects built by `cargo xtask build`: the switch's (`xagg`) and a
//! worker's (`xagg-host`, beside it). Where they were not built (plain `cargo check`,
//! clippy, unit tests) empty objects are embedded, and whatever loads one fails with a
//! message saying how to build it.
use std::{env, fs, path::PathBuf};

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=XAGG_EBPF_OBJECT");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    // XAGG_EBPF_OBJECT names the switch's object; the worker's is built beside it.
    let switch = match env::var_os("XAGG_EBPF_OBJECT") {
        Some(p) => PathBuf::from(p),
        None => env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| manifest.join("../../target"))
            .join("ebpf/bpfel-unknown-none/release/xagg"),
    };
    let host = switch.with_file_name("xagg-host");
    for (object, name) in [(switch, "xagg.bpf.o"), (host, "xagg-host.bpf.o")] {
        println!("cargo:rerun-if-changed={}", object.display());
        let bytes = fs::read(&object).unwrap_or_default();
        fs::write(out.join(name), bytes).unwrap();
    }
}
