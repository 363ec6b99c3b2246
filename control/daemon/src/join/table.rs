//! What the joins need of the dataplane ([`JobTable`]), and the daemon's [`Dataplane`]
//! giving it.

use xagg_api::JobSpec;
use xagg_common::job::MemberAddr;

use crate::{dataplane::Dataplane, Result};

/// What the join registry needs of the dataplane: the daemon's [`Dataplane`], or a
/// stand-in (the API's fuzz target, the unit tests).
pub trait JobTable {
    /// Takes the hello recorded under `token`.
    fn take_hello(&mut self, token: u64) -> Option<MemberAddr>;
    /// Whether a hello is recorded under `token` (left there).
    fn has_hello(&self, token: u64) -> bool;
    /// The switch port with interface index `ifindex`.
    fn port_named(&self, ifindex: u32) -> Option<String>;
    fn free_slots(&self) -> Result<u32>;
    /// The jobs' wire ids and first slots.
    fn jobs(&self) -> Result<Vec<(u32, u32)>>;
    fn add_job(&mut self, spec: &JobSpec) -> Result<()>;
    fn update_member(&mut self, id: u32, member: usize, addr: MemberAddr) -> Result<()>;
    fn remove_job(&mut self, id: u32) -> Result<()>;
    /// Job `id`'s busy slots waiting for members: (slot, message, segment, missing).
    fn waiting(&self, id: u32) -> Vec<(u32, u32, u32, Vec<u8>)>;
    /// A value that changes whenever a round of job `id` moves on.
    fn activity(&self, id: u32) -> Result<u64>;
}

impl JobTable for Dataplane {
    fn take_hello(&mut self, token: u64) -> Option<MemberAddr> {
        Dataplane::take_hello(self, token)
    }

    fn has_hello(&self, token: u64) -> bool {
        Dataplane::has_hello(self, token)
    }
    fn port_named(&self, ifindex: u32) -> Option<String> {
        Dataplane::port_named(self, ifindex)
    }
    fn free_slots(&self) -> Result<u32> {
        Dataplane::free_slots(self)
    }
    fn jobs(&self) -> Result<Vec<(u32, u32)>> {
        Dataplane::jobs(self)
            .map(|jobs| jobs.into_iter().map(|(id, j)| (id, j.slot_base)).collect())
    }
    fn add_job(&mut self, spec: &JobSpec) -> Result<()> {
        Dataplane::add_job(self, spec).map(drop)
    }
    fn update_member(&mut self, id: u32, member: usize, addr: MemberAddr) -> Result<()> {
        Dataplane::update_member(self, id, member, addr)
    }
    fn remove_job(&mut self, id: u32) -> Result<()> {
        Dataplane::remove_job(self, id)
    }
    fn waiting(&self, id: u32) -> Vec<(u32, u32, u32, Vec<u8>)> {
        Dataplane::job_status(self, id)
            .map(|s| {
                s.into_iter()
                    .filter(|s| !s.missing.is_empty())
                    .map(|s| (s.slot, s.message, s.segment, s.missing))
                    .collect()
            })
            .unwrap_or_default()
    }
    fn activity(&self, id: u32) -> Result<u64> {
        Dataplane::activity(self, id)
    }
}
