//! Control plane of the aggregation switch: the dataplane loader ([`dataplane`]), the job
//! API ([`job`], [`api`]), the daemon's configuration ([`config`]) and the worker library
//! ([`worker`]) that runs allreduces through a switch.

pub mod api;
pub mod codec;
pub mod config;
pub mod data;
pub mod dataplane;
pub mod iface;
pub mod job;
pub mod lab;
pub mod testrun;
pub mod worker;
pub mod xsk;

/// The XDP object, embedded at build time (empty when it was not built).
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xagg.bpf.o"));

/// Parses sizes like `64MiB`, `4KiB`, `1GB`, `4096`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| {
        format!("`{s}` is not a size: use a number with an optional unit, e.g. 64MiB")
    })?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" | "k" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "KB" | "kB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        u => {
            return Err(format!(
                "unknown unit `{u}` in `{s}`: use B, KiB, MiB, GiB, KB, MB or GB"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(super::parse_size("4096"), Ok(4096));
        assert_eq!(super::parse_size("1KB"), Ok(1000));
        assert!(super::parse_size("12XB")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(super::parse_size("MiB").is_err());
    }
}
