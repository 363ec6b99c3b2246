//! Joining members' hellos the switch program recorded: taken by a join, swept after their
//! lifetime.

use std::collections::BTreeMap;

use xagg_common::job::{MemberAddr, HELLO_TTL_NS};

use crate::dataplane::Dataplane;

impl Dataplane {
    /// Takes the hello recorded under `token`, if the switch saw one.
    pub fn take_hello(&mut self, token: u64) -> Option<MemberAddr> {
        let hello = self.hellos.get(&token, 0).ok()?;
        if self.hellos.remove(&token).is_ok() {
            self.release_hellos(hello.addr.ifindex, 1);
        }
        Some(hello.addr)
    }

    /// Whether a hello is recorded under `token` (left there).
    pub fn has_hello(&self, token: u64) -> bool {
        self.hellos.get(&token, 0).is_ok()
    }

    /// Removes the hellos nobody claimed within `HELLO_TTL_NS`, each port's share given
    /// back. Returns how many it removed.
    pub fn sweep_hellos(&mut self) -> usize {
        let Ok(now) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) else {
            return 0;
        };
        let now = now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64;
        let stale: Vec<(u64, u32)> = self
            .hellos
            .iter()
            .filter_map(|r| r.ok())
            .filter(|(_, h)| now.saturating_sub(h.seen_ns) > HELLO_TTL_NS)
            .map(|(token, h)| (token, h.addr.ifindex))
            .collect();
        let mut released: BTreeMap<u32, u32> = BTreeMap::new();
        for (token, port) in &stale {
            // Only what this removal took: a hello the switch took back itself, or a join
            // took meanwhile, is not given back twice.
            if self.hellos.remove(token).is_ok() {
                *released.entry(*port).or_default() += 1;
            }
        }
        for (port, n) in released {
            self.release_hellos(port, n);
        }
        stale.len()
    }

    /// Gives `n` of `port`'s share back: the daemon's own count, which the switch subtracts
    /// from its count of recorded hellos (only the daemon writes this one).
    fn release_hellos(&mut self, port: u32, n: u32) {
        let before = self.hello_released.get(&port, 0).unwrap_or(0);
        let _ = self.hello_released.insert(port, before.wrapping_add(n), 0);
    }
}
