//! The two-host deployment docs/topologies.md prints ("Two hosts under a switch, in
//! namespaces"), run as printed in one shell: the switch's and two hosts' daemons from their
//! configuration files (the hosts' with `[parent]`), each rank naming its host's daemon
//! through mpirun's agent, docs/mpi.md's multi-host line saved as the recipe says (without
//! its `XAGG_DAEMON`), the MPI collectives program through both levels, then the take-down.
//! Only the recipe's variables, the library's path, the key file and the program are the
//! test's.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use xagg_api::{call, Request, Response};
use xagg_tests::*;

const DOC: &str = "topologies.md";
const HOSTS: usize = 2;
const PER: usize = 2;
const SW: &str = "xd2s";
const HOST: &str = "xd2h";
const RANK: &str = "xd2r";
const NAME: &str = "xagg-test-2h";

/// The daemons as the recipe names them: the switch's, then each host's.
fn daemons() -> Vec<String> {
    std::iter::once(NAME.to_string())
        .chain((0..HOSTS).map(|h| format!("{NAME}-h{h}")))
        .collect()
}

fn socket(daemon: &str) -> PathBuf {
    PathBuf::from(format!("/run/{daemon}/xaggd.sock"))
}

fn counters(daemon: &str) -> std::collections::BTreeMap<String, u64> {
    match call(&socket(daemon), &Request::Counters) {
        Ok(Response::Counters { counters }) => counters,
        r => panic!("{daemon}'s counters: {r:?}"),
    }
}

fn joins(daemon: &str) -> usize {
    match call(&socket(daemon), &Request::Joins) {
        Ok(Response::Joins { joins }) => joins.len(),
        r => panic!("{daemon}'s joins: {r:?}"),
    }
}

fn namespaces() -> Vec<String> {
    std::iter::once(SW.to_string())
        .chain((0..HOSTS).map(|h| format!("{HOST}{h}")))
        .chain((0..HOSTS * PER).map(|i| format!("{RANK}{i}")))
        .collect()
}

/// What a run that failed half-way left: its daemons, namespaces and pins.
fn clear(etc: &Path) {
    for d in daemons() {
        let config = etc.join(format!("{d}.toml"));
        let _ = Command::new("pkill")
            .args(["-f", &format!("xaggd --config {}", config.display())])
            .status();
    }
    std::thread::sleep(Duration::from_millis(200));
    for d in daemons() {
        let _ = Command::new(bin("xagg"))
            .args(["detach", "--pin-path", &format!("/sys/fs/bpf/{d}")])
            .args(["--socket", "/nonexistent"])
            .output();
    }
    for ns in namespaces() {
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    }
}

#[test]
fn the_documented_two_host_deployment() {
    if !require_root("the_documented_two_host_deployment") {
        return;
    }
    let dir = std::env::temp_dir().join("xagg-test-deploy-2h");
    let etc = dir.join("etc");
    clear(&etc);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for d in daemons() {
        let _ = std::fs::remove_dir_all(format!("/var/lib/{d}"));
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi/collectives.c");
    let program = dir.join("collectives");
    xagg_lab::mpi::compile(&src, &program, &[]).unwrap();

    // docs/mpi.md's multi-host line saved as the recipe says: without its XAGG_DAEMON.
    let mpi = doc_block("mpi.md", "sh", "btl_tcp_if_include");
    let daemon_flag = "-x XAGG_DAEMON=10.77.0.1:47900 ";
    for p in [
        "/path/to/libxagg_mpi.so",
        "/etc/xagg/lab.key",
        "./program",
        daemon_flag,
    ] {
        assert!(mpi.contains(p), "{p} in {mpi}");
    }
    std::fs::write(
        dir.join("run-mpi.sh"),
        mpi.replace(daemon_flag, "")
            .replace(
                "/path/to/libxagg_mpi.so",
                &bin("libxagg_mpi.so").display().to_string(),
            )
            .replace(
                "/etc/xagg/lab.key",
                &etc.join("lab.key").display().to_string(),
            )
            .replace("./program", &program.display().to_string()),
    )
    .unwrap();

    // The recipe's three blocks in one shell, its first lines given the test's names; the
    // shell waits between the run and the take-down while the test reads the daemons.
    let set_up = doc_block(DOC, "sh", "Two hosts under a switch, in namespaces: set up");
    let run = doc_block(DOC, "sh", "Two hosts under a switch, in namespaces: run");
    let down = doc_block(
        DOC,
        "sh",
        "Two hosts under a switch, in namespaces: take down",
    );
    let set_up = [
        ("SW=xsw", format!("SW={SW}")),
        ("HOST=xhost", format!("HOST={HOST}")),
        ("RANK=rank", format!("RANK={RANK}")),
        ("HOSTS=2", format!("HOSTS={HOSTS}")),
        ("PER=2", format!("PER={PER}")),
        ("ETC=/etc/xagg", format!("ETC={}", etc.display())),
        ("NAME=xagg", format!("NAME={NAME}")),
    ]
    .iter()
    .fold(set_up, |text, (from, to)| {
        assert!(text.contains(from), "{from:?} in the recipe:\n{text}");
        text.replacen(from, to, 1)
    });
    let (ran, go) = (dir.join("ran"), dir.join("go"));
    let pause = format!(
        "touch {}\nwhile [ ! -e {} ]; do sleep 0.1; done\n",
        ran.display(),
        go.display()
    );
    let script = format!("{set_up}\n{run}\n{pause}{down}");
    let path = std::env::var("PATH").unwrap_or_default();
    let bins = bin("xagg").parent().unwrap().to_owned();
    let (out_file, err_file) = (dir.join("shell.out"), dir.join("shell.err"));
    let mut shell = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&dir)
        .env("PATH", format!("{}:{path}", bins.display()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .spawn()
        .unwrap();
    let output = || {
        (
            std::fs::read_to_string(&out_file).unwrap_or_default(),
            std::fs::read_to_string(&err_file).unwrap_or_default(),
        )
    };
    let until = Instant::now() + Duration::from_secs(240);
    while !ran.exists() {
        if let Some(status) = shell.try_wait().unwrap() {
            let (out, err) = output();
            clear(&etc);
            panic!("the recipe stopped before its run ended ({status}):\n{out}\n{err}");
        }
        assert!(
            Instant::now() < until,
            "the run did not end: {:?}",
            output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The run: every collective exact, through the hosts and the switch (a tree).
    let (out, err) = output();
    let read_now = || -> Vec<_> { daemons().iter().map(|d| counters(d)).collect() };
    let c = read_now();
    let first_joins: Vec<usize> = {
        // The hosts leave the switch's job as their ranks leave: moments after the run.
        let until = Instant::now() + Duration::from_secs(5);
        while daemons().iter().any(|d| joins(d) > 0) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        daemons().iter().map(|d| joins(d)).collect()
    };
    // An operator sees each host's parent, and which jobs a host serves through it.
    let host_status = Command::new(bin("xagg"))
        .args([
            "--socket",
            &socket(&daemons()[1]).display().to_string(),
            "status",
        ])
        .output()
        .unwrap();
    let host_status = String::from_utf8_lossy(&host_status.stdout).into_owned();
    std::fs::write(&go, "").unwrap();
    let status = shell.wait().unwrap();
    let (all_out, all_err) = output();
    eprintln!("stdout:\n{all_out}\nstderr:\n{all_err}");
    assert!(status.success(), "the recipe failed");
    assert!(
        out.contains("checks=") && out.contains("failures=0"),
        "{out}"
    );
    assert!(
        err.contains(
            "rank 0: communicators served: 1 joined through its host, which joined the switch (a tree)"
        ),
        "{err}"
    );
    // Every call of each collective through the switch or, by the default route, Open MPI's
    // (switch, recovered, routed, flagged, fallback, passed): none fell back or passed.
    // With 4 ranks the default sends every broadcast to Open MPI, and some of each other
    // collective's calls to the switch.
    let mut through_switch = 0;
    for (name, calls) in [
        ("MPI_Reduce_scatter_block", 30),
        ("MPI_Reduce_scatter", 17),
        ("MPI_Allgather", 30),
        ("MPI_Bcast", 60),
        ("MPI_Reduce", 120),
    ] {
        let [switch, recovered, routed, flagged, fallback, passed] = entry_counts(&err, name);
        through_switch += switch;
        let as_routed = if name == "MPI_Bcast" {
            switch == 0
        } else {
            switch > 0
        };
        assert!(as_routed && switch + routed == calls, "{name}: {err}");
        assert_eq!(
            [recovered, flagged, fallback, passed],
            [0; 4],
            "{name}: {err}"
        );
    }
    // The totals line counts them too.
    assert!(
        err.contains(&format!(
            "; {through_switch} other collectives through the switch"
        )),
        "{through_switch}: {err}"
    );
    let get = |i: usize, k: &str| c[i].get(k).copied().unwrap_or(0);
    assert!(
        get(0, "complete") > 0,
        "the switch completed nothing: {c:?}"
    );
    for h in 1..=HOSTS {
        assert_eq!(
            get(h, "partial"),
            get(0, "complete"),
            "host {}: one partial per segment the switch completed: {c:?}",
            h - 1
        );
    }
    assert!(
        host_status.contains("parent: the daemon at 10.77.0.1:47900, behind up0, credential lab;"),
        "{host_status}"
    );
    assert_eq!(
        first_joins,
        vec![0; HOSTS + 1],
        "every job gone once the ranks left, the switch's too"
    );

    // Taken down: no namespace, no daemon, no pin of the recipe's names.
    let names = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let names = String::from_utf8_lossy(&names.stdout).into_owned();
    for ns in namespaces() {
        assert!(
            !names
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ns.as_str())),
            "{ns} left: {names}"
        );
    }
    for d in daemons() {
        assert!(!socket(&d).exists(), "{d}'s socket left");
        assert!(
            !PathBuf::from(format!("/sys/fs/bpf/{d}")).exists(),
            "{d}'s pins left"
        );
        let _ = std::fs::remove_dir_all(format!("/var/lib/{d}"));
    }
    let running = Command::new("pgrep")
        .args(["-f", &format!("xaggd --config {}", etc.display())])
        .output()
        .unwrap();
    assert!(
        running.stdout.is_empty(),
        "a daemon still runs: {}",
        String::from_utf8_lossy(&running.stdout)
    );
}
