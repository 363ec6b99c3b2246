//! Jobs that workers join over the network, with no interface, MAC or address given by
//! hand: the hello the switch records (first one wins), a job created by joins, used, left
//! and removed; pending joins listed; a rank restarting and joining again; a daemon
//! restart keeping the joined job; and what is refused: a wrong secret, another shape, a
//! second member behind one port, a credential's quota, a rank that never comes.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, SocketAddrV4},
    time::Duration,
};

use xagg_api::{Request, Response};
use xagg_common::{wire, Counter, JobShape};
use xagg_daemon::config::CredentialSection;
use xagg_lab::lab::{worker_ip, SWITCH_IP};
use xagg_tests::*;
use xagg_worker::{AllreduceError, CredentialKey, JobKey, JoinParams, Secret, Worker};

/// A hello is recorded under its token with the port and addresses it came from; the
/// first one of a token wins, so a copy of the token sent from elsewhere takes nothing.
#[test]
fn the_switch_records_the_first_hello_of_a_token() {
    if !require_root("the_switch_records_the_first_hello_of_a_token") {
        return;
    }
    let mut sw = load_switch();
    let mut hello = [0u8; wire::HEADER_LEN + wire::STATUS_PAYLOAD];
    wire::finish(
        &wire::hello(0x1234_5678_9abc_def0),
        wire::STATUS_PAYLOAD,
        &mut hello,
    )
    .unwrap();
    let r = sw.run(&frame(&member(3), PORT, &hello));
    assert_eq!(r.action, XDP_DROP);
    assert_eq!(sw.counter(Counter::Hello), 1);
    let got = sw.hellos.get(&0x1234_5678_9abc_def0, 0).unwrap().addr;
    assert_eq!(
        (got.ip, got.mac, got.port, got.ifindex),
        (member(3).ip, member(3).mac, member(3).port, 1)
    );
    // The same token from another host: the first hello stays.
    sw.run(&frame(&member(5), PORT, &hello));
    assert_eq!(
        sw.hellos.get(&0x1234_5678_9abc_def0, 0).unwrap().addr.ip,
        member(3).ip
    );
    // A hello of the wrong length is dropped and counted, and records nothing.
    wire::finish(&wire::hello(7), wire::STATUS_PAYLOAD, &mut hello).unwrap();
    let r = sw.run(&frame(&member(4), PORT, &hello[..wire::HEADER_LEN + 8]));
    assert_eq!(r.action, XDP_DROP);
    assert!(sw.hellos.get(&7, 0).is_err());
    assert_eq!(sw.counter(Counter::DropBadLength), 1);
}

/// A flood of hellos with new tokens from one port fills that port's share and no more:
/// the hellos recorded before it stay (nothing is evicted), the rest are counted
/// (`drop_hello_quota`), and a token already recorded still counts as a hello.
#[test]
fn a_flood_of_hellos_evicts_nothing() {
    if !require_root("a_flood_of_hellos_evicts_nothing") {
        return;
    }
    let mut sw = load_switch();
    let hello = |token: u64| {
        let mut b = [0u8; wire::HEADER_LEN + wire::STATUS_PAYLOAD];
        wire::finish(&wire::hello(token), wire::STATUS_PAYLOAD, &mut b).unwrap();
        frame(&member(3), PORT, &b)
    };
    let victim = 0x7e57_0000_0000_0001;
    sw.run(&hello(victim));
    let flood = 5000u64;
    for t in 0..flood {
        assert_eq!(sw.run(&hello(0x000f_100d_0000 + t)).action, XDP_DROP);
    }
    let share = u64::from(xagg_common::job::HELLOS_PER_PORT);
    assert_eq!(sw.hellos.get(&victim, 0).unwrap().addr.ip, member(3).ip);
    assert_eq!(sw.counter(Counter::Hello), share);
    assert_eq!(sw.counter(Counter::DropHelloQuota), flood + 1 - share);
    assert_eq!(sw.hellos.keys().count() as u64, share);
    sw.run(&hello(victim));
    assert_eq!(sw.counter(Counter::Hello), share + 1);
}

const LISTEN_PORT: u16 = 47900;
const MEMBERS: usize = 3;

fn daemon_addr() -> SocketAddr {
    SocketAddr::from((SWITCH_IP, LISTEN_PORT))
}

fn shape(slots: usize) -> JobShape {
    JobShape::full(MEMBERS, slots).unwrap()
}

struct Lab {
    sw: TestSwitch,
    cred: CredentialKey,
}

impl Lab {
    fn params(
        &self,
        key: JobKey,
        secret: Secret,
        rank: u8,
        worker: usize,
        port: u16,
    ) -> JoinParams {
        JoinParams {
            daemon: daemon_addr(),
            key,
            secret,
            rank,
            shape: shape(32),
            bind: SocketAddrV4::new(worker_ip(worker), port),
            credential: Some(("lab".into(), self.cred)),
            timeout: Duration::from_secs(10),
            levels: None,
        }
    }

    /// Runs `f` on a thread in worker `w`'s namespace.
    fn on<T: Send>(&self, w: usize, f: impl FnOnce() -> T + Send) -> T {
        let ns = self.sw.lab.worker_ns(w);
        std::thread::scope(|s| {
            s.spawn(move || {
                xagg_linux::iface::enter_netns(&ns).unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// Every rank joins from its own namespace at once: the workers, or the first error.
    fn join_all(
        &self,
        key: JobKey,
        secret: Secret,
        port: u16,
    ) -> Vec<Result<Worker, AllreduceError>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..MEMBERS)
                .map(|w| {
                    let (ns, p) = (
                        self.sw.lab.worker_ns(w),
                        self.params(key, secret, w as u8, w, port),
                    );
                    s.spawn(move || {
                        xagg_linux::iface::enter_netns(&ns).unwrap();
                        Worker::join(p)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// What `xagg job status` prints.
    fn job_status(&self) -> String {
        let out = std::process::Command::new(bin("xagg"))
            .arg("--socket")
            .arg(&self.sw.socket)
            .args(["job", "status"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn joins(&self) -> Vec<xagg_api::JoinListing> {
        match self.sw.api(Request::Joins) {
            Response::Joins { joins } => joins,
            r => panic!("{r:?}"),
        }
    }
}

/// The switch's counters once its hello counters stopped moving (two reads 50 ms apart
/// agree): every hello veth delivered has been counted.
fn settled(lab: &Lab) -> BTreeMap<String, u64> {
    let hellos = |c: &BTreeMap<String, u64>| (c["hello"], c["drop_hello_quota"]);
    let mut last = lab.sw.counters();
    eventually("the hello counters settle", Duration::from_secs(5), || {
        std::thread::sleep(Duration::from_millis(50));
        let now = lab.sw.counters();
        let same = hellos(&now) == hellos(&last);
        last = now.clone();
        if same {
            Ok(now)
        } else {
            Err(hellos(&now))
        }
    })
}

/// One allreduce of i32 ones on every worker (each in its namespace): the sum is the
/// member count.
fn allreduce(lab: &Lab, workers: &[Worker]) {
    std::thread::scope(|s| {
        for (w, wk) in workers.iter().enumerate() {
            let ns = lab.sw.lab.worker_ns(w);
            s.spawn(move || {
                xagg_linux::iface::enter_netns(&ns).unwrap();
                let mut v = vec![1i32; 100_000];
                wk.allreduce(&mut v)
                    .unwrap_or_else(|e| panic!("member {w}: {e}"));
                assert!(v.iter().all(|&x| x == MEMBERS as i32), "member {w}");
            });
        }
    });
}

#[test]
fn workers_join_jobs_over_the_network() {
    if !require_root("workers_join_jobs_over_the_network") {
        return;
    }
    let dir = std::env::temp_dir().join("xagg-test-xjn");
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("lab.key");
    let cred = CredentialKey([0x5a; 32]);
    std::fs::write(&key_file, "5a".repeat(32)).unwrap();
    let sw = TestSwitch::start("xjn", MEMBERS, |c| {
        c.daemon.listen = Some(daemon_addr());
        c.daemon.join_timeout_s = 3;
        c.credentials.push(CredentialSection {
            name: "lab".into(),
            key_file: key_file.clone(),
            slot_quota: 96,
        });
        c.credentials.push(CredentialSection {
            name: "big".into(),
            key_file: key_file.clone(),
            slot_quota: 4096,
        });
    });
    let lab = Lab { sw, cred };
    let (key, secret) = (JobKey::random(), Secret::random());

    // Rank 0 alone: the job is created and waits, listed as pending.
    let lab_ref = &lab;
    let workers = std::thread::scope(|s| {
        let first = s.spawn(move || {
            lab_ref.on(0, || Worker::join(lab_ref.params(key, secret, 0, 0, 47801)))
        });
        let pending = eventually("rank 0's job listed", Duration::from_secs(5), || {
            let pending = lab_ref.joins();
            if pending.len() == 1 && pending[0].present == [0] {
                Ok(pending)
            } else {
                Err(pending)
            }
        });
        assert!(
            !pending[0].ready && pending[0].present == [0] && pending[0].missing == [1, 2],
            "{pending:?}"
        );
        eprintln!("pending: {:?}", pending[0]);
        // The others join without the credential (the job exists).
        let rest: Vec<_> = (1..MEMBERS)
            .map(|w| {
                s.spawn(move || {
                    let mut p = lab_ref.params(key, secret, w as u8, w, 47801);
                    p.credential = None;
                    lab_ref.on(w, || Worker::join(p))
                })
            })
            .collect();
        let mut all = vec![first.join().unwrap().expect("rank 0 joins")];
        all.extend(
            rest.into_iter()
                .map(|h| h.join().unwrap().expect("a rank joins")),
        );
        all
    });
    let id = workers[0].params().job;
    assert!(workers.iter().all(|w| w.params().job == id));
    assert_eq!(
        id & 0xffff,
        1,
        "the first free index, generation 1: {id:#x}"
    );
    assert_eq!(id >> 16, 1);
    let listed = lab.joins();
    assert!(
        listed[0].ready && listed[0].missing.is_empty(),
        "{listed:?}"
    );
    allreduce(&lab, &workers);
    eprintln!("job {id:#x}: created by joins, all ranks in, allreduce verified");
    // Rank 0 asked again while it waited, with the same hello: not a rank that restarted.
    let log = std::fs::read_to_string(&lab.sw.log).unwrap();
    assert!(!log.contains("joined again"), "{log}");

    // Refused, and nothing changes: a wrong secret, another shape, a second member behind
    // one port (rank 2 from worker 1's namespace, another UDP port), a credential's quota.
    let wrong = lab.on(2, || {
        Worker::join(lab.params(key, Secret::random(), 2, 2, 47811))
    });
    assert!(
        matches!(&wrong, Err(AllreduceError::Join(reason)) if reason.to_string().contains("does not match the job's secret")),
        "{:?}",
        wrong.err()
    );
    let other_shape = lab.on(2, || {
        Worker::join(JoinParams {
            shape: shape(16),
            ..lab.params(key, secret, 2, 2, 47812)
        })
    });
    assert!(
        matches!(&other_shape, Err(AllreduceError::Join(reason)) if reason.to_string().contains("same shape")),
        "{:?}",
        other_shape.err()
    );
    let same_port = lab.on(1, || Worker::join(lab.params(key, secret, 2, 1, 47813)));
    assert!(
        matches!(&same_port, Err(AllreduceError::Join(reason)) if reason.to_string().contains("already behind port")),
        "{:?}",
        same_port.err()
    );
    let big = lab.on(0, || {
        Worker::join(JoinParams {
            shape: shape(96),
            ..lab.params(JobKey::random(), Secret::random(), 0, 0, 47814)
        })
    });
    assert!(
        matches!(&big, Err(AllreduceError::Join(reason)) if reason.to_string().contains("holds 32 of its 96 slots")),
        "{:?}",
        big.err()
    );
    let full = lab.on(0, || {
        Worker::join(JoinParams {
            shape: shape(2048),
            credential: Some(("big".into(), lab.cred)),
            ..lab.params(JobKey::random(), Secret::random(), 0, 0, 47815)
        })
    });
    assert!(
        matches!(&full, Err(AllreduceError::Join(reason)) if reason.to_string().contains("the switch is full")),
        "{:?}",
        full.err()
    );
    assert_eq!(lab.joins().len(), 1);
    eprintln!("refused: wrong secret, other shape, second member behind a port, quota, a full switch ({})", full.err().unwrap());

    // A client that stalls half-way through a request on the network listener holds
    // nobody up; nor do as many of them as one address may open, past which a connection
    // is closed at once, and a stalled one is closed when its lifetime is over (before,
    // a stranger's stalled connections took every file descriptor the daemon had).
    use xagg_daemon::connections::{LIFETIME, MAX_PER_SOURCE};
    let opened = std::time::Instant::now();
    let mut stalled = lab.on(0, || {
        (0..=MAX_PER_SOURCE)
            .map(|_| {
                let mut s = std::net::TcpStream::connect(daemon_addr()).unwrap();
                std::io::Write::write_all(
                    &mut s,
                    b"POST /v1/join HTTP/1.1\r\nhost: switch\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{",
                )
                .unwrap();
                s
            })
            .collect::<Vec<_>>()
    });
    let closed = |s: &mut std::net::TcpStream, within: Duration| {
        s.set_read_timeout(Some(within)).unwrap();
        match std::io::Read::read(s, &mut [0u8; 256]) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    };
    // The daemon accepts them in its own time: whichever came last to it is the one past
    // the address's share.
    std::thread::sleep(Duration::from_millis(300));
    let refused: Vec<usize> = (0..stalled.len())
        .filter(|&i| closed(&mut stalled[i], Duration::from_millis(50)))
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "one connection past its address's {MAX_PER_SOURCE} is closed at once: {refused:?}"
    );
    let mut stalled_one = stalled.remove(if refused[0] == 0 { 1 } else { 0 });
    drop(stalled);
    std::thread::sleep(Duration::from_millis(200));

    // A rank restarts: its new process joins again and the job goes on.
    drop(workers);
    let t = std::time::Instant::now();
    let mut workers = Vec::new();
    for r in lab.join_all(key, secret, 47801) {
        workers.push(r.expect("joining again"));
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let left = (LIFETIME + Duration::from_secs(3)).saturating_sub(opened.elapsed());
    assert!(
        closed(&mut stalled_one, left.max(Duration::from_millis(10))),
        "a stalled connection closed within its lifetime"
    );
    assert!(opened.elapsed() >= LIFETIME - Duration::from_millis(500));
    assert!(workers.iter().all(|w| w.params().job == id));
    allreduce(&lab, &workers);
    eprintln!("every rank joined again: same job, allreduce verified");
    let log = std::fs::read_to_string(&lab.sw.log).unwrap();
    assert!(log.contains("rank 2 joined again"), "{log}");

    // A rank whose hellos never reach the switch (dropped as they leave its interface, as
    // when nothing answers ARP for the switch) is told so at its own join timeout, not
    // the daemon's.
    let ns = lab.sw.lab.worker_ns(1);
    let drop_hellos = format!(
        "table netdev xagg_nohello {{\n chain out {{\n  type filter hook egress device \"eth0\" priority 0;\n  udp dport {} drop\n }}\n}}\n",
        xagg_common::wire::DEFAULT_PORT
    );
    assert!(nft(&ns, &drop_hellos));
    let t = std::time::Instant::now();
    let lonely = lab.on(1, || {
        Worker::join(JoinParams {
            timeout: Duration::from_secs(2),
            ..lab.params(JobKey::random(), Secret::random(), 1, 1, 47841)
        })
    });
    assert!(nft(&ns, "delete table netdev xagg_nohello\n"));
    let took = t.elapsed();
    assert!(
        matches!(&lonely, Err(AllreduceError::Join(e)) if e.to_string().contains("none of this rank's hellos reached the switch at 10.77.0.1:47800 within 2s")),
        "{:?}",
        lonely.err()
    );
    assert!(took < Duration::from_secs(4), "{took:?}");

    // The daemon restarts: the joined job is kept (state file), and runs on.
    let mut lab = lab;
    lab.sw.stop_daemon(Signal::SIGTERM);
    lab.sw.start_daemon();
    let kept = lab.joins();
    assert!(
        kept.len() == 1 && kept[0].ready && kept[0].id == id,
        "{kept:?}"
    );
    allreduce(&lab, &workers);
    eprintln!("daemon restarted: job kept, allreduce verified");

    // A member asks the daemon for its job's state over the network: every rank in, no
    // slot waiting after a finished allreduce.
    match lab.on(0, || workers[0].job_status().expect("the job's status")) {
        xagg_worker::MemberReply::Status {
            job,
            ready,
            missing,
            waiting,
        } => {
            assert_eq!(job, id);
            assert!(ready && missing.is_empty(), "{missing:?}");
            assert!(waiting.is_empty(), "{waiting:?}");
        }
        r => panic!("job status: {r:?}"),
    }

    // Everyone leaves: the job is removed from the dataplane.
    for (w, wk) in workers.iter().enumerate() {
        lab.on(w, || wk.leave().expect("leaving"));
    }
    assert!(lab.joins().is_empty());
    let Response::Jobs { jobs } = lab.sw.api(Request::ListJobs) else {
        panic!()
    };
    assert!(jobs.iter().all(|j| j.id != id), "{jobs:?}");
    eprintln!("all left: job removed");
    // A rank calling on after its job went is refused by the switch, and told what that
    // means for a joined job, not to check flags it never typed.
    let e = lab
        .on(0, || workers[0].allreduce(&mut vec![1i32; 100]))
        .expect_err("the job is gone")
        .to_string();
    assert!(
        e.contains("is gone from the switch, or this rank no longer a member of it: the daemon it joined through")
            && !e.contains("--bind"),
        "{e}"
    );

    // A rank that never comes: the others' joins fail after the join timeout, naming it.
    let (key2, secret2) = (JobKey::random(), Secret::random());
    let lonely: Vec<_> = std::thread::scope(|s| {
        let lab = &lab;
        let hs: Vec<_> = (0..2)
            .map(|w| {
                s.spawn(move || {
                    lab.on(w, || {
                        Worker::join(lab.params(key2, secret2, w as u8, w, 47821))
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &lonely {
        let e = r.as_ref().err().expect("no job without rank 2").to_string();
        assert!(e.contains("[2]"), "{e}");
        eprintln!("rank 2 never came: {e}");
    }
    assert!(lab.joins().is_empty(), "the pending job is gone");
    let c = lab.sw.counters();
    assert!(c["hello"] > 0, "{c:?}");

    // The README's way: `xagg keygen`, then `xagg allreduce --join` on every rank, no job
    // file and no address typed; the job is gone after `--leave`.
    let secret_file = dir.join("job.secret");
    let _ = std::fs::remove_file(&secret_file);
    let out = std::process::Command::new(bin("xagg"))
        .args(["keygen", "--secret-file"])
        .arg(&secret_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&secret_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    // `xagg allreduce --join` as rank `w` of `members`, from its namespace.
    let xagg_join = |w: usize, port: u16, members: usize| {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &lab.sw.lab.worker_ns(w)])
            .arg(bin("xagg"))
            .args(["allreduce", "--join", &daemon_addr().to_string()])
            .args(["--key", &key, "--secret-file"])
            .arg(&secret_file)
            .args(["--bind", &format!("{}:{port}", worker_ip(w))])
            .args([
                "--member",
                &w.to_string(),
                "--members",
                &members.to_string(),
            ]);
        c
    };
    let runs: Vec<_> = (0..MEMBERS)
        .map(|w| {
            xagg_join(w, 47830, 3)
                .args(["--credential", "lab", "--credential-file"])
                .arg(&key_file)
                .args(["--slots", "32", "--segment", "860", "--size", "4MiB"])
                .args(["--repeat", "3", "--verify", "--leave"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let runs: Vec<_> = runs
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (w, out) in runs.iter().enumerate() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("result verified"),
            "rank {w}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{}", text.trim());
    }
    assert!(lab.joins().is_empty(), "every rank left: the job is gone");

    // The credential as the MPI library and the Python module take it,
    // XAGG_CREDENTIAL=NAME:KEY: a job of one rank, which that rank must create.
    let out = xagg_join(0, 47831, 1)
        .env("XAGG_CREDENTIAL", format!("lab:{}", "5a".repeat(32)))
        .args(["--slots", "8", "--segment", "860"])
        .args(["--size", "64KiB", "--verify", "--leave"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("result verified"),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lab.joins().is_empty(), "the one-rank job left");

    // A rank that proves the secret but states another shape (another segment) is
    // refused, and the ranks already waiting hear it at once, naming it, instead of
    // waiting out the daemon's join timeout (3 s here).
    let (key, secret) = (JobKey::random(), Secret::random());
    let lab_ref = &lab;
    std::thread::scope(|s| {
        let waiting: Vec<_> = (0..2)
            .map(|w| {
                s.spawn(move || {
                    let p = lab_ref.params(key, secret, w as u8, w, 47851);
                    let r = lab_ref.on(w, || Worker::join(p));
                    (r.err().map(|e| e.to_string()), std::time::Instant::now())
                })
            })
            .collect();
        eventually("ranks 0 and 1 wait", Duration::from_secs(5), || {
            let l = lab_ref.joins();
            if l.len() == 1 && l[0].present == [0, 1] {
                Ok(())
            } else {
                Err(l)
            }
        });
        let other = lab_ref.on(2, || {
            Worker::join(JoinParams {
                shape: shape(16),
                ..lab_ref.params(key, secret, 2, 2, 47851)
            })
        });
        let refused_at = std::time::Instant::now();
        assert!(
            matches!(&other, Err(AllreduceError::Join(e)) if e.to_string().contains("same shape")),
            "{:?}",
            other.err()
        );
        for h in waiting {
            let (e, at) = h.join().unwrap();
            let e = e.expect("the waiting rank's join fails");
            assert!(
                e.contains("failed: rank 2's join was refused (the job has 3 members, 32 slots"),
                "{e}"
            );
            let after = at.duration_since(refused_at);
            assert!(after < Duration::from_millis(1500), "{after:?}");
        }
    });
    assert!(lab.joins().is_empty(), "the failed job is gone");
}

/// A joined job lives by its ranks' leases: idle long past its lease while the ranks'
/// processes live (renewing), it stays and reduces; once they stop renewing (a process
/// gone), it goes one lease later, a daemon restart meanwhile giving the ranks a whole
/// lease again. `xagg job status` shows it pending first; its secret is in no log and only
/// in the daemon's 0600 state file.
#[test]
fn a_joined_job_lives_by_its_ranks_leases_and_secrets_stay_secret() {
    if !require_root("a_joined_job_lives_by_its_ranks_leases_and_secrets_stay_secret") {
        return;
    }
    let dir = std::env::temp_dir().join("xagg-test-xjo");
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("lab.key");
    std::fs::write(&key_file, "5a".repeat(32)).unwrap();
    let lease = Duration::from_secs(3);
    let sw = TestSwitch::start("xjo", MEMBERS, |c| {
        c.daemon.listen = Some(daemon_addr());
        // Not what keeps a job of ranks: their leases are.
        c.daemon.idle_timeout_s = 1;
        c.daemon.lease_s = lease.as_secs();
        c.credentials.push(CredentialSection {
            name: "lab".into(),
            key_file: key_file.clone(),
            slot_quota: 96,
        });
    });
    let mut lab = Lab {
        sw,
        cred: CredentialKey([0x5a; 32]),
    };
    let (key, secret) = (JobKey::random(), Secret::random());
    let lab_ref = &lab;
    let workers = std::thread::scope(|s| {
        let first = s.spawn(move || {
            lab_ref.on(0, || Worker::join(lab_ref.params(key, secret, 0, 0, 47801)))
        });
        let text = eventually(
            "the job listed by `xagg job status`",
            Duration::from_secs(5),
            || {
                let text = lab_ref.job_status();
                if text.contains("pending") {
                    Ok(text)
                } else {
                    Err(text)
                }
            },
        );
        assert!(
            text.contains("pending") && text.contains("waiting for [1, 2]"),
            "{text}"
        );
        eprintln!("xagg job status: {}", text.trim());
        let rest: Vec<_> = (1..MEMBERS)
            .map(|w| {
                s.spawn(move || {
                    lab_ref.on(w, || {
                        Worker::join(lab_ref.params(key, secret, w as u8, w, 47801))
                    })
                })
            })
            .collect();
        let mut all = vec![first.join().unwrap().unwrap()];
        all.extend(rest.into_iter().map(|h| h.join().unwrap().unwrap()));
        all
    });
    allreduce(&lab, &workers);

    // The secret: only in the state file, which only its owner reads.
    use std::os::unix::fs::PermissionsExt;
    let state = lab.sw.state_dir();
    let file = state.join("joined.json");
    assert_eq!(
        std::fs::metadata(&state).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let hex: String = secret.0.iter().map(|b| format!("{b:02x}")).collect();
    assert!(std::fs::read_to_string(&file)
        .unwrap()
        .contains(&key.to_string()));
    let log = std::fs::read_to_string(&lab.sw.log).unwrap();
    assert!(log.contains(&key.to_string()), "joins are logged by key");
    assert!(!log.contains(&hex), "the secret is in no log");
    let Response::Joins { joins } = lab.sw.api(Request::Joins) else {
        panic!()
    };
    assert!(!serde_json::to_string(&joins).unwrap().contains(&hex));

    // Idle for more than two leases (and many idle times), the ranks' processes alive: the
    // job stays, and reduces.
    std::thread::sleep(lease * 2 + Duration::from_secs(1));
    assert_eq!(lab.joins().len(), 1, "an idle job whose ranks live stays");
    allreduce(&lab, &workers);
    // Its status counts down to its leases' end.
    let text = lab.job_status();
    assert!(
        text.contains("running, results to its members; the first lease runs out in ")
            && text.contains(" s unless renewed"),
        "{text}"
    );

    // Rank 0 leaves: the job waits for the others, and its status says so and until when.
    lab.on(0, || workers[0].leave()).unwrap();
    let text = lab.job_status();
    assert!(
        text.contains("running, results to its members; ranks [0] left: it goes when the others leave, or in ")
            && text.contains(" s unless their leases are renewed"),
        "{text}"
    );
    let listed = &lab.joins()[0];
    assert_eq!(listed.left, vec![0]);
    assert!(
        listed.lease_ends_s.is_some_and(|s| s <= lease.as_secs()),
        "{listed:?}"
    );

    // The other ranks stop renewing (as when their processes are gone); the daemon restarts
    // half-way through a lease, the state directory opened to others meanwhile: it starts,
    // says so, keeps the job, and removes it one lease after its start.
    let id = workers[0].params().job;
    drop(workers);
    std::thread::sleep(Duration::from_millis(1500));
    lab.sw.stop_daemon(Signal::SIGTERM);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let restart = std::time::Instant::now();
    lab.sw.start_daemon();
    assert_eq!(lab.joins().len(), 1, "kept across the restart");
    let log = std::fs::read_to_string(&lab.sw.log).unwrap();
    assert!(
        log.contains("is mode 0755") && log.contains(&format!("chmod 0700 {}", state.display())),
        "{log}"
    );
    let gone = loop {
        if lab.joins().is_empty() {
            break restart.elapsed();
        }
        assert!(
            restart.elapsed() < Duration::from_secs(12),
            "a job whose ranks stopped renewing never went"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        gone >= lease && gone < lease + Duration::from_millis(3500),
        "removed {gone:?} after the restart (lease 3 s, run again from the restart)"
    );
    let log = std::fs::read_to_string(&lab.sw.log).unwrap();
    assert!(
        log.contains(
            "the leases of ranks [1, 2] ran out: no renewal for 3 s (their processes are gone)"
        ),
        "the log says why: {log}"
    );
    let Response::Jobs { jobs } = lab.sw.api(Request::ListJobs) else {
        panic!()
    };
    assert!(jobs.iter().all(|j| j.id != id), "{jobs:?}");
    eprintln!("a job whose ranks stopped renewing removed {gone:?} after a daemon restart");

    // A rank killed without leaving (its worker dropped: its responder refuses
    // connections): the others' call fails about a second in, naming it, though the
    // give-up time is 10 s; they say so when they leave, and the job goes at once instead
    // of one lease later.
    let (key, secret) = (JobKey::random(), Secret::random());
    let addresses = std::sync::Mutex::new(vec![None; MEMBERS]);
    let barrier = std::sync::Barrier::new(MEMBERS);
    let (lab_ref, addresses, barrier) = (&lab, &addresses, &barrier);
    let mut workers: Vec<Worker> = std::thread::scope(|s| {
        let joined: Vec<_> = (0..MEMBERS)
            .map(|w| {
                s.spawn(move || {
                    lab_ref.on(w, || {
                        let wk = Worker::join(lab_ref.params(key, secret, w as u8, w, 47802))?;
                        assert_eq!(wk.params().give_up, Duration::from_secs(10));
                        serve_peers(&wk, w, &secret, addresses, barrier)?;
                        Ok::<_, AllreduceError>(wk)
                    })
                })
            })
            .collect();
        joined
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    drop(workers.pop());
    std::thread::scope(|s| {
        for (w, wk) in workers.iter().enumerate() {
            s.spawn(move || {
                lab_ref.on(w, || {
                    let t = std::time::Instant::now();
                    let e = wk.allreduce(&mut vec![1i32; 1000]).unwrap_err();
                    let took = t.elapsed();
                    eprintln!("rank {w} failed after {took:?}: {e}");
                    assert!(
                        matches!(e, AllreduceError::MemberGone { rank, .. } if rank == MEMBERS - 1),
                        "rank {w}: {e}"
                    );
                    assert!(
                        took < Duration::from_secs(3),
                        "rank {w} failed after {took:?}"
                    );
                })
            });
        }
    });
    let t = std::time::Instant::now();
    for (w, wk) in workers.iter().enumerate() {
        lab.on(w, || wk.leave()).unwrap();
    }
    assert!(
        lab.joins().is_empty(),
        "left by the others, found gone: removed at once ({:?} after the first leave)",
        t.elapsed()
    );
    let log = std::fs::read_to_string(&lab.sw.log).unwrap();
    assert!(
        log.contains("rank 0 found the process of ranks [2] gone")
            && log.contains(") removed: every rank left"),
        "{log}"
    );
}

/// A stranger's port floods the switch with hellos of new tokens: it fills its own share
/// only, so the members behind other ports still join and reduce; and the daemon sweeps
/// the hellos nobody claimed, so the port gets its share back.
#[test]
fn a_hello_flood_from_one_port_keeps_no_one_else_from_joining() {
    if !require_root("a_hello_flood_from_one_port_keeps_no_one_else_from_joining") {
        return;
    }
    let dir = std::env::temp_dir().join("xagg-test-xjf");
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("lab.key");
    std::fs::write(&key_file, "5a".repeat(32)).unwrap();
    let sw = TestSwitch::start("xjf", MEMBERS + 1, |c| {
        c.daemon.listen = Some(daemon_addr());
        c.credentials.push(CredentialSection {
            name: "lab".into(),
            key_file: key_file.clone(),
            slot_quota: 96,
        });
    });
    let lab = Lab {
        sw,
        cred: CredentialKey([0x5a; 32]),
    };
    let stranger = MEMBERS;
    let send_hellos = |tokens: std::ops::Range<u64>| {
        lab.on(stranger, || {
            let s = std::net::UdpSocket::bind((worker_ip(stranger), 0)).unwrap();
            let mut b = [0u8; wire::HEADER_LEN + wire::STATUS_PAYLOAD];
            for t in tokens {
                wire::finish(&wire::hello(t), wire::STATUS_PAYLOAD, &mut b).unwrap();
                s.send_to(&b, (SWITCH_IP, wire::DEFAULT_PORT)).unwrap();
            }
        })
    };
    let before = lab.sw.counters();
    let flood = 2000;
    // From two threads on two CPUs at once: the switch takes the hellos on both together,
    // and the port's share holds even so.
    let half = 0x000f_100d_0000 + flood / 2;
    std::thread::scope(|s| {
        for (cpu, tokens) in [(0, 0x000f_100d_0000..half), (1, half..half + flood / 2)] {
            s.spawn(move || {
                let mut set = nix::sched::CpuSet::new();
                set.set(cpu % num_cpus()).unwrap();
                let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
                send_hellos(tokens);
            });
        }
    });
    let after = settled(&lab);
    let share = u64::from(xagg_common::job::HELLOS_PER_PORT);
    let d = |c: &str| after[c] - before[c];
    // Exactly the port's share recorded; the rest (all that veth delivered) refused.
    assert_eq!(d("hello"), share, "{after:?}");
    assert!(
        d("drop_hello_quota") > flood / 2 && d("drop_hello_quota") <= flood - share,
        "{after:?}"
    );
    let (key, secret) = (JobKey::random(), Secret::random());
    let workers: Vec<Worker> = lab
        .join_all(key, secret, 47801)
        .into_iter()
        .map(|w| w.expect("a member joins"))
        .collect();
    allreduce(&lab, &workers);
    drop(workers);
    // Past the hellos' lifetime the daemon has swept the flood: the port records again.
    std::thread::sleep(
        Duration::from_nanos(xagg_common::job::HELLO_TTL_NS) + Duration::from_secs(2),
    );
    let before = lab.sw.counters();
    send_hellos(0x5eed_0000..0x5eed_0000 + 10);
    let after = settled(&lab);
    let d = |c: &str| after[c] - before[c];
    assert_eq!((d("hello"), d("drop_hello_quota")), (10, 0), "{after:?}");
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
