//! Who may create a job, and whether the switch has room for it: nonces, admission
//! credentials and their slot quotas, the switch's free slots and job indices.
//!
//! A joined job's wire id is a dense index (its low 16 bits, below 256) and a generation
//! (its high 16 bits), counted up each time the index is given again, so a stale id
//! never names a newer job. A job added by hand (`xagg job add --id N`) has index
//! `N mod 65536` and generation `N / 65536`; a joined job never takes an index a job
//! already has.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use log::info;
use xagg_join::{unseal, CredentialKey, JoinRequest, Nonce, Proof, Secret, NONCE_TTL_S};

use super::{
    registry::{Joined, Level},
    table::JobTable,
    Joins,
};
use crate::{Error, Result};

/// Indices a joined job may take (the dataplane holds at most this many jobs).
const MAX_INDEX: u16 = 256;
/// Nonces handed out and not yet spent, at most: a client asking for more pushes the
/// oldest out.
const MAX_NONCES: usize = 4096;

/// Nonces handed out and not yet spent, with when.
#[derive(Default)]
pub(super) struct Nonces(HashMap<Nonce, Instant>);

impl Nonces {
    /// A new single-use nonce.
    pub(super) fn issue(&mut self) -> Nonce {
        let now = Instant::now();
        let ttl = Duration::from_secs(NONCE_TTL_S);
        self.0.retain(|_, t| now.duration_since(*t) < ttl);
        if self.0.len() >= MAX_NONCES {
            if let Some(oldest) = self.0.iter().min_by_key(|(_, t)| **t).map(|(n, _)| *n) {
                self.0.remove(&oldest);
            }
        }
        let nonce = Nonce::random();
        self.0.insert(nonce, now);
        nonce
    }

    /// Spends `nonce`, if it was handed out and is still valid.
    pub(super) fn spend(&mut self, nonce: &Nonce) -> Result<()> {
        match self.0.remove(nonce) {
            Some(t) if t.elapsed() < Duration::from_secs(NONCE_TTL_S) => Ok(()),
            _ => Err(Error::Nonce),
        }
    }
}

/// An admission credential (`[[credential]]`) as joins prove it.
pub(super) struct Credential {
    pub(super) name: String,
    pub(super) key: CredentialKey,
    /// Slots all the jobs created with it may hold at once.
    pub(super) slot_quota: u32,
}

impl Joins {
    /// Creates the job a join names, if it may: its admission proves a credential, whose
    /// quota and the switch's free slots and job indices must have room.
    pub(super) fn create(&mut self, dp: &impl JobTable, req: &JoinRequest) -> Result<()> {
        let (name, secret) = self.admitted(req)?;
        self.within_quota(&name, req)?;
        self.room_for(dp, req)?;
        let id = self.next_id(dp)?;
        // An open level's members are whoever joins (its hosts or leaf switches), counted by
        // the ranks they stand for: its shape's one member is the joiner, not the count.
        let members = match Level::of(req) {
            Level::Open { ranks } => format!("members standing for {ranks} ranks"),
            _ => format!("{} members", req.shape.members()),
        };
        info!(
            "job {id} ({}) created by credential `{name}`: {members}, {} slots, {}-byte segments",
            req.key,
            req.shape.slots(),
            req.shape.segment_bytes()
        );
        self.expired.remove(&req.key);
        self.jobs
            .insert(req.key, Joined::new(req, secret, name, id));
        Ok(())
    }

    /// The credential a join's admission proves, and the job's secret it carries sealed.
    fn admitted(&self, req: &JoinRequest) -> Result<(String, Secret)> {
        let Some(a) = &req.admission else {
            return Err(Error::NoAdmission);
        };
        let refused = |why: &str| {
            info!("a join refused: {why} `{}`", a.credential);
            Error::AdmissionRefused {
                credential: a.credential.clone(),
            }
        };
        let Some(c) = self.credentials.iter().find(|c| c.name == a.credential) else {
            return Err(refused("no [[credential]] named"));
        };
        if !Proof::admission(&c.key, &req.nonce, &req.key, &req.shape).matches(&a.proof) {
            return Err(refused(
                "an admission proof made with another key than credential",
            ));
        }
        let secret = unseal(&a.secret, &c.key, &req.nonce, &req.key);
        if !Proof::join(&secret, req).matches(&req.proof) {
            return Err(Error::SealedSecretProof);
        }
        Ok((c.name.clone(), secret))
    }

    /// Whether credential `name`'s jobs leave room in its quota for the job `req` names.
    fn within_quota(&self, name: &str, req: &JoinRequest) -> Result<()> {
        let quota = self
            .credentials
            .iter()
            .find(|c| c.name == name)
            .map_or(0, |c| c.slot_quota);
        let used: usize = self
            .jobs
            .values()
            .filter(|j| j.credential == name)
            .map(|j| j.shape.slots())
            .sum();
        if used + req.shape.slots() > quota as usize {
            return Err(Error::OverQuota {
                credential: name.into(),
                used,
                quota,
                needs: req.shape.slots(),
            });
        }
        Ok(())
    }

    /// Whether the switch has the job's slots free, after the jobs still gathering their
    /// ranks.
    fn room_for(&self, dp: &impl JobTable, req: &JoinRequest) -> Result<()> {
        let free = dp.free_slots()? as usize;
        let reserved: usize = self
            .jobs
            .values()
            .filter(|j| !j.running())
            .map(|j| j.shape.slots())
            .sum();
        if free < reserved + req.shape.slots() {
            return Err(Error::SwitchFull {
                free: free.saturating_sub(reserved),
                needs: req.shape.slots(),
            });
        }
        Ok(())
    }

    /// The wire id of a new job: the lowest index no job has, its generation counted up.
    fn next_id(&mut self, dp: &impl JobTable) -> Result<u32> {
        let taken: Vec<u16> = dp
            .jobs()?
            .iter()
            .map(|(id, _)| *id as u16)
            .chain(self.jobs.values().map(|j| j.id as u16))
            .collect();
        let Some(index) = (1..MAX_INDEX).find(|i| !taken.contains(i)) else {
            return Err(Error::NoJobIndex { indices: MAX_INDEX });
        };
        let generation = self.generations.entry(index).or_insert(0);
        *generation = generation.wrapping_add(1);
        Ok((u32::from(*generation) << 16) | u32::from(index))
    }
}
