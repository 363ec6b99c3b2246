//! The join registry against a dataplane stand-in: no root, no namespaces.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::Duration,
};

use xagg_api::JobSpec;
use xagg_common::{job::MemberAddr, JobShape};
use xagg_join::{
    CredentialKey, JobKey, JoinReply, JoinRequest, Levels, MemberReply, MemberRequest, Secret,
};

use xagg_common::wire::{DType, Op};

use super::{
    registry::{Lifecycle, Route},
    JobTable, Joins,
};
use crate::config::Config;

const SLOTS: u32 = 1024;
const QUOTA: u32 = 300;
const CRED: CredentialKey = CredentialKey([0x42; 32]);
const SECRET: Secret = Secret([7; 32]);

/// The dataplane stand-in: ports 11..=14 (`p0`..`p3`), the hellos it saw, its jobs.
#[derive(Default)]
struct Table {
    hellos: HashMap<u64, MemberAddr>,
    jobs: BTreeMap<u32, (u32, JobSpec)>,
    updated: Vec<(u32, usize)>,
    /// What `waiting` answers: (slot, message, segment, the members each waits for).
    waiting: Vec<(u32, u32, u32, Vec<u8>)>,
}

impl Table {
    /// A hello from behind port `p{port}` with token `token`.
    fn hello(&mut self, token: u64, port: u8) {
        self.hellos.insert(
            token,
            MemberAddr {
                ifindex: 11 + u32::from(port),
                ip: [10, 0, 0, 10 + port],
                mac: [2, 0, 0, 0, 0, 10 + port],
                port: [0xbb, 10 + port],
            },
        );
    }
}

impl JobTable for Table {
    fn take_hello(&mut self, token: u64) -> Option<MemberAddr> {
        self.hellos.remove(&token)
    }
    fn has_hello(&self, token: u64) -> bool {
        self.hellos.contains_key(&token)
    }
    fn port_named(&self, ifindex: u32) -> Option<String> {
        (11..=14)
            .contains(&ifindex)
            .then(|| format!("p{}", ifindex - 11))
    }
    fn free_slots(&self) -> Result<u32, crate::Error> {
        Ok(SLOTS - self.jobs.values().map(|j| j.1.slots).sum::<u32>())
    }
    fn jobs(&self) -> Result<Vec<(u32, u32)>, crate::Error> {
        Ok(self.jobs.iter().map(|(id, j)| (*id, j.0)).collect())
    }
    fn add_job(&mut self, spec: &JobSpec) -> Result<(), crate::Error> {
        spec.shape()?;
        if self.jobs.contains_key(&spec.id) {
            return Err(crate::Error::JobExists(spec.id));
        }
        let free = self.free_slots()?;
        if spec.slots > free {
            return Err(crate::Error::NoSlots {
                id: spec.id,
                want: spec.slots,
                free,
                total: SLOTS,
            });
        }
        self.jobs.insert(spec.id, (SLOTS - free, spec.clone()));
        Ok(())
    }
    fn update_member(&mut self, id: u32, member: usize, _: MemberAddr) -> Result<(), crate::Error> {
        self.updated.push((id, member));
        self.jobs
            .contains_key(&id)
            .then_some(())
            .ok_or(crate::Error::NoJob(id))
    }
    fn remove_job(&mut self, id: u32) -> Result<(), crate::Error> {
        self.jobs
            .remove(&id)
            .map(drop)
            .ok_or(crate::Error::NoJob(id))
    }
    fn waiting(&self, _: u32) -> Vec<(u32, u32, u32, Vec<u8>)> {
        self.waiting.clone()
    }
    fn activity(&self, _: u32) -> Result<u64, crate::Error> {
        Ok(0)
    }
}

/// A state directory and a credential key of the test's own.
fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xagg-join-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("cred.key"), "42".repeat(32)).unwrap();
    d
}

fn config(dir: &std::path::Path) -> Config {
    Config::parse(&format!(
        "[switch]\nports = [\"p0\", \"p1\", \"p2\", \"p3\"]\naddress = \"10.0.0.1\"\n[daemon]\nstate_dir = \"{}\"\n[[credential]]\nname = \"test\"\nkey_file = \"{}\"\nslot_quota = {QUOTA}\n",
        dir.join("state").display(),
        dir.join("cred.key").display()
    ))
    .unwrap()
}

struct Switch {
    joins: Joins,
    table: Table,
    dir: PathBuf,
}

impl Drop for Switch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Switch {
    fn new(test: &str) -> Self {
        let dir = dir(test);
        let table = Table::default();
        let joins = Joins::new(&config(&dir), "10.0.0.1:47800".parse().unwrap(), &table).unwrap();
        Self { joins, table, dir }
    }

    /// Rank `rank` of job `key` joins from behind port `p{rank % 4}`, its hello seen; the
    /// first to join (`admit`) creates the job.
    fn join(&mut self, key: JobKey, shape: JobShape, rank: u8, admit: bool) -> JoinReply {
        self.join_as(key, shape, rank, u64::from(rank) + 1, rank % 4, admit, None)
    }

    #[expect(clippy::too_many_arguments, reason = "a join's fields")]
    fn join_as(
        &mut self,
        key: JobKey,
        shape: JobShape,
        rank: u8,
        token: u64,
        port: u8,
        admit: bool,
        levels: Option<Levels>,
    ) -> JoinReply {
        self.table.hello(token, port);
        let nonce = self.joins.nonce(None).nonce;
        let admission = admit.then_some(("test", &CRED));
        let req = JoinRequest::new(key, &SECRET, shape, rank, token, nonce, admission, levels);
        self.joins.join(&mut self.table, &req)
    }

    fn leave(&mut self, key: JobKey, rank: u8) -> MemberReply {
        let nonce = self.joins.nonce(None).nonce;
        let req = MemberRequest::new(key, &SECRET, "leave", rank, nonce);
        self.joins.member(&mut self.table, "leave", &req)
    }

    fn state(&self, key: JobKey) -> Option<&Lifecycle> {
        self.joins.jobs.get(&key).map(|j| &j.state)
    }
}

fn shape(members: usize, slots: usize) -> JobShape {
    JobShape::new(members, slots, 256).expect("a valid shape")
}

fn refusal(r: &JoinReply) -> &str {
    match r {
        JoinReply::Refused { reason } => reason,
        other => panic!("not refused: {other:?}"),
    }
}

const KEY: JobKey = JobKey([1; 16]);

#[test]
fn joining_every_rank_makes_the_job_run() {
    let mut s = Switch::new("every-rank");
    let r = s.join(KEY, shape(3, 8), 0, true);
    assert!(
        matches!(&r, JoinReply::Pending { missing, .. } if missing == &[1, 2]),
        "{r:?}"
    );
    assert!(matches!(s.state(KEY), Some(Lifecycle::Pending)));
    assert!(matches!(
        s.join(KEY, shape(3, 8), 1, false),
        JoinReply::Pending { .. }
    ));
    assert!(s.table.jobs.is_empty(), "not in the dataplane before");
    let r = s.join(KEY, shape(3, 8), 2, false);
    let JoinReply::Ready {
        job, member, path, ..
    } = r
    else {
        panic!("{r:?}")
    };
    assert_eq!((member, path), (2, None));
    assert!(matches!(
        s.state(KEY),
        Some(Lifecycle::Running { route: Route::Root })
    ));
    let spec = &s.table.jobs[&job].1;
    assert_eq!(spec.members.len(), 3);
    // Joins state no op or type: the entry counts the 256-byte segments in i32s.
    assert_eq!(
        (spec.op, spec.dtype, spec.segment),
        (Op::Sum, DType::I32, 64)
    );
    assert_eq!(spec.members[1].interface, "p1");
    let l = &s.joins.listing()[0];
    assert!(l.ready);
    assert_eq!((l.route.as_str(), l.parent_member), ("members", None));
    assert_eq!((l.present.as_slice(), l.missing.len()), (&[0, 1, 2][..], 0));
}

#[test]
fn a_rank_joining_again_keeps_its_place() {
    let mut s = Switch::new("again");
    s.join(KEY, shape(2, 8), 0, true);
    let JoinReply::Ready { job, .. } = s.join(KEY, shape(2, 8), 1, false) else {
        panic!()
    };
    // The same rank from the same hello: the dataplane's member is written again.
    assert!(matches!(
        s.join(KEY, shape(2, 8), 1, false),
        JoinReply::Ready { member: 1, .. }
    ));
    assert_eq!(s.table.updated, [(job, 1)]);
}

#[test]
fn refused_joins_change_nothing() {
    let mut s = Switch::new("refused");
    // No job, and no admission to create one.
    let r = s.join(KEY, shape(2, 8), 0, false);
    assert!(refusal(&r).contains("no admission"), "{r:?}");
    assert!(s.joins.jobs.is_empty());
    // A job created by a join that is refused goes with it (a hello from no port).
    s.table.hellos.insert(9, MemberAddr::default());
    let nonce = s.joins.nonce(None).nonce;
    let req = JoinRequest::new(
        KEY,
        &SECRET,
        shape(2, 8),
        0,
        9,
        nonce,
        Some(("test", &CRED)),
        None,
    );
    let r = s.joins.join(&mut s.table, &req);
    assert!(refusal(&r).contains("not a port"), "{r:?}");
    assert!(s.joins.jobs.is_empty());
    // A spent nonce.
    s.join(KEY, shape(2, 8), 0, true);
    let r = s.joins.join(&mut s.table, &req);
    assert!(refusal(&r).contains("nonce"), "{r:?}");
    // Another secret.
    let nonce = s.joins.nonce(None).nonce;
    s.table.hello(21, 1);
    let req = JoinRequest::new(KEY, &Secret([8; 32]), shape(2, 8), 1, 21, nonce, None, None);
    let r = s.joins.join(&mut s.table, &req);
    assert!(refusal(&r).contains("secret"), "{r:?}");
    let l = &s.joins.listing()[0];
    assert_eq!((l.present.as_slice(), l.ready), (&[0][..], false));
    // Another shape, from a rank that proves the secret: it cannot run so, and every
    // rank's next join hears why at once.
    let r = s.join(KEY, shape(3, 8), 1, false);
    assert!(refusal(&r).contains("same shape"), "{r:?}");
    assert!(s.joins.jobs.is_empty());
    let r = s.join(KEY, shape(2, 8), 0, false);
    assert!(
        refusal(&r).contains("failed: rank 1's join was refused (the job has 2 members"),
        "{r:?}"
    );
    // Two ranks behind one port (two processes a namespace): the same, at once.
    const KEY2: JobKey = JobKey([0x77; 16]);
    s.join(KEY2, shape(2, 8), 0, true);
    let r = s.join_as(KEY2, shape(2, 8), 1, 20, 0, false, None);
    assert!(refusal(&r).contains("already behind port p0"), "{r:?}");
    assert!(s.joins.jobs.is_empty());
    let r = s.join(KEY2, shape(2, 8), 0, false);
    assert!(
        refusal(&r).contains(
            "failed: rank 1's join was refused (rank 0 of this job is already behind port p0"
        ),
        "{r:?}"
    );
}

/// Two live processes asking as one rank of a gathering job: the second is refused,
/// naming the first's port and address, instead of the two trading the place at every
/// poll until the join timeout; once the first has been silent for a while, a process
/// replacing it is taken.
#[test]
fn a_rank_claimed_by_another_live_process_is_refused() {
    let mut s = Switch::new("claimed");
    assert!(matches!(
        s.join(KEY, shape(3, 8), 0, true),
        JoinReply::Pending { .. }
    ));
    let r = s.join_as(KEY, shape(3, 8), 0, 40, 1, false, None);
    assert!(
        refusal(&r).contains(
            "rank 0 of this job is claimed by another process, behind port p0 at 10.0.0.10:"
        ),
        "{r:?}"
    );
    // The first still holds it, and asks on.
    assert!(matches!(
        s.join(KEY, shape(3, 8), 0, false),
        JoinReply::Pending { .. }
    ));
    // Silent for 3 s (its process gone): the other is taken.
    s.joins.jobs.get_mut(&KEY).unwrap().members[0]
        .as_mut()
        .unwrap()
        .renewed_unix_s -= 3;
    let r = s.join_as(KEY, shape(3, 8), 0, 41, 1, false, None);
    assert!(matches!(r, JoinReply::Pending { .. }), "{r:?}");
}

/// A stranger learns no credential names: an unknown name and a known name with another
/// key are refused in the same words.
#[test]
fn unknown_credentials_and_wrong_keys_answer_alike() {
    let mut s = Switch::new("names");
    let wrong = CredentialKey([9; 32]);
    let mut answers = Vec::new();
    for (name, key) in [("test", &wrong), ("nosuch", &CRED)] {
        s.table.hello(30, 0);
        let nonce = s.joins.nonce(None).nonce;
        let req = JoinRequest::new(
            KEY,
            &SECRET,
            shape(2, 8),
            0,
            30,
            nonce,
            Some((name, key)),
            None,
        );
        let r = s.joins.join(&mut s.table, &req);
        answers.push(refusal(&r).replace(name, "NAME"));
    }
    assert_eq!(answers[0], answers[1]);
    assert!(
        answers[0].contains("is not one this daemon knows with that key"),
        "{answers:?}"
    );
    assert!(s.joins.jobs.is_empty());
}

#[test]
fn a_job_the_switch_cannot_take_fails_for_every_rank() {
    let mut s = Switch::new("cannot-take");
    let r = s.join(KEY, shape(2, 8), 0, true);
    assert!(matches!(r, JoinReply::Pending { .. }), "{r:?}");
    // A job added by hand takes every slot while the ranks gather.
    s.table.jobs.insert(
        99,
        (
            0,
            JobSpec {
                id: 99,
                op: xagg_common::wire::Op::Sum,
                dtype: xagg_common::wire::DType::I32,
                segment: 64,
                slots: SLOTS,
                members: Vec::new(),
                slot_base: None,
                parent: None,
                ring: None,
            },
        ),
    );
    let r = s.join(KEY, shape(2, 8), 1, false);
    assert!(
        refusal(&r).contains("the switch cannot take the job"),
        "{r:?}"
    );
    assert!(s.joins.jobs.is_empty());
    let r = s.join(KEY, shape(2, 8), 0, false);
    assert!(
        refusal(&r).contains("failed: rank 1's join was refused (the switch cannot take the job"),
        "{r:?}"
    );
}

#[test]
fn a_join_before_its_hello_is_told_so() {
    let mut s = Switch::new("no-hello");
    let nonce = s.joins.nonce(None).nonce;
    let req = JoinRequest::new(
        KEY,
        &SECRET,
        shape(2, 8),
        0,
        5,
        nonce,
        Some(("test", &CRED)),
        None,
    );
    assert_eq!(s.joins.join(&mut s.table, &req), JoinReply::NoHello);
}

#[test]
fn leaving() {
    let mut s = Switch::new("leave");
    s.join(KEY, shape(3, 8), 0, true);
    s.join(KEY, shape(3, 8), 1, false);
    // A pending job forgets a rank that leaves: it must join again.
    assert_eq!(s.leave(KEY, 0), MemberReply::Left);
    assert_eq!(s.joins.listing()[0].missing, [0, 2]);
    s.join(KEY, shape(3, 8), 0, false);
    let JoinReply::Ready { job, .. } = s.join(KEY, shape(3, 8), 2, false) else {
        panic!()
    };
    // A running job keeps a rank that left, until every rank has.
    s.leave(KEY, 0);
    s.leave(KEY, 1);
    assert_eq!(s.joins.listing()[0].missing, [0, 1]);
    assert!(s.table.jobs.contains_key(&job));
    s.leave(KEY, 2);
    assert!(s.joins.jobs.is_empty());
    assert!(s.table.jobs.is_empty());
    assert!(matches!(s.leave(KEY, 2), MemberReply::Refused { .. }));
    // A pending job that every rank left goes too.
    s.join(KEY, shape(3, 8), 0, true);
    s.leave(KEY, 0);
    assert!(s.joins.jobs.is_empty());
}

#[test]
fn a_rank_holds_its_job_by_its_lease() {
    let mut s = Switch::new("lease");
    s.join(KEY, shape(2, 8), 0, true);
    let r = s.join(KEY, shape(2, 8), 1, false);
    let JoinReply::Ready { job, lease_s, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(lease_s, Some(30), "the default lease is told to the ranks");
    // Idle long past the idle time: the ranks' leases hold the job.
    s.joins.idle_timeout = Duration::ZERO;
    let renew = |s: &mut Switch, rank: u8| {
        let nonce = s.joins.nonce(None).nonce;
        let req = MemberRequest::new(KEY, &SECRET, "renew", rank, nonce);
        s.joins.member(&mut s.table, "renew", &req)
    };
    let age = |s: &mut Switch, rank: usize, by: u64| {
        let m = s.joins.jobs.get_mut(&KEY).unwrap().members[rank]
            .as_mut()
            .unwrap();
        m.renewed_unix_s -= by;
    };
    age(&mut s, 0, 25);
    age(&mut s, 1, 25);
    std::thread::sleep(Duration::from_millis(2));
    s.joins.tick(&mut s.table);
    assert!(s.table.jobs.contains_key(&job), "within its lease");
    // Rank 0 renews; rank 1 does not, and its lease runs out: the job goes.
    assert_eq!(renew(&mut s, 0), MemberReply::Renewed { lease_s: 30 });
    age(&mut s, 1, 6);
    s.joins.tick(&mut s.table);
    assert!(s.joins.jobs.is_empty() && s.table.jobs.is_empty());
    assert!(
        matches!(renew(&mut s, 0), MemberReply::Refused { reason } if reason.contains("no job"))
    );
    // A rank that left renews nothing.
    s.join(KEY, shape(2, 8), 0, true);
    s.join(KEY, shape(2, 8), 1, false);
    s.leave(KEY, 1);
    let r = renew(&mut s, 1);
    assert!(
        matches!(&r, MemberReply::Refused { reason } if reason.contains("join again")),
        "{r:?}"
    );
}

#[test]
fn a_credential_holds_no_more_slots_than_its_quota() {
    let mut s = Switch::new("quota");
    assert!(matches!(
        s.join(KEY, shape(2, 200), 0, true),
        JoinReply::Pending { .. }
    ));
    let other = JobKey([2; 16]);
    let r = s.join(other, shape(2, 200), 0, true);
    assert!(
        refusal(&r).contains("holds 200 of its 300 slots; this job needs 200"),
        "{r:?}"
    );
    assert!(matches!(
        s.join(other, shape(2, 100), 0, true),
        JoinReply::Pending { .. }
    ));
    // The slots come back when a job goes.
    s.leave(KEY, 0);
    let third = JobKey([3; 16]);
    assert!(matches!(
        s.join(third, shape(2, 200), 0, true),
        JoinReply::Pending { .. }
    ));
    // Ids: dense indices, a new generation each time an index is given again.
    let ids: Vec<u32> = s.joins.listing().iter().map(|l| l.id).collect();
    assert_eq!(ids, [0x1_0002, 0x2_0001]);
}

#[test]
fn a_pending_job_times_out_and_its_key_is_refused_for_a_while() {
    let mut s = Switch::new("timeout");
    s.join(KEY, shape(2, 8), 0, true);
    s.joins.join_timeout = Duration::ZERO;
    std::thread::sleep(Duration::from_millis(2));
    s.joins.tick(&mut s.table);
    assert!(s.joins.jobs.is_empty());
    let r = s.join(KEY, shape(2, 8), 1, true);
    assert!(refusal(&r).contains("timed out"), "{r:?}");
}

mod levels;
mod state_file;
