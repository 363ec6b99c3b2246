//! The ring's coordinator: the daemon a job's ranks named places the job's hosts in a ring
//! when the tree fails them (see `xagg_join`'s "The ring").

use xagg_join::{RingHost, RingReply, RingRequest};

use super::Joins;

/// A coordinator's view of a job's hosts: where each is, and why the tree failed (once
/// one host says so, the job goes round the ring).
#[derive(Default)]
pub(super) struct RingState {
    hosts: Vec<RingHost>,
    failed: Option<String>,
}

impl Joins {
    /// A host's word to this daemon as its job's coordinator: where the host is, and
    /// whether its parent failed it. Once a host's tree failed and every host is known,
    /// each is placed in a ring, in the order of the ranks they stand for.
    pub fn ring(&mut self, req: &RingRequest) -> RingReply {
        let no = |reason: String| RingReply::Refused { reason };
        if let Err(e) = self.nonces.spend(&req.nonce) {
            return no(e.to_string());
        }
        let Some(j) = self.jobs.get(&req.key) else {
            return RingReply::Pending {
                why: "the coordinator has not seen the job yet (its own ranks are still joining)"
                    .into(),
            };
        };
        if !xagg_join::Proof::ring(&j.secret, req).matches(&req.proof) {
            return no("the proof does not match the job's secret".into());
        }
        let Some(ranks) = j.level.ranks() else {
            return no("the job has no levels here".into());
        };
        let st = self.rings.entry(req.key).or_default();
        match st.hosts.iter_mut().find(|h| h.first == req.host.first) {
            Some(h) => *h = req.host.clone(),
            None => st.hosts.push(req.host.clone()),
        }
        if st.failed.is_none() {
            st.failed = req.failed.clone();
        }
        let Some(why) = st.failed.clone() else {
            return RingReply::Tree;
        };
        let weight: u32 = st.hosts.iter().map(|h| h.weight).sum();
        if weight < ranks {
            return RingReply::Pending {
                why: format!(
                    "the ring waits for hosts standing for {} more of {ranks} ranks",
                    ranks - weight
                ),
            };
        }
        st.hosts.sort_by_key(|h| h.first);
        let h = st.hosts.len();
        let at = st
            .hosts
            .iter()
            .position(|x| x.first == req.host.first)
            .expect("registered above");
        let successor = st.hosts[(at + 1) % h].clone();
        RingReply::Ring {
            size: h as u8,
            position: at as u8,
            predecessor: st.hosts[(at + h - 1) % h].clone(),
            // This host's partials arrive there after the successor's own ranks.
            member: successor.weight as u8,
            successor,
            why,
        }
    }
}
