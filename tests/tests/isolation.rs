//! Many jobs on one switch at once: disjoint and overlapping members (a worker in several
//! jobs, one UDP port per job), a job removed while the others run; their contributions
//! steered to their slots' CPUs (every CPU), each folded once.

use std::time::Duration;

use xagg_api::{Request, Response};
use xagg_tests::*;

const JOBS: [&[usize]; 8] = [
    &[0, 1],
    &[2, 3],
    &[0, 2],
    &[1, 3],
    &[0, 1, 2, 3],
    &[0, 3],
    &[1, 2],
    &[0, 1, 2],
];

fn port(job: u32) -> u16 {
    47810 + job as u16
}

#[test]
fn eight_jobs_at_once_and_one_removed_midway() {
    if !require_root("eight_jobs_at_once_and_one_removed_midway") {
        return;
    }
    let cpus = format!("0-{}", xagg_linux::cpus::available() - 1);
    let sw = TestSwitch::start("xti", 4, |c| c.switch.steer_cpus = Some(cpus));
    for (j, workers) in JOBS.iter().enumerate() {
        let id = j as u32 + 1;
        assert!(
            matches!(
                sw.add_job_on(id, 256, 8, workers, port(id)),
                Response::Job { .. }
            ),
            "job {id}"
        );
    }
    // Job 9 shares workers 0 and 1 with others, and is removed while everything runs.
    assert!(matches!(
        sw.add_job_on(9, 256, 8, &[0, 1], port(9)),
        Response::Job { .. }
    ));
    let elems = (1 << 20) / 4;
    let victim_errors = std::thread::scope(|s| {
        let jobs: Vec<_> = JOBS
            .iter()
            .enumerate()
            .map(|(j, workers)| {
                let sw = &sw;
                s.spawn(move || {
                    let id = j as u32 + 1;
                    // Two allreduces per job, each verified bit-exactly by the helper.
                    for mid in 0..2 {
                        sw.allreduce(&Allreduce {
                            job: id,
                            message: mid,
                            segment: 256,
                            slots: 8,
                            workers,
                            port: port(id),
                            elems,
                            seed: 100 * id as u64 + mid as u64,
                        });
                    }
                })
            })
            .collect();
        let victims: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|m| {
                let ns = sw.lab.worker_ns(m);
                s.spawn(move || {
                    xagg_linux::iface::enter_netns(&ns).unwrap();
                    let sw_addr = std::net::SocketAddrV4::new(xagg_lab::lab::SWITCH_IP, 47800);
                    let bind = std::net::SocketAddrV4::new(xagg_lab::lab::worker_ip(m), port(9));
                    let shape = i32_shape(2, 8, 256);
                    let mut p = xagg_worker::WorkerParams::new(sw_addr, bind, 9, m as u8, shape);
                    p.give_up = Duration::from_secs(2);
                    let w = xagg_worker::Worker::new(p).unwrap();
                    let mut buf = vec![3i32; 64 << 20 >> 2];
                    (0..100).find_map(|_| w.allreduce(&mut buf).err())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150));
        assert!(matches!(sw.api(Request::RemoveJob { id: 9 }), Response::Ok));
        for j in jobs {
            j.join().expect("a job was disturbed");
        }
        victims
            .into_iter()
            .map(|v| v.join().unwrap())
            .collect::<Vec<_>>()
    });
    for e in victim_errors {
        let e = e.expect("job 9's workers fail once it is removed");
        assert!(e.to_string().contains("job 9"), "{e}");
    }
    let c = sw.counters();
    assert!(
        c["drop_unknown_job"] > 0,
        "job 9's packets after removal: {c:?}"
    );
    match sw.api(Request::ListJobs) {
        Response::Jobs { jobs } => assert_eq!(jobs.len(), 8),
        r => panic!("{r:?}"),
    }
    // Every contribution of the jobs that ran to the end was steered and folded once.
    for id in 1..=JOBS.len() as u32 {
        let Response::JobCounters { job } = sw.api(Request::JobCounters { id }) else {
            panic!("job {id}'s counters");
        };
        let n = |k: &str| job.counters.get(k).copied().unwrap_or(0);
        assert_eq!(
            n("steered"),
            folded(&job.counters),
            "job {id}: {:?}",
            job.counters
        );
        assert_eq!(n("complete"), 2 * (elems as u64).div_ceil(256), "job {id}");
    }
}
