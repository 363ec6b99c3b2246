//! The state file, as earlier daemons wrote it, and a restart adopting its jobs.

use xagg_api::JobSpec;

use super::{config, dir, Table};
use crate::join::{
    registry::{Level, Lifecycle},
    state_file::Saved,
    Joins,
};

/// A state file as the daemon has always written it: a pending job with levels, a job
/// running below its parent, one running round a ring, one at the root.
const STATE_FILE: &str = r#"{"jobs":[{"key":"01010101010101010101010101010101","secret":"0707070707070707070707070707070707070707070707070707070707070707","credential":"test","shape":{"members":2,"slots":8,"segment_bytes":256},"id":65537,"members":[{"addr":{"ifindex":11,"ip":[10,0,0,10],"mac":[2,0,0,0,0,10],"port":[187,10]},"hello":1,"left":false},null],"ready":false,"created_unix_s":1700000000,"active_unix_s":1700000000,"ranks":4,"stands_for":[[0,1],null],"open":false,"parent":null,"ring":null,"path":null,"coordinator":"10.0.0.2:47900"},{"key":"02020202020202020202020202020202","secret":"0707070707070707070707070707070707070707070707070707070707070707","credential":"test","shape":{"members":1,"slots":8,"segment_bytes":256},"id":65538,"members":[{"addr":{"ifindex":12,"ip":[10,0,0,11],"mac":[2,0,0,0,0,11],"port":[187,11]},"hello":2,"left":true}],"ready":true,"created_unix_s":1700000000,"active_unix_s":1700000100,"ranks":2,"stands_for":[[0,1]],"open":false,"parent":{"interface":"p3","mac":"02:00:00:00:00:99","addr":"10.0.1.1:47800","job":7,"member":1},"ring":null,"path":{"path":"tree"},"coordinator":null},{"key":"03030303030303030303030303030303","secret":"0707070707070707070707070707070707070707070707070707070707070707","credential":"test","shape":{"members":1,"slots":8,"segment_bytes":256},"id":65539,"members":[{"addr":{"ifindex":13,"ip":[10,0,0,12],"mac":[2,0,0,0,0,12],"port":[187,12]},"hello":3,"left":false}],"ready":true,"created_unix_s":1700000000,"active_unix_s":1700000100,"ranks":2,"stands_for":[[1,1]],"open":false,"parent":null,"ring":{"interface":"p3","size":2,"position":1,"predecessor":{"mac":"02:00:00:00:00:98","addr":"10.0.2.1:47800","member":0,"job":9},"successor":{"mac":"02:00:00:00:00:98","addr":"10.0.2.1:47800","member":1,"job":9}},"path":{"path":"ring","why":"the parent refused the job"},"coordinator":null},{"key":"04040404040404040404040404040404","secret":"0707070707070707070707070707070707070707070707070707070707070707","credential":"test","shape":{"members":2,"slots":8,"segment_bytes":256},"id":65540,"members":[{"addr":{"ifindex":11,"ip":[10,0,0,10],"mac":[2,0,0,0,0,10],"port":[187,10]},"hello":4,"left":false},{"addr":{"ifindex":12,"ip":[10,0,0,11],"mac":[2,0,0,0,0,11],"port":[187,11]},"hello":5,"left":false}],"ready":true,"created_unix_s":1700000000,"active_unix_s":0,"ranks":null,"stands_for":[null,null],"open":false,"parent":null,"ring":null,"path":null,"coordinator":null}],"generations":{"1":1,"2":1,"3":1,"4":1}}"#;

#[test]
fn the_state_file_reads_and_writes_as_it_always_has() {
    let saved = Saved::parse(STATE_FILE).unwrap();
    let jobs = saved.jobs().unwrap();
    let states: Vec<String> = jobs
        .iter()
        .map(|j| match &j.state {
            Lifecycle::Pending => "pending".into(),
            Lifecycle::JoiningParent { .. } => "joining".into(),
            Lifecycle::Running { route } => format!("{:?}", route.path()),
        })
        .collect();
    assert_eq!(
        states,
        [
            "pending",
            "Some(Tree)",
            "Some(Ring { why: \"the parent refused the job\" })",
            "None"
        ]
    );
    assert_eq!(
        jobs[2].route_listing(),
        ("ring", None, Some("the parent refused the job".into()))
    );
    assert_eq!(jobs[0].members[0].unwrap().stands_for, Some((0, 1)));
    assert_eq!(jobs[0].level, Level::Fixed { ranks: 4 });
    let again = Saved::new(jobs.iter(), saved.generations.clone());
    assert_eq!(again.to_json().unwrap(), STATE_FILE);
}

/// An open level as daemons saved it before its shape became one member's: 0 members.
#[test]
fn an_open_level_saved_with_0_members_reads_as_open() {
    let before = r#"{"jobs":[{"key":"05050505050505050505050505050505","secret":"0707070707070707070707070707070707070707070707070707070707070707","credential":"test","shape":{"members":0,"slots":8,"segment_bytes":256},"id":65541,"members":[{"addr":{"ifindex":11,"ip":[10,0,0,10],"mac":[2,0,0,0,0,10],"port":[187,10]},"hello":1,"left":false}],"ready":false,"created_unix_s":1700000000,"active_unix_s":0,"ranks":4,"stands_for":[[0,2]],"open":true,"parent":null,"ring":null,"path":null,"coordinator":null}],"generations":{"5":1}}"#;
    let jobs = Saved::parse(before).unwrap().jobs().unwrap();
    assert_eq!(jobs[0].level, Level::Open { ranks: 4 });
    assert_eq!(
        (
            jobs[0].shape.members(),
            jobs[0].shape.slots(),
            jobs[0].members.len()
        ),
        (1, 8, 1)
    );
    // Other invalid shapes are still refused, with the reason.
    let e = Saved::parse(&before.replace(r#""slots":8"#, r#""slots":0"#))
        .err()
        .unwrap();
    assert!(e.to_string().contains("at least one slot"), "{e}");
}

#[test]
fn a_restart_adopts_the_jobs_the_dataplane_still_has() {
    let d = dir("restart");
    std::fs::create_dir_all(d.join("state")).unwrap();
    std::fs::write(d.join("state/joined.json"), STATE_FILE).unwrap();
    let mut table = Table::default();
    // Of the running jobs, only 65540 is still in the dataplane.
    table.jobs.insert(
        65540,
        (
            0,
            JobSpec {
                id: 65540,
                op: xagg_common::wire::Op::Sum,
                dtype: xagg_common::wire::DType::I32,
                segment: 64,
                slots: 8,
                members: Vec::new(),
                slot_base: None,
                parent: None,
                ring: None,
            },
        ),
    );
    let joins = Joins::new(&config(&d), "10.0.0.1:47800".parse().unwrap(), &table).unwrap();
    let kept: Vec<(u32, bool)> = joins.listing().iter().map(|l| (l.id, l.ready)).collect();
    assert_eq!(kept, [(65537, false), (65540, true)]);
    assert!(joins.jobs.values().all(|j| j.active_unix_s != 0));
    // The ranks could not renew while the daemon was down: their leases run from now.
    let now = crate::join::unix_now();
    for m in joins.jobs.values().flat_map(|j| j.members.iter().flatten()) {
        assert!(
            m.renewed_unix_s + 1 >= now,
            "renewed at {}",
            m.renewed_unix_s
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}
