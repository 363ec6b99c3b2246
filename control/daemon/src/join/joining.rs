//! A rank's join, step by step: the request's own checks, the nonce, the job (found or
//! created), the member's place and addresses, then what the job does next.

use log::info;
use xagg_common::job::MemberAddr;
use xagg_join::{JoinReply, JoinRequest, Proof};

use super::{
    refused,
    registry::{activate, unix_now, Level, Lifecycle, Member, Route, JOINED_DTYPE, JOINED_OP},
    table::JobTable,
    Joins,
};
use crate::{Error, Result};

/// A join's early answer: a refusal, or no hello seen.
type Answer<T> = Result<T, JoinReply>;

/// How long a rank of a gathering job stays claimed by the process that last asked as it:
/// another process asking as the same rank meanwhile is refused.
const CLAIMED_S: u64 = 3;

impl Joins {
    pub(super) fn try_join(&mut self, dp: &mut impl JobTable, req: &JoinRequest) -> JoinReply {
        let mut fatal = false;
        match self.join_steps(dp, req, &mut fatal) {
            Ok(reply) => reply,
            Err(reply) => {
                if let (true, JoinReply::Refused { reason }) = (fatal, &reply) {
                    self.fail_gathering(req, reason);
                }
                reply
            }
        }
    }

    /// A rank that proved the job's secret was refused for what cannot change — another
    /// shape than the job's (a segment its path cannot carry), a second rank behind a port
    /// that has one, or a job the switch cannot take (a port's MTU, no room): a job still
    /// gathering its ranks cannot run without it, so it fails for every rank at once, with
    /// the reason (each rank's next poll is refused with it), instead of waiting out the
    /// join timeout. A join without the proof changes nothing for anyone; a running job
    /// runs on.
    fn fail_gathering(&mut self, req: &JoinRequest, reason: &str) {
        let Some(j) = self.jobs.get(&req.key) else {
            return;
        };
        if !matches!(j.state, Lifecycle::Pending) {
            return;
        }
        let why = format!("failed: rank {}'s join was refused ({reason})", req.rank);
        log::warn!("job {} ({}) {why}", j.id, j.key);
        self.jobs.remove(&req.key);
        self.expired
            .insert(req.key, (why, std::time::Instant::now()));
        self.save();
    }

    fn join_steps(
        &mut self,
        dp: &mut impl JobTable,
        req: &JoinRequest,
        fatal: &mut bool,
    ) -> Answer<JoinReply> {
        well_formed(req).map_err(refused)?;
        self.nonces.spend(&req.nonce).map_err(refused)?;
        // No job is created for a rank whose hellos have not arrived (yet): it asks again,
        // and at its own timeout says so, with nothing left pending here.
        let known = self.jobs.contains_key(&req.key) || self.expired.contains_key(&req.key);
        if !known && !dp.has_hello(req.hello) {
            return Err(JoinReply::NoHello);
        }
        self.find_or_create(dp, req).map_err(refused)?;
        self.proves(req).map_err(refused)?;
        *fatal = true;
        self.same_shape(req).map_err(refused)?;
        *fatal = false;
        let at = self.place(req)?;
        let (addr, port) = self.member_addr(dp, req, at, fatal)?;
        // The same hello again is the member asking whether the job runs yet, not a
        // member that restarted.
        let known = self.jobs[&req.key].members.get(at).copied().flatten();
        let again = known.is_some_and(|m| m.hello != req.hello);
        // A rank waiting for the others asks every 100 ms: said when it comes, not at
        // every poll (hundreds of lines a join).
        let fresh = again || known.is_none();
        self.take_in(dp, req, at, addr)?;
        // What the job needs of the switch, checked when its last rank is in.
        *fatal = true;
        let reply = self.next_step(dp, req, at, &port, (again, fresh))?;
        self.save();
        Ok(reply)
    }

    /// The job the join names, created if it is new (and may be).
    fn find_or_create(&mut self, dp: &impl JobTable, req: &JoinRequest) -> Result<()> {
        if self.jobs.contains_key(&req.key) {
            return Ok(());
        }
        if let Some((why, _)) = self.expired.get(&req.key) {
            return Err(Error::JobGone { why: why.clone() });
        }
        self.create(dp, req)
    }

    /// Whether the join proves the job's secret.
    fn proves(&self, req: &JoinRequest) -> Result<()> {
        let j = &self.jobs[&req.key];
        if !Proof::join(&j.secret, req).matches(&req.proof) {
            return Err(Error::JobProof);
        }
        Ok(())
    }

    /// Whether the join states the job's shape.
    fn same_shape(&self, req: &JoinRequest) -> Result<()> {
        let j = &self.jobs[&req.key];
        let ranks = req.levels.map(|l| l.ranks);
        if j.shape != req.shape || j.level.ranks() != ranks {
            return Err(Error::ShapeDiffers {
                job: j.shape,
                job_ranks: j.level.ranks(),
                join: req.shape,
                join_ranks: ranks,
            });
        }
        Ok(())
    }

    /// The joining member's index: its rank, or an open level's member found by the first
    /// rank it stands for, or by its hellos' token (a level below that says again what it
    /// stands for), or a new one (the index after the last: the member is added only once
    /// it is taken in, so a join that ends without it leaves no empty place).
    fn place(&self, req: &JoinRequest) -> Answer<usize> {
        let j = &self.jobs[&req.key];
        let Some(l) = req.levels.filter(|_| j.level.is_open()) else {
            return Ok(usize::from(req.rank));
        };
        let found = j.standing_for(l.first).or_else(|| {
            j.members
                .iter()
                .position(|m| m.is_some_and(|m| m.hello == req.hello && !m.left))
        });
        let stands_for = |i: usize| j.members[i].and_then(|m| m.stands_for);
        match found {
            Some(i) if j.running() && stands_for(i) != Some((l.first, l.weight)) => {
                Err(refused(format!(
                    "the job runs with this member standing for {:?} (first rank, ranks), not {:?}",
                    stands_for(i),
                    (l.first, l.weight)
                )))
            }
            Some(i) => Ok(i),
            None if j.running() => Err(refused(format!(
                "the job runs without a member standing for rank {}",
                l.first
            ))),
            None => Ok(j.members.len()),
        }
    }

    /// The member's port and addresses, from its hello (or the one it already gave): a
    /// port of this switch, no other member's.
    fn member_addr(
        &self,
        dp: &mut impl JobTable,
        req: &JoinRequest,
        at: usize,
        fatal: &mut bool,
    ) -> Answer<(MemberAddr, String)> {
        let j = &self.jobs[&req.key];
        let recorded = j.members.get(at).copied().flatten();
        let known = recorded.filter(|m| m.hello == req.hello);
        let addr = match known {
            Some(m) => m.addr,
            None => dp.take_hello(req.hello).ok_or(JoinReply::NoHello)?,
        };
        let Some(port) = dp.port_named(addr.ifindex) else {
            return Err(refused(format!(
                "the hello came in on interface index {}, which is not a port of this switch",
                addr.ifindex
            )));
        };
        if let Some(other) = j.members.iter().enumerate().position(|(r, m)| {
            r != at && m.is_some_and(|m| !m.left && m.addr.ifindex == addr.ifindex)
        }) {
            // Two ranks behind one port cannot both be members, whoever asks first: the job
            // fails for every rank at once (seen: torchrun's two processes a namespace
            // waited out the join timeout, then were told ranks did not join).
            *fatal = true;
            return Err(refused(format!(
                "rank {other} of this job is already behind port {port}: one member per switch port (several ranks behind one port need host-level aggregation)"
            )));
        }
        // Another live process asking as this rank of a job still gathering: two
        // processes given one rank. Taking each in turn made them trade the place at
        // every poll, both waiting out the join timeout.
        if let Some(m) = recorded {
            let elsewhere = m.hello != req.hello
                && (m.addr.ifindex, m.addr.ip, m.addr.port) != (addr.ifindex, addr.ip, addr.port);
            let quiet = unix_now().saturating_sub(m.renewed_unix_s);
            if elsewhere && !m.left && !j.running() && quiet < CLAIMED_S {
                let theirs = dp.port_named(m.addr.ifindex).unwrap_or_else(|| "?".into());
                let ip = std::net::Ipv4Addr::from(m.addr.ip);
                return Err(refused(format!(
                    "rank {at} of this job is claimed by another process, behind port {theirs} at {ip}:{}, which asked {quiet} s ago: were two processes given rank {at}? (A process replacing one that died is taken once that one has been silent for {CLAIMED_S} s.)",
                    u16::from_be_bytes(m.addr.port)
                )));
            }
        }
        Ok((addr, port))
    }

    /// Records the member at index `at`, unless an open level's members would stand for
    /// more ranks than the job has (in the dataplane first if the job runs: a refusal
    /// there changes nothing).
    fn take_in(
        &mut self,
        dp: &mut impl JobTable,
        req: &JoinRequest,
        at: usize,
        addr: MemberAddr,
    ) -> Answer<()> {
        let j = self.jobs.get_mut(&req.key).expect("found or created");
        if let Some(l) = req.levels.filter(|_| j.level.is_open()) {
            let others: u32 = (j.members.iter().enumerate())
                .filter(|&(i, m)| i != at && m.is_some_and(|m| !m.left))
                .filter_map(|(_, m)| m.and_then(|m| m.stands_for))
                .map(|s| s.1)
                .sum();
            if others + l.weight > l.ranks {
                return Err(refused(format!(
                    "members here already stand for {others} of the job's {} ranks: this one's {} would be too many",
                    l.ranks, l.weight
                )));
            }
        }
        if j.running() {
            dp.update_member(j.id, at, addr).map_err(refused)?;
        }
        let member = Some(Member {
            addr,
            hello: req.hello,
            left: false,
            stands_for: req.levels.map(|l| (l.first, l.weight)),
            renewed_unix_s: unix_now(),
        });
        if at == j.members.len() {
            j.members.push(member);
        } else {
            j.members[at] = member;
        }
        if let Some(l) = req.levels {
            if j.coordinator.is_none() {
                j.coordinator = l.coordinator;
            }
        }
        Ok(())
    }

    /// What the job does now that member `at` is in: runs (added to the dataplane once
    /// complete), joins its parent, or waits for more members.
    fn next_step(
        &mut self,
        dp: &mut impl JobTable,
        req: &JoinRequest,
        at: usize,
        port: &str,
        (again, fresh): (bool, bool),
    ) -> Answer<JoinReply> {
        let has_parent = self.parent.as_ref().is_some_and(|p| p.daemon.is_some());
        let lease_s = self.lease.as_secs();
        let j = self.jobs.get_mut(&req.key).expect("found or created");
        if j.running() {
            if again {
                info!(
                    "job {} ({}): rank {at} joined again, behind {port}",
                    j.id, j.key
                );
            }
            return Ok(j.ready(at as u8, dp, lease_s));
        }
        let gone_up = matches!(j.state, Lifecycle::JoiningParent { .. });
        // An open level below a parent goes up unless its first members stand for every
        // rank (or it has gone up already).
        let up = j.level.is_open() && has_parent && (!j.complete() || gone_up);
        if up || (j.complete() && j.needs_parent()) {
            let reply = JoinReply::Pending {
                missing: Vec::new(),
                waited_s: j.since.elapsed().as_secs_f64(),
                waiting: j.waiting(up),
            };
            self.join_parent(req.key);
            return Ok(reply);
        }
        if !j.complete() {
            if fresh {
                info!("job {} ({}): rank {at} in, behind {port}", j.id, j.key);
            }
            return Ok(JoinReply::Pending {
                missing: j.missing(),
                waited_s: j.since.elapsed().as_secs_f64(),
                waiting: j.waiting(up),
            });
        }
        if j.level.is_open() {
            j.order_by_first();
        }
        let at = match req.levels.filter(|_| j.level.is_open()) {
            Some(l) => j.standing_for(l.first).unwrap_or(at),
            None => at,
        };
        let route = Route::Root;
        if let Err(e) = activate(dp, j, &route, JOINED_OP, JOINED_DTYPE) {
            // The job goes with this refusal, and every rank hears why
            // (`fail_gathering`).
            return Err(refused(format!("the switch cannot take the job: {e}")));
        }
        j.state = Lifecycle::Running { route };
        j.activity = None;
        j.active_unix_s = unix_now();
        // The lease runs from here for every member, however long the first waited.
        j.renew_all(j.active_unix_s);
        info!(
            "job {} ({}): all {} members in, running",
            j.id,
            j.key,
            j.members.len()
        );
        Ok(j.ready(at as u8, dp, lease_s))
    }
}

/// The checks a join passes before its nonce is spent (its shape was checked as it was
/// read): an open level's shape of one member, sensible levels, whole elements per
/// segment, a rank within the shape.
fn well_formed(req: &JoinRequest) -> Result<()> {
    let open = Level::of(req).is_open();
    let members = req.shape.members();
    if open && members != 1 {
        return Err(Error::OpenShape(members));
    }
    if let Some(l) = req.levels {
        if l.weight == 0 || l.ranks < l.weight || (!open && (l.ranks as usize) < members) {
            return Err(Error::Levels {
                ranks: l.ranks,
                weight: l.weight,
                first: l.first,
                members,
            });
        }
    }
    req.shape
        .segment_elements(xagg_api::lane(JOINED_OP, JOINED_DTYPE)?)
        .map_err(Error::Shape)?;
    if !open && usize::from(req.rank) >= members {
        return Err(Error::RankOutside {
            rank: req.rank,
            members,
        });
    }
    Ok(())
}
