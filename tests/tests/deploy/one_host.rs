//! The deployment docs/topologies.md prints ("One host, ranks in namespaces"), run as
//! printed at MTU 9000 and 1500: the switch and ranks' namespaces, the daemon from its
//! configuration file, the ranks' ends attached by `xagg host attach`, and the documented
//! `mpirun` and `python -m torch.distributed.run` lines (docs/mpi.md, docs/python.md) run
//! by the documented way into the namespaces; then taken down as printed. Only the
//! recipe's variables, the library's path, the interpreter and the programs are the
//! test's.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use xagg_api::{call, Request, Response};
use xagg_tests::*;

const DOC: &str = "topologies.md";
const RANKS: usize = 4;

/// One deployment's names and files.
struct Deployment {
    mtu: usize,
    dir: PathBuf,
    /// The recipe's variable lines as printed, and with this deployment's values.
    printed: String,
    vars: String,
    sw: String,
    rank: String,
    /// The recipe's `NAME`: the daemon's socket, pins and state directory.
    name: String,
}

impl Deployment {
    fn new(mtu: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("xagg-test-deploy{mtu}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let set_up = doc_block(DOC, "sh", "ranks in namespaces: set up");
        let printed: String = set_up
            .lines()
            .take_while(|l| !l.trim().is_empty())
            .map(|l| format!("{l}\n"))
            .collect();
        let (sw, rank, name) = (
            format!("xd{mtu}s"),
            format!("xd{mtu}r"),
            format!("xagg-test-deploy{mtu}"),
        );
        let vars = [
            ("MTU=9000", format!("MTU={mtu}")),
            ("SW=xsw", format!("SW={sw}")),
            ("RANK=rank", format!("RANK={rank}")),
            ("RANKS=4", format!("RANKS={RANKS}")),
            (
                "ETC=/etc/xagg",
                format!("ETC={}", dir.join("etc").display()),
            ),
            ("NAME=xagg", format!("NAME={name}")),
        ]
        .iter()
        .fold(printed.clone(), |text, (from, to)| {
            assert!(
                text.contains(from),
                "{from:?} in the recipe's first lines:\n{text}"
            );
            text.replacen(from, to, 1)
        });
        let d = Self {
            mtu,
            dir,
            printed,
            vars,
            sw,
            rank,
            name,
        };
        d.clear();
        d
    }

    /// Runs `script` (a block of the recipe, or lines of it) with the recipe's variables
    /// (the set-up's own lines of them given this deployment's values, or those lines
    /// first), in the deployment's directory, with the workspace's binaries on `PATH`; its
    /// output goes to files, as a daemon it starts keeps them open.
    fn sh(&self, name: &str, script: &str) -> Output {
        let script = match script.strip_prefix(&self.printed) {
            Some(rest) => format!("{}{rest}", self.vars),
            None => format!("{}\n{script}", self.vars),
        };
        let path = std::env::var("PATH").unwrap_or_default();
        let bins = bin("xagg").parent().unwrap().to_owned();
        let (out, err) = (
            self.dir.join(format!("{name}.out")),
            self.dir.join(format!("{name}.err")),
        );
        let status = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .current_dir(&self.dir)
            .env("PATH", format!("{}:{path}", bins.display()))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .status()
            .unwrap();
        let o = Output {
            status,
            stdout: std::fs::read(&out).unwrap(),
            stderr: std::fs::read(&err).unwrap(),
        };
        eprintln!(
            "{name} (MTU {}): {status}\nstdout:\n{}\nstderr:\n{}",
            self.mtu,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    fn etc(&self) -> PathBuf {
        self.dir.join("etc")
    }

    /// The daemon's socket, pins and state directory, as the recipe names them.
    fn socket(&self) -> PathBuf {
        PathBuf::from(format!("/run/{}/xaggd.sock", self.name))
    }
    fn pins(&self) -> PathBuf {
        PathBuf::from(format!("/sys/fs/bpf/{}", self.name))
    }
    fn state(&self) -> PathBuf {
        PathBuf::from(format!("/var/lib/{}", self.name))
    }

    fn counter(&self, name: &str) -> u64 {
        match call(&self.socket(), &Request::Counters) {
            Ok(Response::Counters { counters }) => counters.get(name).copied().unwrap_or(0),
            r => panic!("counters: {r:?}"),
        }
    }

    fn joins(&self) -> usize {
        match call(&self.socket(), &Request::Joins) {
            Ok(Response::Joins { joins }) => joins.len(),
            r => panic!("joins: {r:?}"),
        }
    }

    /// What a run that failed half-way left: its daemon, its namespaces, its pins.
    fn clear(&self) {
        let config = self.etc().join("xaggd.toml");
        let _ = Command::new("pkill")
            .args(["-f", &format!("xaggd --config {}", config.display())])
            .status();
        std::thread::sleep(Duration::from_millis(200));
        let _ = Command::new(bin("xagg"))
            .arg("detach")
            .arg("--pin-path")
            .arg(self.pins())
            .args(["--socket", "/nonexistent"])
            .output();
        for ns in (0..RANKS)
            .map(|i| format!("{}{i}", self.rank))
            .chain([self.sw.clone()])
        {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.clear();
        }
    }
}

/// A namespace's inode: the name of its rank ends' pin directory.
fn netns_inode(ns: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/run/netns/{ns}")).unwrap().ino()
}

/// Every process's command line, read now.
fn command_lines() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .collect()
}

fn deploy(mtu: usize, mpi_program: &Path) {
    let d = Deployment::new(mtu);

    // The documented lines, saved as the recipe says, with only their placeholders the
    // test's.
    let mpi = doc_block("mpi.md", "sh", "btl_tcp_if_include");
    let torch = doc_block("python.md", "sh", "torch.distributed.run");
    for (line, placeholders) in [
        (
            &mpi,
            &["/path/to/libxagg_mpi.so", "/etc/xagg/lab.key", "./program"][..],
        ),
        (
            &torch,
            &["/etc/xagg/lab.key", "train.py", "python -m", "$i"][..],
        ),
    ] {
        for p in placeholders {
            assert!(line.contains(p), "{p} in {line}");
        }
    }
    let key_file = d.etc().join("lab.key").display().to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/cases.py");
    std::fs::write(
        d.dir.join("run-mpi.sh"),
        mpi.replace(
            "/path/to/libxagg_mpi.so",
            &bin("libxagg_mpi.so").display().to_string(),
        )
        .replace("/etc/xagg/lab.key", &key_file)
        .replace("./program", &format!("{} sizes", mpi_program.display())),
    )
    .unwrap();
    let python = xagg_lab::python::interpreter();
    std::fs::write(
        d.dir.join("run-torch.sh"),
        torch
            .replace("/etc/xagg/lab.key", &key_file)
            .replace("train.py", &format!("{} sizes", script.display()))
            .replace("python -m", &format!("{} -m", python.display())),
    )
    .unwrap();

    // Set up and run, as printed, in one shell (as the recipe says: the run block uses the
    // set-up's variables, and the daemon is that shell's background job), with the process
    // table watched for the key from the moment the set-up wrote it.
    let started = Instant::now();
    let set_up = doc_block(DOC, "sh", "ranks in namespaces: set up");
    let run = doc_block(DOC, "sh", "ranks in namespaces: run");
    let key_path = d.etc().join("lab.key");
    let done = std::sync::atomic::AtomicBool::new(false);
    let (o, seen) = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            let mut seen = Vec::new();
            let mut looks = 0;
            let mut key: Option<String> = None;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if key.is_none() {
                    key = std::fs::read_to_string(&key_path)
                        .ok()
                        .filter(|k| k.trim().len() == 64);
                }
                if let Some(k) = &key {
                    seen.extend(command_lines().into_iter().filter(|c| c.contains(k.trim())));
                    looks += 1;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (seen, looks)
        });
        let o = d.sh("set-up-and-run", &format!("{set_up}\n{run}"));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (o, watch.join().unwrap())
    });
    let ran = started.elapsed();
    assert!(o.status.success(), "the set-up or the run failed");
    let (seen, looks) = seen;
    assert!(looks > 10, "the process table was read {looks} times");
    assert!(seen.is_empty(), "the key on a command line: {seen:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("swp0 (XDP native)") && out.contains("would start"),
        "xaggd --check and xagg status: {out}"
    );
    let key = std::fs::read_to_string(&key_path).unwrap();
    assert_eq!(key.len(), 64, "{key:?}");

    // MPI: every call through the switch or where the size rule sends it (with 4 ranks:
    // the first allreduce and 1 KiB to the switch, 64 KiB and 1 MiB to Open MPI; every
    // broadcast to Open MPI), none fell back.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(out.contains("checks=7 failures=0"), "{out}");
    assert_eq!(
        entry_counts(&err, "MPI_Allreduce"),
        [2, 0, 2, 0, 0, 0],
        "{err}"
    );
    assert_eq!(entry_counts(&err, "MPI_Bcast"), [0, 0, 3, 0, 0, 0], "{err}");
    // PyTorch: int32's 4 KiB and 1 MiB to the switch, 4 MiB to Gloo; float16's 1 MiB and
    // 4 MiB both to the switch (with 4 ranks float16 goes at every size); none fell back.
    let mut torch_out = String::new();
    for i in 0..RANKS {
        let log = std::fs::read_to_string(d.dir.join(format!("torch-{i}.log"))).unwrap();
        assert!(log.contains(&format!("rank {i}: sizes ok=True")), "{log}");
        torch_out.push_str(&log);
    }
    assert_eq!(
        entry_counts(&torch_out, "all_reduce"),
        [5, 0, 1, 0, 0, 0],
        "{torch_out}"
    );
    let log = std::fs::read_to_string(d.etc().join("xaggd.log")).unwrap();
    let segment = if mtu == 1500 { 1432 } else { 8928 };
    assert_eq!(
        log.matches(&format!("{segment}-byte segments")).count(),
        2,
        "one MPI job and one PyTorch job, each of the path's segment: {log}"
    );
    // Status queries: a rank learning its job's state asks once about each copy of each
    // slot, then at most 20 a second (docs/protocol.md).
    // (A fresh dataplane: its counters started at 0 with the set-up.)
    let queries = d.counter("status_reply");
    assert_eq!(log.matches("128 slots").count(), 2, "{log}");
    let jobs = 2;
    let bound = jobs * RANKS as u64 * 2 * 128 + 20 * RANKS as u64 * ran.as_secs().max(1);
    assert!(queries <= bound, "{queries} status queries in {ran:?}");
    eprintln!("MTU {mtu}: {queries} status queries in {ran:?}; the key on no command line ({looks} looks)");
    // The programs ended, and their ranks left their jobs.
    assert_eq!(d.joins(), 0, "every job left as its program ended");

    // Take down, as printed: first the switch and the ranks' ends, then the namespaces.
    let inodes: Vec<u64> = (0..RANKS)
        .map(|i| netns_inode(&format!("{}{i}", d.rank)))
        .collect();
    let down = doc_block(DOC, "sh", "ranks in namespaces: take down");
    let (stop, remove): (Vec<&str>, Vec<&str>) =
        down.lines().partition(|l| !l.contains("netns del"));
    let o = d.sh("stop", &stop.join("\n"));
    assert!(o.status.success(), "taking the switch down failed");
    let ns = |n: &str, args: &[&str]| {
        let o = Command::new("ip")
            .args(["netns", "exec", n])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    for (i, inode) in inodes.iter().enumerate() {
        let port = format!("swp{i}");
        let link = ns(&d.sw, &["ip", "-d", "link", "show", &port]);
        assert!(!link.contains("xdp"), "XDP left on {port}: {link}");
        let qdiscs = ns(&d.sw, &["tc", "qdisc", "show", "dev", &port]);
        assert!(
            !qdiscs.contains("clsact"),
            "a qdisc left on {port}: {qdiscs}"
        );
        let end = ns(
            &format!("{}{i}", d.rank),
            &["ip", "-d", "link", "show", "eth0"],
        );
        assert!(!end.contains("xdp"), "XDP left on rank {i}'s end: {end}");
        let pins = PathBuf::from(format!("/sys/fs/bpf/xagg-host/{inode}"));
        assert!(!pins.exists(), "{} left", pins.display());
    }
    let locks = [
        PathBuf::from(format!("{}.lock", d.socket().display())),
        d.state().join("xaggd.lock"),
        xagg_daemon::owner::dataplane_lock(&d.pins()),
    ];
    let left: Vec<_> = locks.iter().filter(|l| l.exists()).collect();
    assert!(left.is_empty(), "lock files left: {left:?}");
    assert!(!d.pins().exists(), "{} left", d.pins().display());
    let run = d.socket().parent().unwrap().to_owned();
    assert!(!run.exists(), "{} left", run.display());
    // What the recipe says it leaves: the state directory, taken away here.
    let _ = std::fs::remove_dir_all(d.state());
    assert!(
        !command_lines()
            .iter()
            .any(|c| c.contains("xaggd --config") && c.contains(&d.etc().display().to_string())),
        "the daemon still runs"
    );
    let o = d.sh("remove", &remove.join("\n"));
    assert!(o.status.success());
    let names = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let names = String::from_utf8_lossy(&names.stdout);
    assert!(
        !names.contains(&d.sw) && !names.contains(&d.rank),
        "{names}"
    );
}

#[test]
fn the_documented_deployment_at_9000_and_1500() {
    if !require_root("the_documented_deployment_at_9000_and_1500") {
        return;
    }
    let dir = std::env::temp_dir().join("xagg-test-deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi/cases.c");
    let program = dir.join("cases");
    xagg_lab::mpi::compile(&src, &program, &[]).unwrap();
    for mtu in [9000, 1500] {
        deploy(mtu, &program);
    }
}
