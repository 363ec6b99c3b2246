//! What the dataplane's maps say: counters switch-wide and per job and member, slots' states,
//! the first sender of each drop reason, and the switch's configuration.

use std::collections::BTreeMap;

use xagg_api::{JobCounters, MemberCounters, SlotStatus};
use xagg_common::{
    counter::{job_row, member_row, MEMBER_AGAIN, MEMBER_NEW},
    job::{job_index, members_of, MemberAddr, SwitchConfig},
    slot::{ShadowState, SlotImage},
    Counter,
};

use crate::dataplane::{map_err, Dataplane, Result};

impl Dataplane {
    /// The longest segment, in bytes, every port carries in one packet (their smallest
    /// MTU's), if any port's MTU can be read.
    pub fn segment_bytes(&self) -> Option<u32> {
        self.ports
            .iter()
            .filter_map(|p| xagg_linux::iface::mtu(p).ok())
            .map(|mtu| xagg_common::wire::payload_for_mtu(mtu) as u32)
            .min()
    }

    /// The mode each port's program is attached in, as the kernel says: what "auto" gave,
    /// or "none" where someone detached it.
    pub fn xdp_in_use(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| match xagg_linux::xdp::attached(p) {
                Ok(mode) => mode.name().to_owned(),
                Err(e) => format!("unknown ({e})"),
            })
            .collect()
    }

    /// Job `id`'s counters (summed over CPUs, only those not zero) and its members'.
    pub fn job_counters(&self, id: u32) -> Result<JobCounters> {
        let job = self.job(id)?;
        let read = |i: u32| -> Result<u64> {
            Ok(self
                .job_counters
                .get(&i, 0)
                .map_err(map_err("JOB_COUNTERS"))?
                .iter()
                .sum())
        };
        let mut counters = BTreeMap::new();
        for c in Counter::ALL {
            let v = read(job_row(job_index(id), c))?;
            if v != 0 {
                counters.insert(c.name().to_string(), v);
            }
        }
        let mut members = Vec::new();
        for m in members_of(job.members) {
            members.push(MemberCounters {
                member: m,
                contributions: read(member_row(job_index(id), m.into(), MEMBER_NEW))?,
                retransmissions: read(member_row(job_index(id), m.into(), MEMBER_AGAIN))?,
            });
        }
        Ok(JobCounters {
            id,
            counters,
            members,
        })
    }

    /// Takes the first sender of drop reason `c` since the last take, if there was one.
    pub fn take_drop_source(&mut self, c: Counter) -> Option<MemberAddr> {
        let key = c as u32;
        let a = self.drops.get(&key, 0).ok().filter(|a| a.ifindex != 0)?;
        let empty: MemberAddr = unsafe { std::mem::zeroed() };
        let _ = self.drops.set(key, empty, 0);
        Some(a)
    }

    /// Drop reasons with a sender waiting to be taken (an entry with an interface).
    pub fn drop_reasons(&self) -> Vec<Counter> {
        Counter::ALL
            .into_iter()
            .filter(|c| {
                self.drops
                    .get(&(*c as u32), 0)
                    .is_ok_and(|a| a.ifindex != 0)
            })
            .collect()
    }

    /// One slot's state, for diagnostics.
    pub fn slot(&self, index: u32) -> Result<SlotImage> {
        self.slots.get(&index, 0).map_err(map_err("SLOTS"))
    }

    /// The state of every shadow copy of job `id` that is not empty.
    pub fn job_status(&self, id: u32) -> Result<Vec<SlotStatus>> {
        let job = self.job(id)?;
        let mut out = Vec::new();
        for slot in 0..job.slot_count {
            let s = self.slot(job.slot_base + slot)?;
            for (shadow, v) in s.shadow.iter().enumerate() {
                let state = match ShadowState::from_u32(v.state) {
                    Some(
                        s @ (ShadowState::Filling | ShadowState::PartialSent | ShadowState::Done),
                    ) => s,
                    _ => continue,
                };
                out.push(SlotStatus {
                    slot,
                    shadow: shadow as u8,
                    state: state.name().into(),
                    message: v.message,
                    segment: v.segment,
                    count: v.count,
                    missing: members_of(job.members & !v.seen).collect(),
                });
            }
        }
        Ok(out)
    }

    /// Counters summed over CPUs, by name.
    pub fn counters(&self) -> Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for c in Counter::ALL {
            let v = self
                .counters
                .get(&(c as u32), 0)
                .map_err(map_err("COUNTERS"))?;
            out.insert(c.name().to_string(), v.iter().sum());
        }
        Ok(out)
    }

    /// The switch's address, collective port and MAC as the dataplane has them.
    pub fn switch_config(&self) -> Result<SwitchConfig> {
        self.switch.get(&0, 0).map_err(map_err("SWITCH"))
    }
}
