//! Unmodified MPI programs under `mpirun` in the netns lab, one rank per worker namespace,
//! with `libxagg_mpi.so` preloaded: a C program (every served type and op, in place and
//! not, derived communicators, a user-defined op, `MPI_Iallreduce` among point-to-point
//! requests), Fortran programs through `use mpi` and `mpif.h`, and mpi4py; then the
//! fallbacks: no switch, and the switch's dataplane detached in the middle of a run; and
//! ranks on hosts that reduce them first, each host's ranks told their own daemon.

use std::{path::PathBuf, process::Output, time::Duration};

use xagg_api::Request;
use xagg_lab::lab::SWITCH_IP;
use xagg_tests::*;

const RANKS: usize = 4;

/// A lab whose daemon lets ranks join, and the programs built.
struct MpiLab {
    sw: TestSwitch,
    dir: PathBuf,
    agent: PathBuf,
}

impl MpiLab {
    fn start(prefix: &str) -> Self {
        Self::start_with_mtu(prefix, xagg_lab::lab::MTU)
    }

    /// [`MpiLab::start`] with every lab link at `mtu`.
    fn start_with_mtu(prefix: &str, mtu: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("xagg-test-{prefix}-mpi"));
        std::fs::create_dir_all(&dir).unwrap();
        let sw = TestSwitch::joinable_with_mtu(prefix, RANKS, mtu);
        let agent = xagg_lab::mpi::agent(&sw.lab, &dir).unwrap();
        Self { sw, dir, agent }
    }

    /// Compiles `tests/mpi/NAME` into the lab's directory.
    fn program(&self, name: &str) -> PathBuf {
        self.program_as(name, name.split('.').next().unwrap(), &[])
    }

    /// Compiles `tests/mpi/NAME` with `flags` into the lab's directory as `out`.
    fn program_as(&self, name: &str, out: &str, flags: &[&str]) -> PathBuf {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("mpi")
            .join(name);
        let out = self.dir.join(out);
        xagg_lab::mpi::compile(&src, &out, flags).unwrap();
        out
    }

    /// Runs `cmd` on every rank with the library preloaded, `daemon` its listener, and
    /// `env` besides.
    fn run(&self, cmd: &str, daemon: &str, env: &[(&str, String)]) -> Output {
        xagg_lab::mpi::run(
            &self.sw.lab,
            &self.agent,
            RANKS,
            &preload(Some(daemon), env),
            cmd,
        )
        .unwrap()
    }

    fn daemon(&self) -> String {
        LISTEN.to_string()
    }
}

/// The environment of preloaded ranks: the library, the daemon's listener `daemon` (or
/// none: each host gives its ranks their own), the credential, and `env`.
pub(crate) fn preload<'a>(
    daemon: Option<&str>,
    env: &[(&'a str, String)],
) -> Vec<(&'a str, String)> {
    let lib = xagg_lab::bin("libxagg_mpi.so");
    assert!(
        lib.exists(),
        "{} is built by cargo xtask build",
        lib.display()
    );
    // Every call through the switch unless a test says otherwise: what these tests check.
    let mut all = vec![
        ("LD_PRELOAD", lib.display().to_string()),
        ("XAGG_ROUTE", "all".to_string()),
    ];
    all.extend(credential_env());
    if let Some(d) = daemon {
        all.push(("XAGG_DAEMON", d.to_string()));
    }
    all.extend(env.iter().cloned());
    all
}

/// The summary rank 0 prints at MPI_Finalize: allreduces through the switch, made by Open
/// MPI after a failure, and passed to Open MPI.
pub(crate) fn summary(stderr: &str) -> (u64, u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("xagg: rank 0: ") && l.contains("allreduces through the switch"))
        .unwrap_or_else(|| panic!("no summary from rank 0:\n{stderr}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let number_before = |w: &str| -> u64 {
        let i = words.iter().position(|x| *x == w).unwrap();
        words[i - 1].parse().unwrap()
    };
    (
        number_before("allreduces"),
        number_before("made"),
        number_before("passed"),
    )
}

/// The number rank 0's summary gives before `words` (e.g. "finished from peers").
pub(crate) fn summary_count(stderr: &str, words: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("xagg: rank 0: ") && l.contains("allreduces through the switch"))
        .unwrap_or_else(|| panic!("no summary from rank 0:\n{stderr}"));
    let before = &line[..line
        .find(words)
        .unwrap_or_else(|| panic!("{words:?} not in {line}"))];
    before
        .split([' ', '('])
        .rfind(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no count before {words:?} in {line}"))
}

/// `tests/mpi/collectives.c`'s run: every check passed, and every call through the switch
/// by exact count per entry point (the reduce-scatter of unequal counts too).
fn collectives_all_exact_through_the_switch(out: &str, err: &str) {
    assert!(
        out.contains("checks=") && out.contains("failures=0"),
        "{out}"
    );
    for (name, counts) in [
        ("MPI_Reduce_scatter_block", [30, 0, 0, 0, 0, 0]),
        ("MPI_Reduce_scatter", [17, 0, 0, 0, 0, 0]),
        ("MPI_Allgather", [30, 0, 0, 0, 0, 0]),
        ("MPI_Bcast", [60, 0, 0, 0, 0, 0]),
        ("MPI_Reduce", [120, 0, 0, 0, 0, 0]),
    ] {
        assert_eq!(entry_counts(err, name), counts, "{name}: {err}");
    }
}

pub(crate) fn checked(o: &Output) -> (String, String) {
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    eprintln!("stdout:\n{out}\nstderr:\n{err}");
    assert!(o.status.success(), "mpirun failed: {:?}", o.status);
    (out, err)
}

#[test]
fn unmodified_mpi_programs_reduce_through_the_switch() {
    if !require_root("unmodified_mpi_programs_reduce_through_the_switch") {
        return;
    }
    let lab = MpiLab::start("xmpi");
    let before = lab.sw.counters();

    // C: every served type and op, derived communicators, requests.
    let check = lab.program("check.c");
    let (out, err) = checked(&lab.run(check.to_str().unwrap(), &lab.daemon(), &[]));
    assert!(out.contains("failures=0"), "{out}");
    let (switch, fallback, passed) = summary(&err);
    assert_eq!(switch, 264, "{err}");
    assert_eq!(fallback, 0);
    // Per entry point, each completion call of MPI_Iallreduce on its own.
    for (name, counts) in [
        ("MPI_Allreduce", [249, 0, 0, 0, 0, 3]),
        ("MPI_Barrier", [2, 0, 0, 0, 0, 0]),
        ("MPI_Iallreduce by MPI_Test", [1, 0, 0, 0, 0, 0]),
        ("MPI_Iallreduce by MPI_Testall", [2, 0, 0, 0, 0, 0]),
        ("MPI_Iallreduce by MPI_Testany", [2, 0, 0, 0, 0, 0]),
        ("MPI_Iallreduce by MPI_Testsome", [2, 0, 0, 0, 0, 0]),
        ("MPI_Iallreduce by MPI_Wait", [1, 0, 0, 0, 0, 0]),
        ("MPI_Iallreduce by MPI_Waitall", [2, 0, 0, 0, 0, 0]),
        ("MPI_Iallreduce by MPI_Waitany", [1, 0, 0, 0, 0, 0]),
        ("MPI_Iallreduce by MPI_Waitsome", [2, 0, 0, 0, 0, 0]),
        // The checks' tally at the end.
        ("MPI_Reduce", [1, 0, 0, 0, 0, 0]),
    ] {
        assert_eq!(entry_counts(&err, name), counts, "{name}: {err}");
    }
    // The user-defined op, a type the switch does not take and a product of floats went to
    // Open MPI, each counted with its reason (naming the op or type) and said once by each
    // process.
    let reasons = [
        "an op of the program's own (MPI_Op_create): an op the switch does not take",
        "MPI_SHORT: a datatype the switch does not take (it takes MPI_INT,",
        "MPI_PROD over MPI_FLOAT: an op the switch does not take over this type",
    ];
    assert!(passed >= 3, "{err}");
    for why in reasons {
        for r in 0..RANKS {
            assert_eq!(
                err.matches(&format!("rank {r}: MPI_Allreduce goes to Open MPI: {why}"))
                    .count(),
                1,
                "{why}: {err}"
            );
        }
    }
    // The summary counts each, the type's reason without its list of the types taken.
    assert!(
        err.contains(&format!("{}: 1", reasons[0]))
            && err.contains("MPI_SHORT: a datatype the switch does not take: 1")
            && err.contains(&format!("{}: 1", reasons[2])),
        "{err}"
    );
    let after = lab.sw.counters();
    let grew = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    assert!(
        grew("contribution") > 1000,
        "contributions: {}",
        grew("contribution")
    );
    assert!(
        grew("complete") > 250 && grew("result_copy") > 0,
        "{after:?}"
    );
    // Every job was left: the daemon removed them.
    match lab.sw.api(Request::ListJobs) {
        xagg_api::Response::Jobs { jobs } => assert!(jobs.is_empty(), "{jobs:?}"),
        r => panic!("{r:?}"),
    }

    // Fortran, through `use mpi` and through `mpif.h`.
    for (name, flags) in [("use mpi", &[][..]), ("mpif.h", &["-DMPIF_H"][..])] {
        let f = lab.program_as("check.F90", &name.replace([' ', '.'], "_"), flags);
        let (out, err) = checked(&lab.run(f.to_str().unwrap(), &lab.daemon(), &[]));
        assert!(out.contains("failures=0"), "{name}: {out}");
        let (switch, fallback, _) = summary(&err);
        assert!(switch == 9 && fallback == 0, "{name}: {switch} {fallback}");
        assert_eq!(
            entry_counts(&err, "MPI_ALLREDUCE (Fortran)"),
            [8, 0, 0, 0, 0, 0],
            "{err}"
        );
        assert_eq!(
            entry_counts(&err, "MPI_BARRIER (Fortran)"),
            [1, 0, 0, 0, 0, 0],
            "{err}"
        );
        for (entry, n) in [
            ("MPI_REDUCE_SCATTER_BLOCK (Fortran)", 1),
            ("MPI_REDUCE_SCATTER (Fortran)", 1),
            ("MPI_ALLGATHER (Fortran)", 1),
            ("MPI_BCAST (Fortran)", 1),
            // One checked, and the checks' tally at the end.
            ("MPI_REDUCE (Fortran)", 2),
        ] {
            assert_eq!(
                entry_counts(&err, entry),
                [n, 0, 0, 0, 0, 0],
                "{entry}: {err}"
            );
        }
    }

    // The collectives besides allreduce, every one through the switch (MPI_Reduce_scatter
    // with unequal counts, in place too), exact, with 5 % of the contributions and of
    // the result copies dropped at the switch (recovered, so counted as the switch's).
    let coll = lab.program("collectives.c");
    assert!(matches!(
        lab.sw.api(Request::Inject {
            drop_contribution: 0.05,
            drop_result: 0.05
        }),
        xagg_api::Response::Ok
    ));
    let before = lab.sw.counters();
    let (out, err) = checked(&lab.run(coll.to_str().unwrap(), &lab.daemon(), &[]));
    collectives_all_exact_through_the_switch(&out, &err);
    let after = lab.sw.counters();
    let dropped = after["inject_drop_contribution"] + after["inject_drop_result"]
        - before["inject_drop_contribution"]
        - before["inject_drop_result"];
    assert!(dropped > 0, "dropped {dropped}");
    assert!(matches!(
        lab.sw.api(Request::Inject {
            drop_contribution: 0.0,
            drop_result: 0.0
        }),
        xagg_api::Response::Ok
    ));

    // mpi4py's Comm.Allreduce on NumPy arrays of each served type.
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi/check_mpi4py.py");
    let (out, err) = checked(&lab.run(
        &format!("/usr/bin/python3 {}", script.display()),
        &lab.daemon(),
        &[],
    ));
    assert!(out.contains("failures=0"), "{out}");
    let (switch, fallback, _) = summary(&err);
    assert!(switch == 30 && fallback == 0, "mpi4py: {switch} {fallback}");
    assert_eq!(
        entry_counts(&err, "MPI_Allreduce (mpi4py)"),
        [30, 0, 0, 0, 0, 0],
        "{err}"
    );
}

/// Ranks without privileges (user nobody, no capabilities; mpirun starts every one of them
/// through the agent): the UDP path needs none.
#[test]
fn unprivileged_ranks_reduce_through_the_switch() {
    if !require_root("unprivileged_ranks_reduce_through_the_switch") {
        return;
    }
    let lab = MpiLab::start("xmpu");
    let check = lab.program("check.c");
    let agent = xagg_lab::mpi::unprivileged_agent(&lab.sw.lab, &lab.dir).unwrap();
    let env = preload(Some(&lab.daemon()), &[("XAGG_VERBOSE", "1".to_string())]);
    // Each rank says who it runs as (`id -u` before the program).
    let cmd = format!("sh -c 'echo uid=$(id -u); exec {}'", check.display());
    let o = xagg_lab::mpi::run_from(&lab.sw.lab.switch_ns(), &agent, RANKS, &env, &cmd).unwrap();
    let (out, err) = checked(&o);
    assert_eq!(out.matches("uid=65534").count(), RANKS, "{out}");
    assert!(out.contains("failures=0"), "{out}");
    for r in 0..RANKS {
        assert!(
            err.contains(&format!(
                "MPI_COMM_WORLD (4 ranks) rank {r}: joined the switch"
            )),
            "{err}"
        );
    }
    assert_eq!(summary(&err).1, 0);
    assert!(summary(&err).0 >= 250);
}

#[test]
fn mpi_programs_fall_back_to_open_mpi() {
    if !require_root("mpi_programs_fall_back_to_open_mpi") {
        return;
    }
    let lab = MpiLab::start("xmpf");
    let check = lab.program("check.c");

    // No switch answers at this address: Open MPI serves, and rank 0 says why, once per
    // communicator.
    let (out, err) = checked(&lab.run(check.to_str().unwrap(), &format!("{SWITCH_IP}:1"), &[]));
    assert!(out.contains("failures=0"), "{out}");
    assert!(
        err.contains("MPI_COMM_WORLD (4 ranks): collectives go to Open MPI: rank 0: the daemon's network listener at 10.77.0.1:1 does not answer"),
        "{err}"
    );
    // Said that once (each communicator by its rank 0): no rank repeats it for each entry
    // point (XAGG_VERBOSE would).
    assert_eq!(
        err.matches("MPI_COMM_WORLD (4 ranks): collectives go to Open MPI")
            .count(),
        1,
        "{err}"
    );
    assert!(
        !err.contains("goes to Open MPI: the communicator is served by Open MPI"),
        "{err}"
    );
    assert_eq!(summary(&err).0, 0);
    // Nor for each communicator after it: at most once per process that is one's rank 0
    // (world ranks 0 and 1, the odd half's), where each of the four communicators said it
    // before; rank 0's summary counts its three.
    let said = err
        .matches("collectives go to Open MPI: rank 0: the daemon's network listener")
        .count();
    assert!((1..=2).contains(&said), "said {said} times: {err}");
    assert!(
        err.contains("rank 0: communicators served by Open MPI: 3 (rank 0: the daemon's network listener at 10.77.0.1:1 does not answer"),
        "{err}"
    );

    // The switch's answers stop reaching the ranks in the middle of a run (a firewall in
    // each rank's namespace drops them: `cut_results`), the daemon reachable:
    // the allreduce in flight and every one after complete through Open MPI, with the
    // right result, and rank 0 says why. The ranks leave the job as they move to Open MPI:
    // it is gone while the program still runs, not at its end or a lease later.
    let looping = format!("{} loop 300", check.display());
    let sw = &lab.sw;
    let (o, gone_before_end) = std::thread::scope(|s| {
        let run = s.spawn(|| {
            lab.run(
                &looping,
                &lab.daemon(),
                &[("XAGG_GIVE_UP_MS", "2000".to_string())],
            )
        });
        // Let the job form and some allreduces go through the switch first.
        let mut waited = Duration::ZERO;
        while sw.counters().get("contribution").copied().unwrap_or(0) < 200 {
            std::thread::sleep(Duration::from_millis(100));
            waited += Duration::from_millis(100);
            assert!(waited < Duration::from_secs(30), "no traffic at the switch");
        }
        // The program goes on for seconds on Open MPI after it moved there; a job left
        // only when the program ends (`MPI_Finalize`) goes moments before it does.
        cut_all_then_time_the_jobs_left(sw, RANKS, run)
    });
    let (out, err) = checked(&o);
    assert!(out.contains("checks=300 failures=0"), "{out}");
    let (switch, fallback, _) = summary(&err);
    assert!(
        switch > 0 && fallback > 0,
        "{switch} through the switch, {fallback} after"
    );
    assert_eq!(switch + fallback, 300, "every allreduce once");
    assert!(
        err.contains("the switch failed, collectives go to Open MPI from now on"),
        "{err}"
    );
    assert!(
        gone_before_end > Duration::from_secs(2),
        "the ranks left the job when they moved to Open MPI: gone only {gone_before_end:?} before the program ended"
    );
    eprintln!("the job was gone {gone_before_end:?} before the program ended");
    let log = std::fs::read_to_string(&sw.log).unwrap();
    assert!(log.contains("removed: every rank left"), "{log}");
}

/// Two hosts of two ranks under a switch, each host's ranks told their host's daemon (as
/// each machine of a cluster sets `XAGG_DAEMON` to its own): the library finds which ranks
/// share a host from the daemons they name, each host reduces its ranks and joins the
/// switch for them, and every served call of the C program goes through both levels.
#[test]
fn mpi_ranks_on_hosts_reduce_at_every_level() {
    if !require_root("mpi_ranks_on_hosts_reduce_at_every_level") {
        return;
    }
    use xagg_lab::tree::Topology;
    let dir = std::env::temp_dir().join("xagg-test-xmph-mpi");
    std::fs::create_dir_all(&dir).unwrap();
    let lab = joinable_tree("xmph", Topology::Hosts { hosts: 2, ranks: 2 });
    let hosts = xagg_lab::mpi::tree_hosts(&lab);
    let agent = xagg_lab::mpi::hosts_agent(&hosts, &dir, "rsh-agent-xmph").unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi/check.c");
    let check = dir.join("check");
    xagg_lab::mpi::compile(&src, &check, &[]).unwrap();
    let env = preload(None, &[("XAGG_VERBOSE", "1".to_string())]);
    let o = xagg_lab::mpi::run_on_hosts(&hosts, &agent, &env, check.to_str().unwrap()).unwrap();
    let (out, err) = checked(&o);
    assert!(out.contains("failures=0"), "{out}");
    let (switch, fallback, _) = summary(&err);
    assert!(switch >= 250 && fallback == 0, "{switch} {fallback}");
    for r in 0..4 {
        assert!(
            err.contains(&format!(
                "MPI_COMM_WORLD (4 ranks) rank {r}: joined through its host"
            )),
            "{err}"
        );
    }
    // The summary says how the communicator ran, after the run as well.
    assert!(
        err.contains(
            "rank 0: communicators served: 3 joined through its host, which joined the switch (a tree)"
        ),
        "{err}"
    );
    let c = lab.counters();
    assert!(
        c[1]["partial"] > 250 && c[2]["partial"] > 250,
        "each host sent its partials up: {c:?}"
    );
    assert!(c[0]["complete"] > 250, "the switch completed them: {c:?}");

    // The collectives besides allreduce through both levels, each at its own bytes (the
    // ranks' places learnt from the daemons they gathered): exact, every call through the
    // switch, each segment a partial of each host and completed once at the switch.
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi/collectives.c");
    let coll = dir.join("collectives");
    xagg_lab::mpi::compile(&src, &coll, &[]).unwrap();
    let before = lab.counters();
    let o = xagg_lab::mpi::run_on_hosts(&hosts, &agent, &env, coll.to_str().unwrap()).unwrap();
    let (out, err) = checked(&o);
    collectives_all_exact_through_the_switch(&out, &err);
    let c = lab.counters();
    let grew = |i: usize, k: &str| c[i][k] - before[i][k];
    assert!(grew(0, "complete") > 0, "{c:?}");
    assert_eq!(grew(1, "partial"), grew(0, "complete"), "{c:?}");
    assert_eq!(grew(2, "partial"), grew(0, "complete"), "{c:?}");

    // Every rank left: each host removed its job and left the switch's, which went too
    // (not held, with its slots, until the switch's idle timeout).
    let joins = |i: usize| match lab.api(i, &Request::Joins).unwrap() {
        xagg_api::Response::Joins { joins } => joins,
        r => panic!("{r:?}"),
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !joins(0).is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for i in 0..3 {
        assert!(joins(i).is_empty(), "point {i}: {:?}", joins(i));
    }
}

/// The cases of docs/mpi.md's table, each run of `tests/mpi/cases.c` asserting exact
/// counts of how its calls were made: a rank whose results are cut off finishes its call
/// from a peer that sits in an `MPI_Recv` the library does not wrap (its responder takes
/// the results off its socket); a rank 3 s late is waited for, named, and no failure; a
/// NaN on one rank makes every rank redo that call with Open MPI; two requests in flight.
/// On success nothing is asked of Open MPI.
#[test]
fn mpi_calls_recover_wait_and_redo_as_the_case_table_says() {
    if !require_root("mpi_calls_recover_wait_and_redo_as_the_case_table_says") {
        return;
    }
    let lab = MpiLab::start("xmpc");
    let cases = lab.program("cases.c");
    let run = |args: &str, env: &[(&str, String)]| {
        lab.run(&format!("{} {args}", cases.display()), &lab.daemon(), env)
    };
    let give_up = [("XAGG_GIVE_UP_MS", "1000".to_string())];

    // Rank 0's results cut off (UDP from the switch's port dropped in its namespace) once
    // the communicator has joined; rank 1 sits in MPI_Recv from rank 0 meanwhile.
    let go = lab.dir.join("go");
    let o = cut_rank0_after_first(&lab.sw, &go, || {
        run(&format!("recv {}", go.display()), &give_up)
    });
    let (out, err) = checked(&o);
    assert!(out.contains("checks=2 failures=0"), "{out}");
    assert_eq!(summary(&err), (2, 0, 0), "{err}");
    assert_eq!(summary_count(&err, "finished from peers"), 1, "{err}");
    stalled_for_the_give_up_time(&out, 1.0);
    assert_eq!(summary_count(&err, "made again by Open MPI"), 0, "{err}");
    assert_eq!(
        entry_counts(&err, "MPI_Allreduce"),
        [1, 0, 0, 0, 0, 0],
        "{err}"
    );
    assert_eq!(
        entry_counts(&err, "MPI_Iallreduce by MPI_Wait"),
        [0, 1, 0, 0, 0, 0],
        "{err}"
    );

    // The same cut before a reduce-scatter, a reduce to rank 0, an all-gather and a
    // broadcast, each several windows long and routed to the switch: rank 0 finishes every
    // call from the peers (its reduce-scatter's block and the reduce from every rank's
    // contribution, folded on rank 0; the gathers' data from the ranks that got it), the
    // others theirs once rank 0 asked them; every result exact.
    let route = [give_up[0].clone(), ("XAGG_ROUTE", "all".to_string())];
    let o = cut_rank0_after_first(&lab.sw, &go, || {
        run(&format!("collectives {}", go.display()), &route)
    });
    let (out, err) = checked(&o);
    assert!(out.contains("checks=5 failures=0"), "{out}");
    for entry in [
        "MPI_Reduce_scatter_block",
        "MPI_Reduce",
        "MPI_Allgather",
        "MPI_Bcast",
    ] {
        assert_eq!(
            entry_counts(&err, entry),
            [0, 1, 0, 0, 0, 0],
            "{entry}: {err}"
        );
    }

    // The nonblocking forms, five in flight together on one communicator and one more:
    // each through the switch, counted under the completion call that handed it back.
    let (out, err) = checked(&run("icollectives", &route[1..]));
    assert!(out.contains("checks=7 failures=0"), "{out}");
    for entry in [
        "MPI_Ireduce_scatter_block by MPI_Waitall",
        "MPI_Ireduce_scatter by MPI_Waitall",
        "MPI_Iallgather by MPI_Waitall",
        "MPI_Ibcast by MPI_Waitall",
        "MPI_Ireduce by MPI_Waitall",
        "MPI_Ibcast by MPI_Wait",
    ] {
        assert_eq!(
            entry_counts(&err, entry),
            [1, 0, 0, 0, 0, 0],
            "{entry}: {err}"
        );
    }

    // Nonblocking calls each first on its communicator, in orders MPI allows (even ranks
    // start A's first, odd ranks B's; rank 0 receives a large message between its start and
    // its wait, its sender starting after): each passed to Open MPI, since joining waits
    // for every rank, which hung both orders; once a blocking call joined A and B, the
    // same orders through the switch. Each rank is killed after 60 s if it hangs.
    let o = lab.run(
        &format!("timeout 60 {} first_nonblocking", cases.display()),
        &lab.daemon(),
        &route[1..],
    );
    let (out, err) = checked(&o);
    assert!(out.contains("checks=4 failures=0"), "{out}");
    assert_eq!(
        entry_counts(&err, "MPI_Iallreduce"),
        [0, 0, 0, 0, 0, 3],
        "{err}"
    );
    assert_eq!(
        entry_counts(&err, "MPI_Iallreduce by MPI_Waitall"),
        [2, 0, 0, 0, 0, 0],
        "{err}"
    );
    assert_eq!(
        entry_counts(&err, "MPI_Allreduce"),
        [5, 0, 0, 0, 0, 0],
        "{err}"
    );
    assert!(
        err.contains("has not joined the switch (it joins at its first served blocking collective"),
        "{err}"
    );

    // Datatypes of one signature passed each rank its own way (contiguous, strided, plain):
    // every rank decides alike, every call through the switch, every result exact (before,
    // the ranks with a derived type went to Open MPI and the others to the switch: a hang).
    let (out, err) = checked(&run("datatypes", &route[1..]));
    assert!(out.contains("checks=9 failures=0"), "{out}");
    for (entry, n) in [
        ("MPI_Bcast", 3),
        // The case's first allreduce, and its own.
        ("MPI_Allreduce", 2),
        ("MPI_Iallreduce by MPI_Wait", 1),
        ("MPI_Reduce", 1),
        ("MPI_Allgather", 1),
        ("MPI_Reduce_scatter_block", 1),
    ] {
        assert_eq!(
            entry_counts(&err, entry),
            [n, 0, 0, 0, 0, 0],
            "{entry}: {err}"
        );
    }

    // Rank 0 three seconds late, the give-up time one: waited for, no failure, named.
    let (out, err) = checked(&run("slow 3", &give_up));
    assert!(out.contains("checks=2 failures=0"), "{out}");
    assert_eq!(summary(&err), (2, 0, 0), "{err}");
    assert!(err.contains("waits for members [0]"), "{err}");
    let waited = seconds_after(&out, "rank 1 waited ");
    assert!(waited > 2.0, "rank 1 waited {waited} s");

    // A NaN on rank 1: every rank redoes that call with Open MPI, which carries it.
    let (out, err) = checked(&run("nan", &[]));
    assert!(out.contains("checks=2 failures=0"), "{out}");
    assert_eq!(summary(&err), (1, 0, 0), "{err}");
    assert_eq!(summary_count(&err, "made again by Open MPI"), 1, "{err}");
    assert_eq!(
        entry_counts(&err, "MPI_Allreduce"),
        [1, 0, 0, 1, 0, 0],
        "{err}"
    );

    // Calls that do not match (a broadcast of one element fewer on rank 1): the rank the
    // switch refused says which call of the program it was and aborts the job; nobody
    // waits for it past twice the give-up time.
    let started = std::time::Instant::now();
    let o = run("mismatch", &give_up);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(!o.status.success(), "{out}{err}");
    assert!(!out.contains("checks="), "{out}");
    assert!(
        err.contains(
            ": MPI_Bcast was not taken by the switch (this rank's call does not match the others'"
        ),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "{err}");

    // Calls that do not match where the route by size splits them (rank 1's to Open MPI,
    // the others' to the switch), and a rank gone to MPI_Finalize while the others make a
    // call: the ranks the switch waits on tell the others why, and the job ends at the
    // give-up time, not at the collective timeout (30 minutes: before, each side waited
    // for the other that long; 25 s here bounds a run that waits).
    for (case, env, why) in [
        (
            "routed_apart",
            vec![
                give_up[0].clone(),
                ("XAGG_ROUTE", "0-16KiB".to_string()),
                ("XAGG_TIMEOUT_S", "25".to_string()),
            ],
            "the switch waits for rank 1, whose call of it failed there: it made this call with Open MPI instead (MPI_Allreduce): the ranks' calls differ",
        ),
        (
            "finalize_early",
            vec![give_up[0].clone(), ("XAGG_TIMEOUT_S", "25".to_string())],
            "whose call of it failed there: it is in MPI_Finalize: it makes no more calls on MPI_COMM_WORLD",
        ),
    ] {
        let started = std::time::Instant::now();
        let o = run(case, &env);
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(!o.status.success(), "{case}: {out}{err}");
        assert!(err.contains(why), "{case}: {err}");
        assert!(started.elapsed() < Duration::from_secs(40), "{case}: {err}");
    }

    // An MPI_Iallreduce of more segments than slots with rank 1 sitting in an MPI_Recv
    // (from rank 0, which waits for the allreduce) before its MPI_Wait: Open MPI completes
    // this; so must the library (its responder sends rank 1's later rounds meanwhile). A
    // 20 s collective timeout bounds the run should it not.
    let (out, err) = checked(&run("unwrapped", &[("XAGG_TIMEOUT_S", "20".into())]));
    assert!(out.contains("checks=2 failures=0"), "{out}");
    assert_eq!(summary(&err), (2, 0, 0), "{err}");
    assert_eq!(
        entry_counts(&err, "MPI_Iallreduce by MPI_Wait"),
        [1, 0, 0, 0, 0, 0],
        "{err}"
    );

    // MPI_THREAD_MULTIPLE: collectives on two communicators from two threads, started in
    // opposite orders on neighbouring ranks. One lock held across every call's wait hung
    // this; `timeout` bounds it should it hang again.
    let (out, err) = checked(&lab.run(
        &format!("timeout 60 {} threads", cases.display()),
        &lab.daemon(),
        &[],
    ));
    assert!(out.contains("checks=3 failures=0"), "{out}");
    assert_eq!(summary(&err), (11, 0, 0), "{err}");
    assert_eq!(
        entry_counts(&err, "MPI_Allreduce"),
        [11, 0, 0, 0, 0, 0],
        "{err}"
    );

    // Polling a request with MPI_Request_get_status alone sees it complete.
    let (out, err) = checked(&lab.run(
        &format!("timeout 60 {} status", cases.display()),
        &lab.daemon(),
        &[],
    ));
    assert!(out.contains("checks=3 failures=0"), "{out}");
    assert_eq!(
        entry_counts(&err, "MPI_Iallreduce by MPI_Wait"),
        [1, 0, 0, 0, 0, 0],
        "{err}"
    );

    // Two requests in flight, one MPI_Waitall.
    let (out, err) = checked(&run("pair", &[]));
    assert!(out.contains("checks=3 failures=0"), "{out}");
    assert_eq!(summary(&err), (3, 0, 0), "{err}");
    assert_eq!(
        entry_counts(&err, "MPI_Iallreduce by MPI_Waitall"),
        [2, 0, 0, 0, 0, 0],
        "{err}"
    );

    // The route by size, rank 0's alike on every rank (the others' is ignored): by
    // default with 4 ranks, 4 KiB and 1 KiB allreduces to the switch, 64 KiB and 1 MiB to
    // Open MPI (below 16 KiB); broadcasts by their own route, every one to Open MPI (the
    // allreduce's route would take the 1 KiB and 4 KiB ones). Then as set (64 KiB and up),
    // every collective alike.
    let ignored = "XAGG_ROUTE=none; [ $OMPI_COMM_WORLD_RANK = 0 ] && unset XAGG_ROUTE";
    let sizes = format!("sh -c '{ignored}; exec {} sizes'", cases.display());
    let (out, err) = checked(&lab.run(&sizes, &lab.daemon(), &[]));
    assert!(out.contains("checks=7 failures=0"), "{out}");
    assert_eq!(summary(&err), (2, 0, 0), "{err}");
    assert_eq!(
        summary_count(&err, "routed to Open MPI by size"),
        5,
        "{err}"
    );
    assert_eq!(entry_counts(&err, "MPI_Bcast"), [0, 0, 3, 0, 0, 0], "{err}");
    let (out, err) = checked(&run("sizes", &[("XAGG_ROUTE", "64KiB-".into())]));
    assert!(out.contains("checks=7 failures=0"), "{out}");
    assert_eq!(summary(&err), (2, 0, 0), "{err}");
    assert_eq!(
        summary_count(&err, "routed to Open MPI by size"),
        4,
        "{err}"
    );
    assert_eq!(entry_counts(&err, "MPI_Bcast"), [1, 0, 2, 0, 0, 0], "{err}");
    // A route that does not parse: Open MPI serves, rank 0 says how to write one.
    let (out, err) = checked(&run("sizes", &[("XAGG_ROUTE", "16KiB".into())]));
    assert!(out.contains("checks=7 failures=0"), "{out}");
    assert_eq!(summary(&err).0, 0, "{err}");
    assert!(
        err.contains("collectives go to Open MPI: rank 0's XAGG_ROUTE=16KiB"),
        "{err}"
    );

    // Packed scalars: 1e10 beside 1e-10 in one buffer. By default (the exact lane) the
    // double sum is exact through the switch, and the float one, too wide for 64 bits, is
    // flagged and redone by Open MPI: both keep the residual, as Open MPI's sum does. The
    // fast lane (one exponent per segment) loses it in both.
    let (out, err) = checked(&run("packed", &[]));
    assert!(out.contains("checks=3 failures=0"), "{out}");
    assert_eq!(summary(&err), (2, 0, 0), "{err}");
    assert_eq!(
        entry_counts(&err, "MPI_Allreduce"),
        [2, 0, 0, 1, 0, 0],
        "{err}"
    );
    // XAGG_FLOAT=none: float sums are Open MPI's, each rank saying why once.
    let (out, err) = checked(&run("packed", &[("XAGG_FLOAT", "none".into())]));
    assert!(out.contains("checks=3 failures=0"), "{out}");
    assert_eq!(
        entry_counts(&err, "MPI_Allreduce"),
        [1, 0, 0, 0, 0, 2],
        "{err}"
    );
    assert!(
        err.contains("float sums go to Open MPI (rank 0's XAGG_FLOAT=none)"),
        "{err}"
    );
    let o = run("packed", &[("XAGG_FLOAT", "fast".into())]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("failures={}", 2 * RANKS)),
        "the fast lane loses both residuals: {out}"
    );

    // The same bits whatever order the ranks' contributions arrive in (ranks late by 50 ms
    // each, first in rank order, then reversed), every call through the switch; the fast
    // lane's bits depend on the order (which shows the orders differed).
    let hashes = |late: u32, float: &str| {
        let (out, err) = checked(&run(
            &format!("order {late}"),
            &[("XAGG_ROUTE", "all".into()), ("XAGG_FLOAT", float.into())],
        ));
        assert_eq!(
            entry_counts(&err, "MPI_Allreduce"),
            [3, 0, 0, 0, 0, 0],
            "{err}"
        );
        out.lines()
            .find(|l| l.starts_with("hashes "))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string()
    };
    assert_eq!(
        hashes(0, "exact"),
        hashes(1, "exact"),
        "exact: the same bits"
    );
    assert_ne!(
        hashes(0, "fast"),
        hashes(1, "fast"),
        "fast: the order shows"
    );
}
