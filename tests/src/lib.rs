//! Test support: root checks, the BPF_PROG_RUN harness and its tables ([`table`]) and the
//! lab's switch from `xagg-lab`, with the panicking shorthands the tests use.

use std::{
    collections::BTreeMap,
    ops::{Deref, DerefMut},
    process::ExitStatus,
};

pub use nix::sys::signal::Signal;
use xagg_api::{Request, Response};
use xagg_common::{
    wire::{DType, Lane, Op, PAYLOAD_OFFSET},
    JobShape,
};
use xagg_daemon::config::Config;
pub use xagg_lab::{bin, switch::Allreduce, testrun::*};
use xagg_lab::{lab::Lab, switch::LabSwitch};
use xagg_worker::Report;

pub mod table;
pub use table::*;

/// The switch program of this build, loaded for BPF_PROG_RUN.
pub fn load_switch() -> Switch {
    Switch::load(xagg_objects::SWITCH.bytes().expect("the switch's object"))
}

/// Rank `rank`'s worker `w` serving its peers (the job's state learnt first), and knowing
/// theirs once every rank put its responder's address into `addresses` (`barrier`).
pub fn serve_peers(
    w: &xagg_worker::Worker,
    rank: usize,
    secret: &xagg_worker::Secret,
    addresses: &std::sync::Mutex<Vec<Option<std::net::SocketAddrV4>>>,
    barrier: &std::sync::Barrier,
) -> Result<(), xagg_worker::AllreduceError> {
    w.sync()?;
    addresses.lock().unwrap()[rank] = Some(w.serve_peers(secret)?);
    barrier.wait();
    let all = addresses
        .lock()
        .unwrap()
        .iter()
        .flatten()
        .copied()
        .collect();
    w.set_peers(rank, all);
    Ok(())
}

/// `nft` commands in the network namespace `ns`: whether they took.
pub fn nft(ns: &str, rules: &str) -> bool {
    use std::io::Write;
    let Ok(mut c) = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
    else {
        return false;
    };
    let wrote = c
        .stdin
        .take()
        .is_some_and(|mut i| i.write_all(rules.as_bytes()).is_ok());
    c.wait().is_ok_and(|s| s.success()) && wrote
}

/// Cuts the results (and status replies) of the switch off from namespace `ns` (`cut`),
/// or restores them: UDP from the collective port dropped on input there.
pub fn cut_results(ns: &str, cut: bool) -> bool {
    if cut {
        nft(
            ns,
            &format!(
                "table inet xagg_cut {{\n chain in {{\n  type filter hook input priority 0;\n  udp sport {} drop\n }}\n}}\n",
                xagg_common::wire::DEFAULT_PORT
            ),
        )
    } else {
        nft(ns, "delete table inet xagg_cut\n")
    }
}

/// Cuts the switch's answers off from the first `ranks` workers ([`cut_results`]) while
/// `run` goes on, then waits until the daemon lists no joined job or `run` ends: its
/// output, and how long before its end the jobs were gone.
pub fn cut_all_then_time_the_jobs_left<T>(
    sw: &TestSwitch,
    ranks: usize,
    run: std::thread::ScopedJoinHandle<'_, T>,
) -> (T, std::time::Duration) {
    for w in 0..ranks {
        assert!(
            cut_results(&sw.lab.worker_ns(w), true),
            "nft could not add the rule"
        );
    }
    let joins = || match sw.api(Request::Joins) {
        Response::Joins { joins } => joins.len(),
        r => panic!("{r:?}"),
    };
    while joins() > 0 && !run.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let gone = std::time::Instant::now();
    let out = run.join().unwrap();
    (out, gone.elapsed())
}

/// Runs `run` (a job whose rank 0, after its first allreduce, waits for the file `go`) and
/// cuts rank 0's results off (worker 0's namespace, [`cut_results`]) once that first
/// allreduce completed at the switch; writes `go` either way, so the run ends; restores
/// the results after it.
pub fn cut_rank0_after_first<T: Send>(
    sw: &TestSwitch,
    go: &std::path::Path,
    run: impl FnOnce() -> T + Send,
) -> T {
    let ns = sw.lab.worker_ns(0);
    let out = after_first(sw, go, || cut_results(&ns, true), run);
    assert!(cut_results(&ns, false));
    out
}

/// Runs `run` (a job whose rank 0, after its first allreduce, waits for the file `go`),
/// makes the fault `fault` (true if it took) once that first allreduce completed at the
/// switch, and writes `go` either way, so the run ends.
pub fn after_first<T: Send>(
    sw: &TestSwitch,
    go: &std::path::Path,
    fault: impl FnOnce() -> bool,
    run: impl FnOnce() -> T + Send,
) -> T {
    let _ = std::fs::remove_file(go);
    let before = sw.counters().get("complete").copied().unwrap_or(0);
    std::thread::scope(|s| {
        let r = s.spawn(run);
        let started = std::time::Instant::now();
        while sw.counters().get("complete").copied().unwrap_or(0) <= before {
            std::thread::sleep(std::time::Duration::from_millis(20));
            if started.elapsed() > std::time::Duration::from_secs(120) {
                std::fs::write(go, "").unwrap();
                panic!("the first allreduce never completed");
            }
        }
        let made = fault();
        std::fs::write(go, "").unwrap();
        assert!(made, "the fault was not made");
        r.join().unwrap()
    })
}

/// The seconds a case program printed after `phrase` ("rank 1 waited 3.0 s"); panics with
/// the output if it printed none.
pub fn seconds_after(output: &str, phrase: &str) -> f64 {
    output
        .split(phrase)
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {phrase:?} and seconds: {output}"))
}

/// Rank 0's "recovered in S s" in a case program's output, whose results were cut off: the
/// switch's silence stalls the call for the give-up time (`XAGG_GIVE_UP_MS`, `give_up_s`)
/// and the status queries after it (300 ms), then its peers answer — not twice that.
pub fn stalled_for_the_give_up_time(output: &str, give_up_s: f64) {
    let stalled = seconds_after(output, "rank 0 recovered in ");
    assert!(
        stalled >= give_up_s && stalled < give_up_s + 0.8,
        "rank 0's call stalled {stalled} s with a give-up time of {give_up_s} s"
    );
}

/// Rank 0's summary line for entry point `name` in a drop-in's output: its calls through
/// the switch, recovered from peers, routed by size, flagged and redone, fallback, passed
/// (zeros: no line).
pub fn entry_counts(output: &str, name: &str) -> [u64; 6] {
    let prefix = format!("xagg: rank 0: {name}: ");
    let Some(line) = output
        .lines()
        .find_map(|l| l.split_once(&prefix).map(|(_, r)| r))
    else {
        return [0; 6];
    };
    let n: Vec<u64> = line
        .split(", ")
        .map(|w| w.split(' ').next().unwrap().parse().unwrap())
        .collect();
    n.try_into().unwrap_or_else(|_| panic!("{line}"))
}

/// Whether a test that needs root may run. Without root it skips loudly — except under
/// `CI=true`, where it fails: CI runs as root and must run every test.
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root, and CI=true forbids skipping");
    }
    skipped(&format!("{test}: needs root (BPF and network namespaces)"));
    false
}

/// Whether `n` CPUs are available to this process; skips loudly if not (a test of what
/// happens on several CPUs at once proves nothing on one), and fails instead under CI=true.
pub fn require_cpus(test: &str, n: usize) -> bool {
    let have = std::thread::available_parallelism().map_or(1, |c| c.get());
    if have >= n {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs {n} CPUs, has {have}, and CI=true forbids skipping");
    }
    skipped(&format!("{test}: needs {n} CPUs, this process has {have}"));
    false
}

/// Polls `check` every 20 ms until it returns `Ok`, and returns that; panics naming `what`
/// and the last `Err` if `within` passes first. Tests wait for a state with this instead of
/// sleeping a guessed time and asserting after.
pub fn eventually<T, E: std::fmt::Debug>(
    what: &str,
    within: std::time::Duration,
    mut check: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() >= deadline => {
                panic!("{what}: not within {within:?}; last: {e:?}")
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// Says a test was skipped where it shows: straight to the standard error, which the test
/// harness captures only for `eprintln!`.
fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED {why} ***\n");
}

/// A job shape of i32 sums: `members` members, `slots` slots, `segment` elements.
pub fn i32_shape(members: usize, slots: usize, segment: usize) -> JobShape {
    JobShape::with_elements(members, slots, segment, Lane::I32).expect("a valid test shape")
}

pub use xagg_lab::switch::{credential_env, CREDENTIAL, LISTEN};

/// What can come of a contribution where it is folded: a steered contribution bumps
/// `steered` where it came in and exactly one of these where it is folded (a replay the
/// fault injection dropped included).
pub const FOLDED: [xagg_common::Counter; 7] = {
    use xagg_common::Counter::*;
    [
        Contribution,
        Complete,
        ResultReplay,
        DropDuplicate,
        DropStale,
        SlotReclaimed,
        InjectDropResult,
    ]
};

/// The sum of `counters` (by name, as the API gives them) over [`FOLDED`].
pub fn folded(counters: &BTreeMap<String, u64>) -> u64 {
    FOLDED
        .iter()
        .map(|c| counters.get(c.name()).copied().unwrap_or(0))
        .sum()
}

/// A tree lab of `topology` whose daemons let ranks, hosts and leaf switches join jobs by
/// themselves ([`xagg_lab::tree::TreeLab::start_joinable`]).
pub fn joinable_tree(prefix: &str, topology: xagg_lab::tree::Topology) -> xagg_lab::tree::TreeLab {
    let mut lab = xagg_lab::tree::TreeLab::create(prefix, topology).expect("the tree lab");
    lab.start_joinable().expect("joinable daemons");
    lab
}

/// A lab with host programs and a running daemon, removed on drop.
pub struct TestSwitch(LabSwitch);

impl Deref for TestSwitch {
    type Target = LabSwitch;
    fn deref(&self) -> &LabSwitch {
        &self.0
    }
}

impl DerefMut for TestSwitch {
    fn deref_mut(&mut self) -> &mut LabSwitch {
        &mut self.0
    }
}

impl TestSwitch {
    /// A lab of `workers` named after `prefix` (short: it names namespaces), with the
    /// host programs attached and the daemon started with its configuration changed by
    /// `tweak`.
    pub fn start(prefix: &str, workers: usize, tweak: impl FnOnce(&mut Config)) -> Self {
        Self::start_with_mtu(prefix, workers, xagg_lab::lab::MTU, tweak)
    }

    /// [`Self::start`] with every lab link at `mtu`.
    pub fn start_with_mtu(
        prefix: &str,
        workers: usize,
        mtu: usize,
        tweak: impl FnOnce(&mut Config),
    ) -> Self {
        let mut lab = Lab::with_mtu(prefix, workers, mtu).expect("creating the lab");
        lab.attach_hosts().expect("attaching host programs");
        let dir = std::env::temp_dir().join(format!("xagg-test-{prefix}"));
        let pin = std::path::PathBuf::from(format!("/sys/fs/bpf/xagg-test-{prefix}"));
        Self(LabSwitch::start(lab, dir, pin, tweak).expect("starting the lab's daemon"))
    }

    /// [`Self::start`] with the daemon's network listener at [`LISTEN`] and the admission
    /// credential [`CREDENTIAL`]: ranks join jobs by themselves (the MPI library, the
    /// Python module).
    pub fn joinable(prefix: &str, workers: usize) -> Self {
        Self::joinable_with_mtu(prefix, workers, xagg_lab::lab::MTU)
    }

    /// [`Self::joinable`] with every lab link at `mtu`.
    pub fn joinable_with_mtu(prefix: &str, workers: usize, mtu: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("xagg-test-{prefix}-credential"));
        Self::start_with_mtu(prefix, workers, mtu, |c| {
            xagg_lab::switch::joinable(c, &dir).expect("writing the credential's key")
        })
    }

    pub fn start_daemon(&mut self) {
        self.0.start_daemon().expect("starting xaggd");
    }

    /// Stops the daemon with `signal` and waits for it.
    pub fn stop_daemon(&mut self, signal: Signal) -> ExitStatus {
        self.0.stop_daemon(signal).expect("stopping xaggd")
    }

    pub fn api(&self, req: Request) -> Response {
        self.0.api(req).expect("daemon API")
    }

    pub fn counters(&self) -> BTreeMap<String, u64> {
        self.0.counters().expect("counters")
    }

    /// A sum/i32 job over the given workers (member i = worker `workers[i]`).
    pub fn add_job(&self, id: u32, segment: u16, slots: u32, workers: &[usize]) -> Response {
        self.add_job_on(id, segment, slots, workers, xagg_lab::lab::WORKER_PORT)
    }

    /// [`Self::add_job`] with the members' UDP port (a worker in several jobs uses one
    /// port per job).
    pub fn add_job_on(
        &self,
        id: u32,
        segment: u16,
        slots: u32,
        workers: &[usize],
        port: u16,
    ) -> Response {
        let spec = self
            .0
            .job_spec(id, Op::Sum, DType::I32, segment, slots, workers, port)
            .expect("the lab's members");
        self.0.add_job(spec).expect("daemon API")
    }

    /// Runs `run` on every listed worker at once and checks each result against the
    /// wrapping sum.
    pub fn allreduce(&self, run: &Allreduce) -> Vec<Report> {
        self.0.allreduce_with(run, |_| {})
    }
}

/// The first `n` i32 of a frame's payload.
pub fn payload_i32(frame: &[u8], n: usize) -> Vec<i32> {
    frame[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4 * n]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every rank's output, both streams in rank order, each rank's printed for the log; a rank
/// that failed fails the test, saying its stderr.
pub fn ranks_ok(outputs: &[std::process::Output]) -> String {
    let mut all = String::new();
    for (i, o) in outputs.iter().enumerate() {
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        eprintln!("rank {i} stdout:\n{out}\nrank {i} stderr:\n{err}");
        assert!(o.status.success(), "rank {i} failed: {:?}\n{err}", o.status);
        all.push_str(&out);
        all.push_str(&err);
    }
    all
}

/// The block of language `lang` in `docs/DOC` that contains `marker`, as printed there,
/// its shell line continuations joined: what a user copies.
pub fn doc_block(doc: &str, lang: &str, marker: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(doc);
    let text = std::fs::read_to_string(&path).expect("the docs");
    text.split(&format!("```{lang}\n"))
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .find(|b| b.contains(marker))
        .unwrap_or_else(|| panic!("no {lang} block with {marker:?} in {}", path.display()))
        .replace("\\\n", " ")
}
