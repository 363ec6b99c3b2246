//! Jobs in the dataplane's maps: adding (slots, members, egress), removing, updating a
//! joined member's address, and the fault injection the tests and the demo set.

use aya::maps::PerCpuValues;
use xagg_api::{Error, JobSpec};
use xagg_common::{
    counter::JOB_ROW,
    job::{
        job_generation, job_id, job_index, probability_threshold, EgressKey, Faults, MemberAddr,
        EGRESS_SUCCESSOR, MAX_JOBS,
    },
    slot::{SlotImage, MAX_SLOTS},
    Job, Role,
};
use xagg_linux::iface;

use crate::{
    dataplane::{map_err, Dataplane, Result},
    job::{allocate_slots, check_spec, from_job, to_job},
};

impl Dataplane {
    /// The jobs by wire id: the entries of `JOBS` that have members.
    pub fn jobs(&self) -> Result<Vec<(u32, Job)>> {
        let mut v = Vec::new();
        for index in 0..MAX_JOBS as u32 {
            let j = self.jobs.get(&index, 0).map_err(map_err("JOBS"))?;
            if j.members != 0 {
                v.push((job_id(index, j.generation), j));
            }
        }
        v.sort_by_key(|(id, _)| *id);
        Ok(v)
    }

    /// Job `id`: its index's entry, if that holds a job of the id's generation.
    pub(super) fn job(&self, id: u32) -> Result<Job> {
        let index = job_index(id);
        if index >= MAX_JOBS as u32 {
            return Err(crate::Error::NoJob(id));
        }
        let j = self.jobs.get(&index, 0).map_err(map_err("JOBS"))?;
        if j.members == 0 || j.generation != job_generation(id) {
            return Err(crate::Error::NoJob(id));
        }
        Ok(j)
    }

    pub fn add_job(&mut self, spec: &JobSpec) -> Result<JobSpec> {
        let index = job_index(spec.id);
        if index >= MAX_JOBS as u32 {
            return Err(Error::job(
                "id",
                format!(
                    "{}: a job id is generation x 65536 + index, and the index ({index}) must be below {MAX_JOBS}",
                    spec.id
                ),
            )
            .into());
        }
        let held = self.jobs.get(&index, 0).map_err(map_err("JOBS"))?;
        if held.members != 0 {
            let other = job_id(index, held.generation);
            if other == spec.id {
                return Err(crate::Error::JobExists(spec.id));
            }
            return Err(Error::job(
                "id",
                format!(
                    "{}: its index {index} is job {other}'s; choose an id with another index (id mod 65536)",
                    spec.id
                ),
            )
            .into());
        }
        // Validate before allocating so a bad spec reports its real problem.
        check_spec(spec, &self.ports)?;
        // An inner level's or a ring host's uplink, and the job id results carry on it.
        let uplink = match (&spec.parent, &spec.ring) {
            (Some(p), _) => Some(("parent", p.job)),
            (None, Some(_)) => Some(("ring", spec.id)),
            (None, None) => None,
        };
        if let Some((field, upstream)) = uplink {
            if let Ok(other) = self.parents.get(&upstream, 0) {
                if self.job(other).is_ok() {
                    return Err(Error::job(
                        format!("{field}.job"),
                        format!(
                            "job {other} already takes the results of job {upstream} upstream: one job here per job there"
                        ),
                    )
                    .into());
                }
            }
        }
        let jobs = self.jobs()?;
        let used: Vec<(u32, u32)> = jobs
            .iter()
            .map(|(_, j)| (j.slot_base, j.slot_count))
            .collect();
        let base = allocate_slots(&used, spec.slots, MAX_SLOTS).ok_or_else(|| {
            let busy: u32 = used.iter().map(|(_, c)| c).sum();
            crate::Error::NoSlots {
                id: spec.id,
                want: spec.slots,
                free: MAX_SLOTS - busy,
                total: MAX_SLOTS,
            }
        })?;
        let mut job = to_job(spec, base)?;
        job.generation = job_generation(spec.id);
        job.index = index as u8;
        // The index's row of counters, cleared of an earlier job's counts.
        self.clear_counter_row(index)?;
        self.reset_slots(base, spec.slots)?;
        // Ports are distinct within a job (checked by `to_job`): one member per port.
        for (idx, m) in job.member[..job.member_count()].iter().enumerate() {
            let key = EgressKey {
                job: spec.id,
                ifindex: m.ifindex,
            };
            self.egress
                .insert(key, idx as u32, 0)
                .map_err(map_err("EGRESS"))?;
        }
        if job.role == Role::Inner as u8 || job.role == Role::Ring as u8 {
            self.parents
                .insert(job.upstream_job(), spec.id, 0)
                .map_err(map_err("PARENTS"))?;
        }
        if job.role == Role::Ring as u8 {
            // Result copies leaving through the uplink go on to the successor.
            let key = EgressKey {
                job: spec.id,
                ifindex: job.parent.ifindex,
            };
            self.egress
                .insert(key, EGRESS_SUCCESSOR, 0)
                .map_err(map_err("EGRESS"))?;
        }
        self.jobs.set(index, job, 0).map_err(map_err("JOBS"))?;
        Ok(from_job(spec.id, &job))
    }

    pub fn remove_job(&mut self, id: u32) -> Result<()> {
        let job = self.job(id)?;
        // The job goes first, so no packet can reach its slots while they are cleared.
        let free: Job = unsafe { std::mem::zeroed() };
        self.jobs
            .set(job_index(id), free, 0)
            .map_err(map_err("JOBS"))?;
        for m in &job.member[..job.member_count()] {
            let _ = self.egress.remove(&EgressKey {
                job: id,
                ifindex: m.ifindex,
            });
        }
        if job.role == Role::Ring as u8 {
            let _ = self.egress.remove(&EgressKey {
                job: id,
                ifindex: job.parent.ifindex,
            });
        }
        let upstream = job.upstream_job();
        if job.role != Role::Root as u8 && self.parents.get(&upstream, 0).ok() == Some(id) {
            let _ = self.parents.remove(&upstream);
        }
        self.reset_slots(job.slot_base, job.slot_count)
    }

    fn clear_counter_row(&mut self, row: u32) -> Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| crate::Error::Cpus(e))?;
        for i in 0..JOB_ROW as u32 {
            let zero = PerCpuValues::try_from(vec![0u64; cpus]).map_err(crate::Error::PerCpu)?;
            self.job_counters
                .set(row * JOB_ROW as u32 + i, zero, 0)
                .map_err(map_err("JOB_COUNTERS"))?;
        }
        Ok(())
    }

    /// Slots no job holds.
    pub fn free_slots(&self) -> Result<u32> {
        let used: u32 = self.jobs()?.iter().map(|(_, j)| j.slot_count).sum();
        Ok(MAX_SLOTS - used)
    }

    /// Makes `addr` member `member`'s address in job `id` (a member that joined again
    /// after a restart, from another port or address): its slots are kept.
    pub fn update_member(&mut self, id: u32, member: usize, addr: MemberAddr) -> Result<()> {
        let mut job = self.job(id)?;
        let old = job.member[member];
        if old.ifindex != addr.ifindex {
            let _ = self.egress.remove(&EgressKey {
                job: id,
                ifindex: old.ifindex,
            });
            self.egress
                .insert(
                    EgressKey {
                        job: id,
                        ifindex: addr.ifindex,
                    },
                    member as u32,
                    0,
                )
                .map_err(map_err("EGRESS"))?;
        }
        job.member[member] = addr;
        self.jobs
            .set(job_index(id), job, 0)
            .map_err(map_err("JOBS"))
    }

    /// A value that changes whenever a round of job `id` moves on (its slots' rounds and
    /// members seen): how the daemon tells an idle job.
    pub fn activity(&self, id: u32) -> Result<u64> {
        let job = self.job(id)?;
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for i in job.slot_base..job.slot_base + job.slot_count {
            let s = self.slot(i)?;
            for c in &s.shadow {
                for v in [c.message as u64, c.segment as u64, c.seen] {
                    h = (h ^ v).wrapping_mul(0x0100_0000_01b3);
                }
            }
        }
        Ok(h)
    }

    fn reset_slots(&mut self, base: u32, count: u32) -> Result<()> {
        let empty: SlotImage = unsafe { std::mem::zeroed() };
        for i in base..base + count {
            self.slots.set(i, empty, 0).map_err(map_err("SLOTS"))?;
        }
        Ok(())
    }

    /// The switch port with interface index `ifindex`, if it is one.
    pub fn port_named(&self, ifindex: u32) -> Option<String> {
        self.ports
            .iter()
            .find(|p| iface::ifindex(p).ok() == Some(ifindex))
            .cloned()
    }

    /// Sets the fault injection probabilities (0 turns a fault off).
    pub fn set_faults(&mut self, drop_contribution: f64, drop_result: f64) -> Result<()> {
        for (name, p) in [
            ("drop_contribution", drop_contribution),
            ("drop_result", drop_result),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(crate::Error::Probability { name, p });
            }
        }
        let f = Faults {
            drop_contribution: probability_threshold(drop_contribution),
            drop_result: probability_threshold(drop_result),
        };
        self.faults.set(0, f, 0).map_err(map_err("FAULTS"))
    }

    /// The fault injection in force: the fractions of contributions and of result copies
    /// dropped (as set, to the threshold's precision).
    pub fn faults(&self) -> Result<(f64, f64)> {
        let f = self.faults.get(&0, 0).map_err(map_err("FAULTS"))?;
        let p = |t: u32| t as f64 / u32::MAX as f64;
        Ok((p(f.drop_contribution), p(f.drop_result)))
    }
}
