//! Jobs with levels: a host's level joining its parent, an open level.

use xagg_api::ParentSpec;
use xagg_common::wire::{DType, Op};
use xagg_join::{JoinReply, Levels, MemberReply};

use super::{refusal, shape, Switch, KEY};
use crate::join::{
    registry::{activate, Level, Lifecycle, Route},
    upward::Settled,
};

/// A rank of a job of 4 ranks, 2 of them at this host.
fn host_rank(s: &mut Switch, rank: u8) -> JoinReply {
    let levels = Levels {
        ranks: 4,
        first: u32::from(rank),
        weight: 1,
        coordinator: None,
        open: false,
    };
    s.join_as(
        KEY,
        shape(2, 8),
        rank,
        1 + u64::from(rank),
        rank,
        rank == 0,
        Some(levels),
    )
}

#[test]
fn a_host_level_joins_its_parent_then_runs_below_it() {
    let mut s = Switch::new("host");
    host_rank(&mut s, 0);
    assert!(matches!(s.state(KEY), Some(Lifecycle::Pending)));
    let r = host_rank(&mut s, 1);
    assert!(
        matches!(&r, JoinReply::Pending { waiting: Some(w), .. } if w.contains("parent")),
        "{r:?}"
    );
    let Some(Lifecycle::JoiningParent { stand }) = s.state(KEY) else {
        panic!("{:?}", s.state(KEY))
    };
    let stand = *stand.lock().unwrap();
    assert_eq!((stand.ranks, stand.first, stand.weight), (4, 0, 2));
    assert_eq!(s.joins.listing()[0].route, "joining its parent");
    // This daemon has no [parent]: its join there has already failed, settled by the tick.
    let id = s.joins.jobs[&KEY].id;
    let _ = s.joins.upstream.settled.try_recv();
    let parent = ParentSpec {
        interface: "p3".into(),
        mac: "02:00:00:00:00:99".into(),
        addr: "10.0.1.1:47800".parse().unwrap(),
        job: 7,
        member: 1,
    };
    s.joins
        .upstream
        .done
        .send(Settled {
            key: KEY,
            id,
            secret: super::SECRET,
            route: Ok(Route::Parent(parent.clone())),
        })
        .unwrap();
    s.joins.tick(&mut s.table);
    assert_eq!(
        s.state(KEY).map(|l| format!("{l:?}")),
        Some(format!(
            "{:?}",
            Lifecycle::Running {
                route: Route::Parent(parent.clone())
            }
        ))
    );
    assert_eq!(s.table.jobs[&id].1.parent, Some(parent));
    let l = &s.joins.listing()[0];
    assert_eq!((l.route.as_str(), l.parent_member), ("parent", Some(1)));
    assert!(matches!(
        host_rank(&mut s, 1),
        JoinReply::Ready {
            path: Some(xagg_join::Path::Tree),
            ..
        }
    ));
}

#[test]
fn a_level_its_parent_does_not_take_fails() {
    let mut s = Switch::new("no-parent");
    host_rank(&mut s, 0);
    host_rank(&mut s, 1);
    assert!(matches!(
        s.state(KEY),
        Some(Lifecycle::JoiningParent { .. })
    ));
    s.joins.tick(&mut s.table);
    assert!(s.joins.jobs.is_empty());
    let r = host_rank(&mut s, 0);
    assert!(refusal(&r).contains("failed at its parent"), "{r:?}");
}

#[test]
fn a_rank_leaving_while_its_level_joins_the_parent_fails_the_job() {
    let mut s = Switch::new("left-joining");
    host_rank(&mut s, 0);
    host_rank(&mut s, 1);
    let id = s.joins.jobs[&KEY].id;
    let _ = s.joins.upstream.settled.try_recv();
    s.leave(KEY, 1);
    s.joins
        .upstream
        .done
        .send(Settled {
            key: KEY,
            id,
            secret: super::SECRET,
            route: Ok(Route::Root),
        })
        .unwrap();
    s.joins.tick(&mut s.table);
    assert!(s.joins.jobs.is_empty());
    assert!(s.table.jobs.is_empty());
    let r = host_rank(&mut s, 0);
    assert!(refusal(&r).contains("member 1 left"), "{r:?}");
}

#[test]
fn activate_names_the_op_and_type_it_is_given() {
    let mut s = Switch::new("op");
    s.join(KEY, shape(2, 8), 0, true);
    s.join(KEY, shape(2, 8), 1, true);
    let mut j = s.joins.jobs[&KEY].clone();
    j.id += 1;
    activate(&mut s.table, &j, &Route::Root, Op::Max, DType::F64).unwrap();
    let spec = &s.table.jobs[&j.id].1;
    // 256 bytes: 32 order-preserving 8-byte keys of doubles.
    assert_eq!(
        (spec.op, spec.dtype, spec.segment),
        (Op::Max, DType::F64, 32)
    );
    j.id += 1;
    let e = activate(&mut s.table, &j, &Route::Root, Op::Xor, DType::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not supported"), "{e}");
}

#[test]
fn an_open_level_runs_when_its_members_stand_for_every_rank() {
    let mut s = Switch::new("open");
    // A host states a shape of one member, itself.
    let open = shape(1, 8);
    let host = |first: u32, weight: u32| {
        Some(Levels {
            ranks: 5,
            first,
            weight,
            coordinator: None,
            open: true,
        })
    };
    // Members are whoever joins; ordered by the first rank each stands for.
    let r = s.join_as(KEY, open, 0, 1, 0, true, host(3, 2));
    assert!(matches!(r, JoinReply::Pending { .. }), "{r:?}");
    assert_eq!(
        s.joins.jobs[&KEY].level,
        Level::Open { ranks: 5 },
        "{:?}",
        s.joins.jobs[&KEY]
    );
    let r = s.join_as(KEY, open, 0, 2, 1, false, host(1, 4));
    assert!(refusal(&r).contains("too many"), "{r:?}");
    let r = s.join_as(KEY, open, 0, 3, 1, false, host(0, 3));
    let JoinReply::Ready { job, member, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(member, 0, "the member from rank 0 is member 0");
    let spec = &s.table.jobs[&job].1;
    assert_eq!(spec.members[0].interface, "p1");
    assert_eq!(spec.members[1].interface, "p0");
    // The member from rank 3 says so again: still member 1.
    let r = s.join_as(KEY, open, 0, 1, 0, false, host(3, 2));
    assert!(matches!(r, JoinReply::Ready { member: 1, .. }), "{r:?}");
    // A join to an open level states itself as its shape's one member.
    let r = s.join_as(KEY, shape(2, 8), 0, 9, 0, true, host(0, 1));
    assert!(refusal(&r).contains("a shape of one member"), "{r:?}");
}

/// An open level whose hosts did not all come says for how many ranks the ones that
/// came stand (its members are whoever came: "ranks []" named nobody).
#[test]
fn an_open_level_timed_out_says_how_many_ranks_came() {
    let mut s = Switch::new("open-timeout");
    let levels = Levels {
        ranks: 5,
        first: 3,
        weight: 2,
        coordinator: None,
        open: true,
    };
    let r = s.join_as(KEY, shape(1, 8), 0, 1, 0, true, Some(levels));
    assert!(matches!(r, JoinReply::Pending { .. }), "{r:?}");
    s.joins.join_timeout = std::time::Duration::ZERO;
    s.joins.tick(&mut s.table);
    let r = s.join_as(KEY, shape(1, 8), 0, 2, 0, false, Some(levels));
    assert!(
        refusal(&r).contains(
            "waiting for the job's other hosts: the levels that joined stand for 2 of its 5 ranks"
        ),
        "{r:?}"
    );
}

/// A level below that leaves (its own job gone there: a rank's lease ran out) while
/// rounds wait for it: none can complete, and the other levels' ranks, which no responder
/// of the gone rank reaches, would wait until their collective timeout — the job goes.
/// One that leaves with nothing waiting for it (done) does not end the job.
#[test]
fn an_open_level_goes_when_a_member_leaves_with_rounds_waiting_for_it() {
    let mut s = Switch::new("open-leave");
    let open = shape(1, 8);
    let host = |first: u32| {
        Some(Levels {
            ranks: 6,
            first,
            weight: 2,
            coordinator: None,
            open: true,
        })
    };
    s.join_as(KEY, open, 0, 1, 0, true, host(0));
    s.join_as(KEY, open, 0, 2, 1, false, host(2));
    let JoinReply::Ready { job, .. } = s.join_as(KEY, open, 0, 3, 2, false, host(4)) else {
        panic!("{:?}", s.joins.jobs[&KEY])
    };
    s.table.waiting = vec![(3, 7, 3, vec![1]), (4, 7, 4, vec![1, 2])];
    assert_eq!(s.leave(KEY, 0), MemberReply::Left);
    assert!(s.joins.jobs.contains_key(&KEY) && s.table.jobs.contains_key(&job));
    assert_eq!(s.leave(KEY, 1), MemberReply::Left);
    assert!(!s.joins.jobs.contains_key(&KEY), "{:?}", s.joins.jobs[&KEY]);
    assert!(
        !s.table.jobs.contains_key(&job),
        "the dataplane keeps job {job}"
    );
}

/// A level whose ranks were all in, its way up lost with its daemon (restored pending
/// from the state file), goes up again at the next tick.
#[test]
fn a_level_restored_pending_with_every_rank_in_goes_up_again() {
    let mut s = Switch::new("host-restart");
    host_rank(&mut s, 0);
    host_rank(&mut s, 1);
    assert!(matches!(
        s.state(KEY),
        Some(Lifecycle::JoiningParent { .. })
    ));
    // As the state file gives it back after a restart.
    s.joins.jobs.get_mut(&KEY).unwrap().state = Lifecycle::Pending;
    let _ = s.joins.upstream.settled.try_recv();
    s.joins.tick(&mut s.table);
    assert!(
        matches!(s.state(KEY), Some(Lifecycle::JoiningParent { .. })),
        "{:?}",
        s.state(KEY)
    );
    assert_eq!(s.joins.listing()[0].route, "joining its parent");
}

/// A level whose parent's daemon does not answer when the level leaves asks again until it
/// does (before: asked once, and the parent's job held its slots until its idle timer).
#[test]
fn a_leave_the_parent_missed_is_asked_again() {
    let mut s = Switch::new("leave-again");
    // A port nothing listens on yet: the first leave is refused.
    let parent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = parent.local_addr().unwrap();
    drop(parent);
    s.joins.parent = Some(parent_at(addr));
    s.joins.leave_parent(KEY, super::SECRET, 1);
    std::thread::sleep(std::time::Duration::from_secs(1));
    // The parent comes up.
    let parent = std::net::TcpListener::bind(addr).unwrap();
    assert_eq!(leave_heard(&parent), (KEY, 1));
}

/// A level that went here while it joined its parent (its join timed out), and that the
/// parent's job took after all, leaves that job: else it ran with a member nobody fed, its
/// other hosts' rounds waiting on it. The ranks here were told it waited on the parent.
#[test]
fn a_level_gone_before_its_parent_took_it_leaves_the_parent() {
    let mut s = Switch::new("gone-before-parent");
    host_rank(&mut s, 0);
    host_rank(&mut s, 1);
    let id = s.joins.jobs[&KEY].id;
    // This daemon has no [parent] yet: that join's failure is not the one tested.
    let _ = s.joins.upstream.settled.try_recv();
    s.joins.join_timeout = std::time::Duration::ZERO;
    s.joins.tick(&mut s.table);
    assert!(s.joins.jobs.is_empty());
    let r = host_rank(&mut s, 0);
    assert!(
        refusal(&r)
            .contains("waiting for the parent's job: the job's other hosts did not all join there"),
        "{r:?}"
    );
    let parent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    s.joins.parent = Some(parent_at(parent.local_addr().unwrap()));
    s.joins
        .upstream
        .done
        .send(Settled {
            key: KEY,
            id,
            secret: super::SECRET,
            route: Ok(Route::Parent(ParentSpec {
                interface: "p3".into(),
                mac: "02:00:00:00:00:99".into(),
                addr: "10.0.1.1:47800".parse().unwrap(),
                job: 7,
                member: 2,
            })),
        })
        .unwrap();
    s.joins.tick(&mut s.table);
    assert_eq!(leave_heard(&parent), (KEY, 2));
}

/// A parent's daemon at `addr`.
fn parent_at(addr: std::net::SocketAddr) -> crate::join::upward::ParentLink {
    crate::join::upward::ParentLink {
        interface: "up".into(),
        daemon: Some((addr, "test".into(), super::CRED)),
        ring_after: std::time::Duration::from_secs(2),
    }
}

/// Plays the parent's daemon on `parent` for one leave (a nonce, then the leave, each on a
/// connection of its own, within 15 s): the job and member that left.
fn leave_heard(parent: &std::net::TcpListener) -> (xagg_join::JobKey, u8) {
    use std::io::{Read, Write};
    parent.set_nonblocking(true).unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut requests = Vec::new();
    for _ in 0..2 {
        let mut c = loop {
            match parent.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(
                        std::time::Instant::now() < until,
                        "no leave came: {requests:?}"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        };
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            let n = c.read(&mut buf).unwrap();
            assert!(n > 0, "the request ended early");
            got.extend_from_slice(&buf[..n]);
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while got.len() < head_end + length {
            let n = c.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        let request = String::from_utf8_lossy(&got).into_owned();
        let body = if request.starts_with("GET /v1/nonce") {
            serde_json::to_string(&xagg_join::NonceReply {
                nonce: xagg_join::Nonce::random(),
                switch: "10.0.0.9:47800".parse().unwrap(),
                mac: None,
                switch_ports: 1,
                segment_bytes: None,
            })
            .unwrap()
        } else {
            serde_json::to_string(&xagg_join::MemberReply::Left).unwrap()
        };
        write!(
            c,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        requests.push(request);
    }
    assert!(requests[0].starts_with("GET /v1/nonce"), "{requests:?}");
    let leave = &requests[1];
    assert!(leave.starts_with("POST /v1/leave"), "{leave:?}");
    let body = &leave[leave.find("\r\n\r\n").unwrap() + 4..];
    let req: xagg_join::MemberRequest = serde_json::from_str(body).unwrap();
    (req.key, req.rank)
}
