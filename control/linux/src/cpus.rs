//! CPU lists as `taskset -c` and the kernel's sysfs write them (`0,2-5`): the lab's
//! placement and the switch's steering CPUs.

/// The CPUs `text` lists (`1`, `0,2` or `2-5`, parts joined by commas), sorted, each once;
/// the error says which part is wrong and how to write it.
pub fn parse(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("`{part}` is not a CPU or a range of CPUs (write 1, 0,2 or 2-5)");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The number of CPUs online: CPUs are numbered below it. (Not the calling thread's
/// affinity, which a pinned thread narrows to its own CPU.)
pub fn available() -> usize {
    // Safety: a plain query.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse("1").unwrap(), vec![1]);
        assert_eq!(parse("0,4-6,2").unwrap(), vec![0, 2, 4, 5, 6]);
        assert!(parse("3-1").is_err());
        assert!(parse("x").is_err());
    }
}
