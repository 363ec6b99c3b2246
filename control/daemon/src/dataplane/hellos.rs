//! Joining members' hellos the switch program recorded: taken by a join, swept after their
//! lifetime.

use std::collections::BTreeMap;

use xagg_common::job::{MemberAddr, HELLO_TTL_NS};

use crate::dataplane::Dataplane;

impl Dataplane {
    /// Takes the hello recorded under `token`, if the switch saw one.
    pub fn take_hello(&mut self, token: u64) -> Option<MemberAddr> {
        let hello = self.hellos.get(&token, 0).ok()?;
        let _ = self.hellos.remove(&token);
        Some(hello.addr)
    }

    /// Whether a hello is recorded under `token` (left there).
    pub fn has_hello(&self, token: u64) -> bool {
        self.hellos.get(&token, 0).is_ok()
    }

    /// Removes the hellos nobody claimed within `HELLO_TTL_NS` and recounts each port's
    /// waiting ones (the switch counts them up, and may miscount when two CPUs record one
    /// at once; taken hellos count until now). Returns how many it removed.
    pub fn sweep_hellos(&mut self) -> usize {
        let Ok(now) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) else {
            return 0;
        };
        let now = now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64;
        let mut waiting: BTreeMap<u32, u32> = BTreeMap::new();
        let mut stale = Vec::new();
        for (token, hello) in self.hellos.iter().filter_map(|r| r.ok()) {
            if now.saturating_sub(hello.seen_ns) > HELLO_TTL_NS {
                stale.push(token);
            } else {
                *waiting.entry(hello.addr.ifindex).or_default() += 1;
            }
        }
        for token in &stale {
            let _ = self.hellos.remove(token);
        }
        let ports: Vec<u32> = self.hello_counts.keys().filter_map(|k| k.ok()).collect();
        for port in ports.iter().chain(waiting.keys()) {
            let n = waiting.get(port).copied().unwrap_or(0);
            let _ = self.hello_counts.insert(port, n, 0);
        }
        stale.len()
    }
}
