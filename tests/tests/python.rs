//! The Python module in the netns lab, one process per worker namespace (installed by
//! `cargo xtask build` into `target/venv`, over Debian's Python with NumPy and PyTorch
//! 1.13): NumPy arrays of each type through the switch; a DDP model trained through the
//! `"xagg"` backend against the same script on Gloo (launched by torchrun, one node per
//! namespace), each bucket's allreduce checked against Gloo's; and the dataplane detached
//! in the middle of a DDP run, which the backend serves through Gloo without the replicas
//! diverging.

use std::{
    path::PathBuf,
    process::{Command, Output},
    time::Duration,
};

use xagg_tests::*;

const RANKS: usize = 3;

fn python() -> PathBuf {
    xagg_lab::python::interpreter()
}

pub(crate) fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(name)
}

fn ranks(
    sw: &TestSwitch,
    env: &[(&str, String)],
    args: impl Fn(usize) -> Vec<String>,
) -> Vec<Output> {
    xagg_lab::python::ranks(&sw.lab, RANKS, env, args).unwrap()
}

/// torchrun on every namespace: `ddp_check.py` with `args`.
fn torchrun(sw: &TestSwitch, env: &[(&str, String)], port: u16, args: &[&str]) -> Vec<Output> {
    xagg_lab::python::torchrun(&sw.lab, RANKS, port, env, &script("ddp_check.py"), args).unwrap()
}

/// `ddp_check.py` with `args` on every namespace, each rank started as torchrun starts it
/// (without its agents: the launch itself is [`torchrun`]'s test).
fn started(sw: &TestSwitch, env: &[(&str, String)], port: u16, args: &[&str]) -> Vec<Output> {
    xagg_lab::python::as_torchrun_starts(&sw.lab, RANKS, port, env, &script("ddp_check.py"), args)
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The number `name=` gives in a line `ddp_check.py` printed.
fn field(line: &str, name: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
        .parse()
        .unwrap()
}

/// The environment of ranks on hosts: each gets its host's daemon from the lab. Every
/// call through the switch (`XAGG_ROUTE=all`): what these tests check.
pub(crate) fn hosts_env() -> Vec<(&'static str, String)> {
    let mut e = xagg_lab::python::base_env();
    e.extend(credential_env());
    e.push(("XAGG_ROUTE", "all".into()));
    e
}

fn env() -> Vec<(&'static str, String)> {
    let mut e = hosts_env();
    e.push(("XAGG_DAEMON", LISTEN.to_string()));
    e
}

#[test]
fn numpy_arrays_through_the_switch() {
    if !require_root("numpy_arrays_through_the_switch") {
        return;
    }
    let sw = TestSwitch::joinable("xpy", RANKS);
    let (key, secret) = (
        "00112233445566778899aabbccddeeff".to_string(),
        "ab".repeat(32),
    );
    let mut e = env();
    e.push(("XAGG_JOB_KEY", key));
    e.push(("XAGG_JOB_SECRET", secret));
    let before = sw.counters();
    let out = ranks_ok(&ranks(&sw, &e, |_| {
        vec![script("check_module.py").display().to_string()]
    }));
    for r in 0..RANKS {
        assert!(
            out.contains(&format!("rank {r}: checks=43 failures=0")),
            "{out}"
        );
    }
    let after = sw.counters();
    assert!(
        after["complete"] - before.get("complete").copied().unwrap_or(0) > 1000,
        "{after:?}"
    );
}

/// The same on 2 hosts of 2 ranks (each rank a namespace behind its host) under a switch:
/// each rank told its host's daemon, its place on the host (as a launcher does) and the
/// coordinator; each host reduces its ranks first, and every check holds.
#[test]
fn numpy_arrays_through_hosts() {
    if !require_root("numpy_arrays_through_hosts") {
        return;
    }
    use xagg_lab::tree::Topology;
    let lab = joinable_tree("xpyh", Topology::Hosts { hosts: 2, ranks: 2 });
    let mut e = hosts_env();
    e.push(("XAGG_JOB_KEY", "0123456789abcdef0123456789abcdef".into()));
    e.push(("XAGG_JOB_SECRET", "cd".repeat(32)));
    let outputs = xagg_lab::python::tree_ranks(&lab, &e, |_| {
        vec![script("check_module.py").display().to_string()]
    })
    .unwrap();
    let out = ranks_ok(&outputs);
    for r in 0..lab.ranks.len() {
        assert!(out.contains(&format!("rank {r}: path tree")), "{out}");
        assert!(
            out.contains(&format!("rank {r}: checks=43 failures=0")),
            "{out}"
        );
    }
    let c = lab.counters();
    assert!(
        c[1]["partial"] > 100 && c[2]["partial"] > 100 && c[0]["complete"] > 100,
        "{c:?}"
    );
}

/// DDP through the backend on 2 hosts of 2 ranks, each host's ranks told their host's
/// daemon: the backend gathers every rank's daemon through its store, each host reduces
/// its ranks first, and every bucket's allreduce is checked against Gloo's.
#[test]
fn ddp_through_hosts() {
    if !require_root("ddp_through_hosts") {
        return;
    }
    use xagg_lab::tree::Topology;
    let lab = joinable_tree("xdph", Topology::Hosts { hosts: 2, ranks: 2 });
    let dir = std::env::temp_dir().join("xagg-test-xdph-out");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("xagg.pt");
    let e = hosts_env();
    let x = ranks_ok(
        &xagg_lab::python::tree_torchrun(
            &lab,
            29504,
            &e,
            &script("ddp_check.py"),
            &["xagg", "4", out.to_str().unwrap(), "compare"],
        )
        .unwrap(),
    );
    for r in 0..lab.ranks.len() {
        assert!(
            x.contains(&format!("rank {r}: steps=4 identical=True")),
            "{x}"
        );
    }
    assert!(
        x.contains("allreduces through the switch, 0 made by Gloo"),
        "{x}"
    );
    let line = x.lines().find(|l| l.contains("rank 0: steps=4")).unwrap();
    assert!(field(line, "worst") <= 1.0, "{line}");
    // DDP's opening broadcasts and the script's all-gathers through the levels.
    assert_eq!(entry_counts(&x, "broadcast"), [4, 0, 0, 0, 0, 0], "{x}");
    assert_eq!(entry_counts(&x, "all_gather"), [2, 0, 0, 0, 0, 0], "{x}");
    // The tensor forms and reduce, through the levels too.
    for entry in ["reduce_scatter_tensor", "all_gather_into_tensor", "reduce"] {
        assert_eq!(entry_counts(&x, entry), [1, 0, 0, 0, 0, 0], "{entry}: {x}");
    }
    for r in 0..4 {
        assert!(
            x.contains(&format!("rank {r}: tensor_forms_ok=True")),
            "{x}"
        );
    }
    let c = lab.counters();
    assert!(
        c[1]["partial"] > 0 && c[2]["partial"] > 0 && c[0]["complete"] > 0,
        "the hosts reduced their ranks first: {c:?}"
    );
}

#[test]
fn ddp_trains_through_the_backend_as_on_gloo() {
    if !require_root("ddp_trains_through_the_backend_as_on_gloo") {
        return;
    }
    let sw = TestSwitch::joinable("xdp", RANKS);
    let dir = std::env::temp_dir().join("xagg-test-xdp-out");
    std::fs::create_dir_all(&dir).unwrap();
    let (xagg, gloo) = (dir.join("xagg.pt"), dir.join("gloo.pt"));
    let before = sw.counters();
    let x = ranks_ok(&torchrun(
        &sw,
        &env(),
        29500,
        &["xagg", "8", xagg.to_str().unwrap(), "compare"],
    ));
    let after = sw.counters();
    let g = ranks_ok(&started(
        &sw,
        &env(),
        29501,
        &["gloo", "8", gloo.to_str().unwrap()],
    ));
    // Gloo as the backend, the gradients through the switch by the communication hook.
    let hooked = dir.join("hook.pt");
    let h = ranks_ok(&started(
        &sw,
        &env(),
        29503,
        &["gloo", "8", hooked.to_str().unwrap(), "hook"],
    ));
    assert!(
        h.contains("allreduces through the switch, 0 made by Gloo"),
        "{h}"
    );
    assert!(
        !h.contains("rank 0: 0 allreduces through the switch"),
        "{h}"
    );
    // The replicas agree on each backend; every bucket's allreduce through the switch is
    // within docs/types.md's bound of Gloo's.
    for r in 0..RANKS {
        assert!(
            x.contains(&format!("rank {r}: steps=8 identical=True")),
            "{x}"
        );
        assert!(
            g.contains(&format!("rank {r}: steps=8 identical=True")),
            "{g}"
        );
    }
    let line = x.lines().find(|l| l.contains("rank 0: steps=8")).unwrap();
    assert!(
        field(line, "buckets") > 8.0,
        "more than one bucket a step: {line}"
    );
    assert!(field(line, "worst") <= 1.0, "{line}");
    eprintln!("{line}");
    // Per entry point: every bucket's asynchronous all_reduce (the comparing hook), the
    // large one; the two blocking ones; no bucket by DDP's own path (the hook replaces it).
    let buckets = field(line, "buckets") as u64;
    assert_eq!(
        entry_counts(&x, "all_reduce async"),
        [buckets + 1, 0, 0, 0, 0, 0],
        "{x}"
    );
    assert_eq!(entry_counts(&x, "all_reduce"), [2, 0, 0, 0, 0, 0], "{x}");
    assert_eq!(
        entry_counts(&x, "DDP bucket (ProcessGroup.allreduce)"),
        [0; 6],
        "{x}"
    );
    let hooked_entry = entry_counts(&h, "DDP comm hook (xagg.torch.allreduce_hook)");
    assert!(hooked_entry[0] >= 8 && hooked_entry[1..] == [0; 5], "{h}");
    for r in 0..RANKS {
        assert!(
            x.contains(&format!("rank {r}: exactly_representable_equal=True")),
            "{x}"
        );
        assert!(
            x.contains(&format!("rank {r}: noncontiguous_ok=True")),
            "{x}"
        );
    }
    // The futures complete after the call returned, once the switch answered.
    for r in 0..RANKS {
        assert!(
            x.contains(&format!(
                "rank {r}: pending_after_submit=True done_after_wait=True result_ok=True"
            )),
            "{x}"
        );
    }
    assert!(after["complete"] - before.get("complete").copied().unwrap_or(0) > 100);
    assert!(
        x.contains("allreduces through the switch, 0 made by Gloo"),
        "{x}"
    );
    // The exact float lane: buckets pinned, the ranks' backward passes late in rank order
    // and then reversed, so their contributions meet in other orders; every bucket
    // through the switch both times, the final parameters the same bits.
    let mut exact = env();
    exact.push(("XAGG_FLOAT", "exact".into()));
    let runs: Vec<_> = [("late0", 29504), ("late1", 29505)]
        .into_iter()
        .map(|(mode, port)| {
            let file = dir.join(format!("{mode}.pt"));
            let o = ranks_ok(&started(
                &sw,
                &exact,
                port,
                &["xagg", "3", file.to_str().unwrap(), mode],
            ));
            assert!(
                o.contains("allreduces through the switch, 0 made by Gloo"),
                "{o}"
            );
            let buckets = entry_counts(&o, "DDP bucket (ProcessGroup.allreduce)");
            assert!(buckets[0] >= 3 && buckets[1..] == [0; 5], "{o}");
            file
        })
        .collect();
    let (largest, _) = difference(&runs[0], &runs[1]);
    assert_eq!(
        largest, 0.0,
        "the exact lane gave other bits in another order"
    );
    // The final parameters against Gloo's.
    for (run, file) in [("the backend", &xagg), ("the hook", &hooked)] {
        let (largest, scale) = difference(file, &gloo);
        eprintln!("final parameters through {run}: largest difference from Gloo's {largest:e}, largest parameter {scale}");
        assert!(
            largest <= 1e-5 * scale,
            "{run} drifted from Gloo: {largest} of {scale}"
        );
    }

    // The last rank ends at step 2, by `os._exit` and by an exception it does not catch:
    // the others' backward raises a RuntimeError naming it gone, within seconds. Before,
    // they died of SIGSEGV in backward (a Python exception in a future DDP's C++ waits
    // on), and the raising rank's exit waited 60 s for them first.
    for (mode, port, code) in [("die", 29508u16, 3), ("raise", 29509, 1)] {
        let out = dir.join(format!("{mode}.pt"));
        let outputs = started(
            &sw,
            &env(),
            port,
            &["xagg", "8", out.to_str().unwrap(), mode],
        );
        let last = &outputs[RANKS - 1];
        assert_eq!(last.status.code(), Some(code), "{mode}: {:?}", text(last));
        let others = ranks_ok(&outputs[..RANKS - 1]);
        for r in 0..RANKS - 1 {
            let line = others
                .lines()
                .find(|l| l.contains(&format!("rank {r}: backward raised after ")))
                .unwrap_or_else(|| panic!("{mode}, rank {r}: {others}"));
            let secs: f64 = line
                .split("after ")
                .nth(1)
                .and_then(|t| t.split(' ').next())
                .and_then(|t| t.parse().ok())
                .unwrap();
            assert!(
                line.contains("whose process is gone") && secs < 20.0,
                "{mode}: {line}"
            );
        }
        eprintln!("{mode}: the others' backward raised, naming the last rank gone");
    }
}

#[test]
fn ddp_survives_the_switch_going() {
    if !require_root("ddp_survives_the_switch_going") {
        return;
    }
    let sw = TestSwitch::joinable("xdf", RANKS);
    let out = std::env::temp_dir().join("xagg-test-xdf.pt");
    let mut e = env();
    e.push(("XAGG_GIVE_UP_MS", "2000".into()));
    let outputs = std::thread::scope(|s| {
        let run = s.spawn(|| {
            torchrun(
                &sw,
                &e,
                29502,
                &["xagg", "80", out.to_str().unwrap(), "slow"],
            )
        });
        let mut waited = Duration::ZERO;
        // Some steps through the switch first (a step's buckets are ~5000 segments).
        while sw.counters().get("complete").copied().unwrap_or(0) < 30_000 {
            std::thread::sleep(Duration::from_millis(100));
            waited += Duration::from_millis(100);
            assert!(
                waited < Duration::from_secs(60),
                "no allreduce at the switch"
            );
        }
        // The switch's answers cut off, the daemon reachable: the ranks move to Gloo and
        // leave the job then, not when the program ends.
        let (o, gone_before_end) = cut_all_then_time_the_jobs_left(&sw, RANKS, run);
        assert!(
            gone_before_end > Duration::from_secs(2),
            "the ranks left the job when they moved to Gloo: gone only {gone_before_end:?} before the program ended"
        );
        eprintln!("the job was gone {gone_before_end:?} before the program ended");
        o
    });
    let all = ranks_ok(&outputs);
    for r in 0..RANKS {
        assert!(
            all.contains(&format!("rank {r}: steps=80 identical=True")),
            "{all}"
        );
        // Made by Gloo, the switch having failed: Gloo 1.13 itself has no reduce-scatter
        // or all-gather into one tensor.
        assert!(
            all.contains(&format!("rank {r}: tensor_forms_ok=True")),
            "{all}"
        );
    }
    for entry in ["reduce_scatter_tensor", "all_gather_into_tensor", "reduce"] {
        assert_eq!(
            entry_counts(&all, entry),
            [0, 0, 0, 0, 1, 0],
            "{entry}: {all}"
        );
    }
    assert!(
        all.contains("the switch failed, collectives go to Gloo from now on"),
        "{all}"
    );
    let summary = all
        .lines()
        .find(|l| l.contains("rank 0: ") && l.contains("allreduces through the switch"))
        .unwrap();
    eprintln!("{summary}");
    let through: u32 = summary
        .split("rank 0: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(through >= 5, "{summary}");
    assert!(!summary.contains(" 0 made by Gloo"), "{summary}");
}

/// The largest difference between two saved parameter vectors, and the largest parameter.
fn difference(a: &std::path::Path, b: &std::path::Path) -> (f64, f64) {
    let cmp = Command::new(python())
        .args([
            "-c",
            "import sys, torch; a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2]); \
             print(float((a - b).abs().max()), float(b.abs().max()))",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let (out, err) = text(&cmp);
    let v: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert!(v.len() == 2, "{out} {err}");
    (v[0], v[1])
}

/// The backend's case table (docs/python.md), each run of `tests/python/cases.py` with
/// exact counts of how its all_reduce calls were made: a rank 3 s late is waited for and
/// named, no failure; a NaN makes every rank redo that call with Gloo; a rank whose
/// results are cut off finishes its calls from its peers (an all_reduce, then a reduce_scatter,
/// an all_gather and a broadcast), stalled for the give-up time; the
/// default route by size sends 4 KiB and 1 MiB to the switch, 4 MiB to Gloo.
#[test]
fn torch_calls_wait_redo_and_recover_as_the_case_table_says() {
    if !require_root("torch_calls_wait_redo_and_recover_as_the_case_table_says") {
        return;
    }
    let sw = TestSwitch::joinable("xpc", RANKS);
    let run = |port: u16, args: &[&str], env: &[(&str, String)]| {
        xagg_lab::python::as_torchrun_starts(&sw.lab, RANKS, port, env, &script("cases.py"), args)
            .unwrap()
    };
    let mut e = env();
    e.push(("XAGG_GIVE_UP_MS", "1000".into()));
    let ok = |all: &str, case: &str| {
        for r in 0..RANKS {
            assert!(all.contains(&format!("rank {r}: {case} ok=True")), "{all}");
        }
    };

    let all = ranks_ok(&run(29510, &["late"], &e));
    ok(&all, "late");
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [2, 0, 0, 0, 0, 0],
        "{all}"
    );
    assert!(all.contains("waits for members [0]"), "{all}");
    let waited = seconds_after(&all, "rank 1 waited ");
    assert!(waited > 2.0, "rank 1 waited {waited} s");

    let all = ranks_ok(&run(29511, &["nan"], &e));
    ok(&all, "nan");
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [1, 0, 0, 1, 0, 0],
        "{all}"
    );

    let go = std::env::temp_dir().join("xagg-test-xpc-go");
    let outputs =
        cut_rank0_after_first(&sw, &go, || run(29512, &["cut", go.to_str().unwrap()], &e));
    let all = ranks_ok(&outputs);
    ok(&all, "cut");
    stalled_for_the_give_up_time(&all, 1.0);
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [1, 1, 0, 0, 0, 0],
        "{all}"
    );
    for entry in ["reduce_scatter", "all_gather", "broadcast"] {
        assert_eq!(
            entry_counts(&all, entry),
            [0, 1, 0, 0, 0, 0],
            "{entry}: {all}"
        );
    }

    // The switch answering but taking no contribution (every one dropped there, as a path
    // that lost them all would): no rank holds the next round, every rank finds so, and
    // the calls are Gloo's from then on, on every rank (before: every rank's call raised).
    let inject = |drop_contribution| {
        matches!(
            sw.api(xagg_api::Request::Inject {
                drop_contribution,
                drop_result: 0.0
            }),
            xagg_api::Response::Ok
        )
    };
    let outputs = after_first(
        &sw,
        &go,
        || inject(1.0),
        || run(29523, &["nocontrib", go.to_str().unwrap()], &e),
    );
    assert!(inject(0.0));
    let all = ranks_ok(&outputs);
    ok(&all, "nocontrib");
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [1, 0, 0, 0, 3, 0],
        "{all}"
    );
    assert!(
        all.contains("the switch failed, collectives go to Gloo from now on"),
        "{all}"
    );

    // The last rank's process gone without a word: the others' next call fails about a
    // second after it stalled, naming it, with the default give-up time (10 s), which they
    // no longer wait out for it (before: at the give-up time; before that, until the daemon
    // dropped it at its lease, about 50 s, told only "still waiting ... 1800 s").
    let defaults: Vec<_> = e
        .iter()
        .filter(|(k, _)| *k != "XAGG_GIVE_UP_MS")
        .cloned()
        .collect();
    let all = ranks_ok(&run(29521, &["dies"], &defaults));
    ok(&all, "dies");
    for r in 0..RANKS - 1 {
        let waited = seconds_after(&all, &format!("rank {r}: failed after "));
        assert!(waited < 3.0, "rank {r} failed after {waited} s: {all}");
    }

    // The group's own timeout (init_process_group's `timeout`, 5 s), not XAGG_TIMEOUT_S's
    // 30 minutes, bounds the wait for a rank 12 s late (before: the others waited for it).
    let all = ranks_ok(&run(29522, &["timeout"], &defaults));
    ok(&all, "timeout");
    for r in 1..RANKS {
        let waited = seconds_after(&all, &format!("rank {r}: failed after "));
        assert!(
            (4.0..10.0).contains(&waited),
            "rank {r} failed after {waited} s: {all}"
        );
    }

    // A future's callback that makes and waits for another all_reduce, and PowerSGD's DDP
    // hook, whose callbacks do: each hung while futures completed on the thread that waits
    // for the switch (cases.py ends a hung run after 120 s).
    // Then calls waited for at once behind three in flight, and with none in flight
    // (those on the caller's thread, which the case counts).
    let all = ranks_ok(&run(29514, &["callback"], &e));
    ok(&all, "callback");
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [7, 0, 0, 0, 0, 0],
        "{all}"
    );
    assert_eq!(
        entry_counts(&all, "all_reduce async"),
        [4, 0, 0, 0, 0, 0],
        "{all}"
    );
    for entry in ["all_gather", "broadcast"] {
        assert_eq!(entry_counts(&all, entry), [1, 0, 0, 0, 0, 0], "{all}");
    }
    // The default group made again after destroy_process_group: its summary names the
    // rank alone, as the first group's did (before: "group 1, rank 0").
    for r in 0..RANKS {
        assert!(all.contains(&format!("rank {r}: again ok=True")), "{all}");
    }
    assert_eq!(
        all.matches("xagg: rank 0: all_reduce: ").count(),
        2,
        "{all}"
    );
    assert!(!all.contains("group 1, rank"), "{all}");
    // Two plain steps (a bucket each), then two of PowerSGD (three allreduces each).
    let all = ranks_ok(&run(29515, &["powersgd"], &e));
    ok(&all, "powersgd");
    assert_eq!(
        entry_counts(&all, "all_reduce async"),
        [8, 0, 0, 0, 0, 0],
        "{all}"
    );
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [3, 0, 0, 0, 0, 0],
        "{all}"
    );

    // A last all_reduce that fails and that the program never waits for: said at exit by
    // every rank it failed on (ranks 1.. waited 2 s for rank 0, which came 6 s late and found
    // their contributions at the switch: its call completed), not lost.
    let mut short = e.clone();
    short.push(("XAGG_TIMEOUT_S", "2".into()));
    // Raised by destroy_process_group where the program calls it; said at exit where it
    // does not.
    // The failure reaches every rank for the same call: ranks 1-3 give up on their
    // rounds at the switch at their timeout, so rank 0's late contribution completes a
    // round marked so, and its call fails too (before, it succeeded alone).
    let all = ranks_ok(&run(29517, &["unwaited"], &short));
    ok(&all, "unwaited");
    for r in 1..RANKS {
        assert!(
            all.contains(&format!(
                "rank {r}: destroy_process_group raised XaggError: rank {r}: an allreduce failed and no call of the program raised it"
            )),
            "{all}"
        );
    }
    assert!(
        all.contains("rank 0: destroy_process_group raised XaggError: rank 0: an allreduce failed and no call of the program raised it")
            && all.contains("other members gave up on it"),
        "{all}"
    );
    // Rank 0's summary counts the failed call (in no way's column).
    assert!(
        all.lines().any(|l| l.contains("rank 0: ")
            && l.contains("allreduces through the switch")
            && l.ends_with("; 1 call failed (raised to the program, or said at exit)")),
        "{all}"
    );
    // And says why the first one failed.
    assert!(
        all.lines().any(
            |l| l.contains("rank 0: the first call that failed: XaggError: ")
                && l.contains("other members gave up on it")
        ),
        "{all}"
    );
    let all = ranks_ok(&run(29518, &["unwaited", "exit"], &short));
    ok(&all, "unwaited");
    assert!(!all.contains("destroy_process_group raised"), "{all}");
    // The call finished at exit, after the interpreter stopped its thread pools: no
    // thread of the backend's raised (seen: "cannot schedule new futures after
    // interpreter shutdown" from the completion thread).
    assert!(!all.contains("Exception in thread"), "{all}");
    for r in 0..RANKS {
        assert!(
            all.contains(&format!(
                "rank {r}: an allreduce failed and no call of the program raised it"
            )),
            "{all}"
        );
    }

    // bf16 through the switch, AVG of f32 there and of int16 by Gloo (sum, then floored),
    // the reason said once and counted; then the types Gloo 1.13 refuses, passed to it and
    // made all the same (each raised "Invalid scalar type" before), gathers of them through
    // the switch as words, and a product of floats whose reason names the op.
    // Then calls that raise for their arguments (a root not a rank: before, the group
    // failed for good) and an async all_reduce's result() (before: "not implemented").
    let all = ranks_ok(&run(29516, &["types"], &e));
    ok(&all, "types");
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [3, 0, 0, 0, 0, 4],
        "{all}"
    );
    assert_eq!(
        entry_counts(&all, "all_reduce async"),
        [1, 0, 0, 0, 0, 0],
        "{all}"
    );
    for entry in ["reduce_scatter", "broadcast", "all_reduce_coalesced"] {
        assert_eq!(
            entry_counts(&all, entry),
            [0, 0, 0, 0, 0, 1],
            "{entry}: {all}"
        );
    }
    // Gathers move bytes: int16 and bool ones of an even number of bytes take the switch
    // (and one of several tensors goes to Gloo as it is).
    assert_eq!(
        entry_counts(&all, "all_gather"),
        [2, 0, 0, 0, 0, 1],
        "{all}"
    );
    assert!(
        !all.contains("torch.int16 is not a type the switch moves"),
        "{all}"
    );
    for reason in [
        "3 (torch.int16 is not a type the switch reduces)",
        "1 (torch.bool is not a type the switch reduces)",
        "1 (torch.bool: the switch moves a type it does not reduce as 2-byte words",
        "1 (PRODUCT over torch.float32 is not an op the switch makes)",
        "2 (several tensors in one call)",
        "1 (not a collective the switch makes)",
    ] {
        assert!(
            all.contains(&format!("rank 0: passed to Gloo: {reason}")),
            "{reason}: {all}"
        );
    }

    // XAGG_FLOAT=none: the float sums by Gloo (bf16 and AVG as the switch would make
    // them), the int16 mean passed as before.
    let mut floats_to_gloo = e.clone();
    floats_to_gloo.push(("XAGG_FLOAT", "none".into()));
    let all = ranks_ok(&run(29519, &["types"], &floats_to_gloo));
    ok(&all, "types");
    // The case's first all_reduce, of ints, takes the switch.
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [1, 0, 0, 0, 0, 6],
        "{all}"
    );
    assert!(
        all.contains(
            "rank 0: passed to Gloo: 2 (float sums go to Gloo (rank 0's XAGG_FLOAT=none))"
        ),
        "{all}"
    );

    let mut default_route = e.clone();
    default_route.retain(|(k, _)| *k != "XAGG_ROUTE");
    let all = ranks_ok(&run(29513, &["sizes"], &default_route));
    ok(&all, "sizes");
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [4, 0, 2, 0, 0, 0],
        "{all}"
    );
    // The tensor forms of reduce-scatter and all-gather, and reduce, through the switch
    // (before, the first two raised: delegated to Gloo 1.13, which has neither); the
    // second all-gather in place, its input in another rank's block (before, that block's
    // bytes were overwritten by the others' while it was sent: wrong results).
    for (entry, calls) in [
        ("reduce_scatter_tensor", 1),
        ("all_gather_into_tensor", 2),
        ("reduce", 1),
    ] {
        assert_eq!(
            entry_counts(&all, entry),
            [calls, 0, 0, 0, 0, 0],
            "{entry}: {all}"
        );
    }
    // Each collective by its own route (3 ranks): a 4 KiB broadcast through the switch, a
    // 64 KiB one by Gloo.
    assert_eq!(entry_counts(&all, "broadcast"), [1, 0, 1, 0, 0, 0], "{all}");
    assert!(
        all.contains("; 5 other collectives through the switch"),
        "{all}"
    );

    // No daemon at the address the ranks name: every call made by Gloo, exact, and counted
    // as passed with why (as the MPI library counts a communicator Open MPI serves), not as
    // a fallback from a switch that served the group.
    let mut nobody = e.clone();
    nobody.retain(|(k, _)| *k != "XAGG_DAEMON");
    nobody.push(("XAGG_DAEMON", format!("{}:1", LISTEN.ip())));
    let all = ranks_ok(&run(29520, &["sizes"], &nobody));
    ok(&all, "sizes");
    assert_eq!(
        entry_counts(&all, "all_reduce"),
        [0, 0, 0, 0, 0, 6],
        "{all}"
    );
    for (entry, calls) in [
        ("reduce_scatter_tensor", 1),
        ("all_gather_into_tensor", 2),
        ("reduce", 1),
        ("broadcast", 2),
    ] {
        assert_eq!(
            entry_counts(&all, entry),
            [0, 0, 0, 0, 0, calls],
            "{entry}: {all}"
        );
    }
    assert!(
        all.contains("rank 0: passed to Gloo: 12 (the group is served by Gloo: "),
        "{all}"
    );
}

/// A ZeRO-style step through the backend — each rank's gradients reduce-scattered, each
/// rank updating its shard of the parameters, the shards all-gathered, rank 0's initial
/// parameters broadcast — on 4 ranks, against the same model trained with DDP on the
/// backend: in the exact float mode the parameters agree bit for bit, on every rank, and
/// every reduce-scatter, all-gather and broadcast went through the switch.
#[test]
fn a_zero_step_through_the_switch_trains_as_ddp_does() {
    if !require_root("a_zero_step_through_the_switch_trains_as_ddp_does") {
        return;
    }
    const N: usize = 4;
    const STEPS: &str = "6";
    let sw = TestSwitch::joinable("xzr", N);
    let mut env = env();
    env.push(("XAGG_FLOAT", "exact".into()));
    let script = script("zero_check.py");
    let run = |port: u16, mode: &str| {
        ranks_ok(
            &xagg_lab::python::as_torchrun_starts(
                &sw.lab,
                N,
                port,
                &env,
                &script,
                &["xagg", mode, STEPS],
            )
            .unwrap(),
        )
    };
    let before = sw.counters();
    let zero = run(29520, "zero");
    let after = sw.counters();
    let ddp = run(29521, "ddp");
    let params = |out: &str, r: usize| -> String {
        // torchrun prefixes each line with its local rank (`[default0]:`).
        let line = out
            .lines()
            .find(|l| l.contains(&format!("rank {r}: steps={STEPS} params=")))
            .unwrap_or_else(|| panic!("rank {r} printed no parameters:\n{out}"));
        line.rsplit('=').next().unwrap().to_string()
    };
    let want = params(&ddp, 0);
    for r in 0..N {
        assert_eq!(params(&ddp, r), want, "DDP's replicas differ:\n{ddp}");
        assert_eq!(
            params(&zero, r),
            want,
            "rank {r}'s ZeRO parameters differ from DDP's:\n{zero}\n{ddp}"
        );
    }
    // Every call of the ZeRO run by the switch: 6 reduce-scatters and all-gathers, a
    // broadcast per parameter tensor (4), none passed on, none made by Gloo.
    assert_eq!(
        entry_counts(&zero, "reduce_scatter"),
        [6, 0, 0, 0, 0, 0],
        "{zero}"
    );
    assert_eq!(
        entry_counts(&zero, "all_gather"),
        [6, 0, 0, 0, 0, 0],
        "{zero}"
    );
    assert_eq!(
        entry_counts(&zero, "broadcast"),
        [4, 0, 0, 0, 0, 0],
        "{zero}"
    );
    assert!(
        after["complete"] > before["complete"],
        "the switch completed no round"
    );
}
