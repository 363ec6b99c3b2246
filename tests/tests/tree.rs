//! Aggregation trees end to end: hosts reduce their ranks (namespaces behind the host,
//! like containers) and send one partial per segment to the switch, which delivers the
//! result back down; a spine over leaf switches does the same one level higher. Every
//! result is checked against the sum over all ranks, every link's bytes against S.

use std::{collections::BTreeMap, time::Duration};

use xagg_api::Request;
use xagg_lab::tree::{Topology, TreeLab};
use xagg_tests::*;

const JOB: u32 = 1;
const SLOTS: usize = 16;
/// What a tree's uplink carries each way, over S.
const TREE_LINK: (f64, f64) = (1.0, 1.05);

fn lab(prefix: &str, topology: Topology, segment: usize) -> TreeLab {
    let mut lab = TreeLab::create(prefix, topology).expect("the tree lab");
    lab.start_daemons().expect("a daemon per aggregation point");
    lab.add_job(JOB, segment as u16, SLOTS as u32)
        .expect("the job at every point");
    lab
}

/// Runs allreduces of `sizes` elements (messages from `first`), each exact on every rank.
fn exact(lab: &TreeLab, first: u32, sizes: &[usize]) {
    for (m, &elems) in sizes.iter().enumerate() {
        lab.allreduce(first + m as u32, elems, 7 + m as u64, |_| {})
            .unwrap_or_else(|e| {
                panic!(
                    "{:?}, {elems} elements: {e:#}; counters {:?}",
                    lab.topology,
                    lab.counters()
                )
            });
    }
}

/// One allreduce of `elems` i32 (S = 4·elems bytes) and the bytes each link carried, each
/// way, over S: a rank's link S to 1.05·S each way, a point's uplink `uplink` (a tree:
/// S to 1.05·S; a ring: 2(h-1)/h·S ± 5 %).
fn bytes_per_link(lab: &TreeLab, message: u32, elems: usize, uplink: (f64, f64)) {
    let before = lab.link_bytes().unwrap();
    exact(lab, message, &[elems]);
    let after = lab.link_bytes().unwrap();
    let s = (elems * 4) as f64;
    for ((name, tx0, rx0), (_, tx1, rx1)) in before.iter().zip(&after) {
        let (up, down) = ((tx1 - tx0) as f64 / s, (rx1 - rx0) as f64 / s);
        eprintln!("{name}: up {up:.3}·S, down {down:.3}·S");
        let (lo, hi) = if name.starts_with("rank") {
            (1.0, 1.05)
        } else {
            uplink
        };
        assert!(
            (lo..=hi).contains(&up) && (lo..=hi).contains(&down),
            "{name}: up {up:.3}·S, down {down:.3}·S (each way must be within {lo:.3}..={hi:.3}·S)"
        );
    }
}

fn sum(counters: &[BTreeMap<String, u64>], points: &[usize], name: &str) -> u64 {
    points.iter().map(|&i| counters[i][name]).sum()
}

/// Each point's counters counted since `before`: what one phase of a shared lab did.
fn since(
    before: &[BTreeMap<String, u64>],
    after: &[BTreeMap<String, u64>],
) -> Vec<BTreeMap<String, u64>> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            a.iter()
                .map(|(k, v)| (k.clone(), v - b.get(k).copied().unwrap_or(0)))
                .collect()
        })
        .collect()
}

/// No point refused or failed to send a packet. Drops that follow from a rank's
/// retransmission (a duplicate, a stale round, a result that came twice) are the
/// protocol at work, not refusals: a loaded 2-core VM makes a few.
fn no_refusals(c: &[BTreeMap<String, u64>]) {
    const RETRANSMISSION: [&str; 3] = ["drop_duplicate", "drop_stale", "drop_unawaited_result"];
    for (i, p) in c.iter().enumerate() {
        for (k, v) in p {
            if (k.starts_with("drop_") && !RETRANSMISSION.contains(&k.as_str()))
                || k == "redirect_error"
            {
                assert_eq!(*v, 0, "point {i}: {k}: {p:?}");
            }
        }
    }
}

/// Every point below the root sent each segment's partial once and delivered its parent's
/// result once; the root completed each segment once; nothing was dropped.
fn clean_counters(lab: &TreeLab) {
    let c = lab.counters();
    let inner: Vec<usize> = (1..lab.points.len()).collect();
    no_refusals(&c);
    let segments = c[0]["complete"];
    assert!(segments > 0);
    for &i in &inner {
        assert_eq!(c[i]["partial"], c[i]["parent_result"], "point {i}");
        assert_eq!(
            c[i]["complete"], 0,
            "point {i} never completes a result itself"
        );
    }
    // Each point sends one partial per segment: every point of a level as many as the root.
    assert_eq!(sum(&c, &inner, "partial"), segments * inner.len() as u64);
}

/// 2 hosts of 2 ranks under one switch, 860-element segments: the same lab serves
/// [`hosts_under_a_switch`] and then [`loss_at_every_level`] (a lab's set-up is mostly
/// its daemons' start: each test its own lab costs minutes of the suite).
#[test]
fn two_hosts_of_two_ranks() {
    if !require_root("two_hosts_of_two_ranks") {
        return;
    }
    let lab = lab("th", Topology::Hosts { hosts: 2, ranks: 2 }, 860);
    hosts_under_a_switch(&lab);
    loss_at_every_level(&lab, 100);
    let c = collectives_through_levels(&lab, 300, 860);
    // The switch completed each segment once, each host sent its partial of each once.
    assert_eq!(c.switch, c.segments);
    assert_eq!(c.partial, 2 * c.segments);
    collective_bytes_per_link(&lab, 350, 860);
    collectives_under_loss(&lab, 360, 860);
    a_collective_behind_hosts_recovers_from_peers(&lab, 400, 860);
    a_rank_that_will_not_come_behind_hosts(&lab, 410);
}

/// A rank that will not come, behind host levels (the last of a lab: the rounds it
/// leaves are stuck), give-up time 1 s: first its call does not match (the last rank
/// makes a max where the others sum, 300 ms after them: its host refuses it, and it fails
/// at its give-up time), then its process is gone (its worker dropped: its responder
/// refuses connections). Its host's other rank, which the host waits for it, and the
/// other host's ranks, which the switch keeps waiting for its host, ask the responders of
/// the ranks they wait for, and fail naming it (or its host's other rank, failed for it)
/// and why — before, they waited for their collective timeout (or the lease of a rank
/// that joined through a daemon).
fn a_rank_that_will_not_come_behind_hosts(lab: &TreeLab, message: u32) {
    for (message, gone) in [(message, false), (message + 10, true)] {
        will_not_come(lab, message, gone);
        // Every rank's worker dropped, its address is free at once (its responder, which
        // may have been polling its sockets, let go first), for the next phase to bind.
        for r in &lab.ranks {
            std::thread::scope(|sc| {
                sc.spawn(|| {
                    xagg_linux::iface::enter_netns(&r.ns).unwrap();
                    if let Err(e) = std::net::UdpSocket::bind((r.ip, xagg_lab::lab::WORKER_PORT)) {
                        panic!("{}: still bound after its worker was dropped: {e}", r.ns);
                    }
                });
            });
        }
    }
}

fn will_not_come(lab: &TreeLab, message: u32, gone: bool) {
    use std::{sync::Barrier, time::Instant};
    use xagg_worker::{AllreduceError, Buffer};
    let n = lab.ranks.len();
    let odd = n - 1;
    let secret = xagg_worker::Secret([10; 32]);
    let addresses = std::sync::Mutex::new(vec![None; n]);
    let barrier = Barrier::new(n);
    let ended = lab
        .on_every_rank(
            message,
            |_, p| {
                p.give_up = Duration::from_secs(1);
                p.collective_timeout = Duration::from_secs(30);
            },
            |g, wk| {
                if g == odd && gone {
                    // Gone as the others see it: it sends nothing, and nothing listens at
                    // its responder's address (port 1 of its own).
                    let closed = std::net::SocketAddrV4::new(lab.ranks[g].ip, 1);
                    addresses.lock().unwrap()[g] = Some(closed);
                    for _ in 0..3 {
                        barrier.wait();
                    }
                    return Ok(None);
                }
                serve_peers(wk, g, &secret, &addresses, &barrier)?;
                barrier.wait();
                let op = match g == odd {
                    true => {
                        std::thread::sleep(Duration::from_millis(300));
                        xagg_common::Op::Max
                    }
                    false => xagg_common::Op::Sum,
                };
                let t = Instant::now();
                let c = wk.submit(op, Buffer::from(vec![g as i32; 2 * 860]))?.wait();
                let took = t.elapsed();
                // Every responder kept until every rank is done.
                barrier.wait();
                match c.status {
                    Ok(_) => anyhow::bail!("rank {g}: the call succeeded"),
                    Err(e) => Ok(Some((e, took))),
                }
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}; counters {:?}", lab.counters()));
    let why_odd = if gone {
        "whose process is gone"
    } else {
        "the round began with another op"
    };
    for (g, (e, took)) in ended
        .iter()
        .enumerate()
        .filter_map(|(g, e)| Some((g, e.as_ref()?)))
    {
        eprintln!("rank {odd} gone {gone}, rank {g} after {took:?}: {e}");
        let why = e.to_string();
        assert!(why.contains(why_odd), "rank {g}: {why}");
        if g != odd {
            assert!(
                matches!(e, AllreduceError::MemberFailed { rank, .. } if *rank == odd || *rank == odd - 1)
                    || matches!(e, AllreduceError::MemberGone { rank, .. } if *rank == odd),
                "rank {g}: {why}"
            );
        }
        assert!(!e.recoverable(), "rank {g}: {why}");
        assert!(took.as_secs_f64() < 6.0, "rank {g} failed after {took:?}");
    }
}

/// A reduce-scatter and an all-gather of S = 8 MB (n blocks) through 2 hosts of 2 ranks,
/// each link's bytes each way over S against the collective's own (docs/protocol.md, "The
/// collectives"): a reduce-scatter's rank sends S and gets its block (S/4), its host sends
/// S up and gets its ranks' blocks (S/2); an all-gather's rank sends its block and room
/// for its host's other rank's (S/2) and gets the other blocks (3S/4), its host sends its
/// ranks' blocks up once (S/2) and gets every block (S). Headers add at most 0.05·S: a
/// link carries at most two frames per segment each way (a gather's data sent pending and
/// its completion), 80 bytes of headers each per 3,440 of payload; replays of late rounds
/// a little more (a tenth allowed where that is more).
fn collective_bytes_per_link(lab: &TreeLab, first: u32, segment: usize) {
    use xagg_worker::Collective as C;
    let n = lab.ranks.len();
    // Large enough that the rounds re-sent while the ranks start their calls at different
    // times (a window's) are a small part.
    let elems = 2_000_000;
    let s = (elems * 4) as f64;
    for (k, (c, rank, host)) in [
        (C::ReduceScatter, (1.0, 0.25), (1.0, 0.5)),
        (C::AllGather, (0.5, 0.75), (0.5, 1.0)),
    ]
    .into_iter()
    .enumerate()
    {
        let before = lab.link_bytes().unwrap();
        let counted = lab.counters();
        lab.collectives(first + k as u32, &[(c, 0, elems / n * n, 61)])
            .unwrap_or_else(|e| panic!("{c}: {e:#}"));
        let after = lab.link_bytes().unwrap();
        let counted = since(&counted, &lab.counters());
        for (i, p) in counted.iter().enumerate() {
            let p: BTreeMap<_, _> = p.iter().filter(|(_, v)| **v != 0).collect();
            eprintln!("{c}: point {i}: {p:?}");
        }
        // A frame a point counted as sent again (a partial re-sent, a late round's result
        // replayed) carries at most a segment and its headers.
        let frame = (segment * 4 + 80) as f64 / s;
        let again = |point: usize, what: &str| {
            counted[point].get(what).copied().unwrap_or(0) as f64 * frame
        };
        for ((name, tx0, rx0), (_, tx1, rx1)) in before.iter().zip(&after) {
            let (up, down) = ((tx1 - tx0) as f64 / s, (rx1 - rx0) as f64 / s);
            eprintln!("{c}: {name}: up {up:.3}·S, down {down:.3}·S");
            // "rank r -> point p" or "point i -> point p": the lower end's point, if a
            // point, re-sends partials up; the upper end's replays come down.
            let ends: Vec<usize> = name
                .split(" -> ")
                .map(|e| e.rsplit(' ').next().unwrap().parse().unwrap())
                .collect();
            let (want, resent_up) = match name.starts_with("rank") {
                true => (rank, 0.0),
                false => (host, again(ends[0], "partial_resend")),
            };
            let resent_down = again(ends[1], "result_replay");
            for (got, want, way, resent) in [
                (up, want.0, "up", resent_up),
                (down, want.1, "down", resent_down),
            ] {
                // Headers, and the replays of a rank late by more than its retransmission
                // timeout (on this VM, four ranks and two daemons share two CPUs: seen 0.056·S
                // over on a link): a tenth, as collectives.rs allows a flat job's ranks; and
                // every frame the link's points counted as sent again (seen 0.551·S up from
                // a host that re-sent 65 partials).
                let over = f64::max(0.05, want / 10.0) + resent;
                assert!(
                    (want..=want + over).contains(&got),
                    "{c}: {name}: {way} {got:.3}·S, not {want}·S to {over:.3}·S more"
                );
            }
        }
    }
}

/// Every collective through both levels with contributions and result copies dropped at
/// 1, 5 and 20 % at the switch and at both hosts: exact on every rank, recovered by the
/// ranks' retransmissions through the host (partials re-sent, the switch's replays).
fn collectives_under_loss(lab: &TreeLab, first: u32, segment: usize) {
    use xagg_worker::Collective as C;
    let n = lab.ranks.len();
    let before = lab.counters();
    for (k, p) in [0.01, 0.05, 0.2].into_iter().enumerate() {
        for l in [0, 1] {
            lab.inject(l, p, p).unwrap();
        }
        let elems = 8 * segment * n;
        let calls: Vec<_> = [
            (C::ReduceScatter, 0),
            (C::AllGather, 0),
            (C::Broadcast, n - 1),
            (C::Reduce, 1),
        ]
        .into_iter()
        .map(|(c, root)| (c, root, elems, 70 + k as u64))
        .collect();
        let done = lab.collectives(first + 4 * k as u32, &calls);
        for l in [0, 1] {
            lab.inject(l, 0.0, 0.0).unwrap();
        }
        done.unwrap_or_else(|e| panic!("at {p}: {e:#}; counters {:?}", lab.counters()));
    }
    let c = since(&before, &lab.counters());
    eprintln!("collectives under loss: switch {:?}", c[0]);
    no_refusals(&c);
    assert!(sum(&c, &[1, 2], "partial_resend") > 0, "partials re-sent");
    assert!(
        c[0]["result_replay"] > 0,
        "the switch answered a host's resend"
    );
}

/// A rank whose results are cut off (nftables in its namespace: nothing from its host)
/// in the middle of a reduce-scatter through the hosts finishes it from its peers: every
/// segment of its own block (the ranks' places known, the blocks are the ranks'; else every
/// segment of the whole message, made as an allreduce) from the ranks that hold it; the
/// other ranks' calls done by the switch. One window's segments (the others hold their
/// results until later rounds take the slots).
fn a_collective_behind_hosts_recovers_from_peers(lab: &TreeLab, message: u32, segment: usize) {
    use std::sync::{
        atomic::{AtomicBool, Ordering},
        Barrier, Mutex,
    };
    use xagg_worker::{data::CollectiveCase, Buffer, Collective};
    let n = lab.ranks.len();
    let cut = n - 1;
    let elems = SLOTS * segment * 7 / 8 / n * n;
    let secret = xagg_worker::Secret([9; 32]);
    let addresses = Mutex::new(vec![None; n]);
    let barrier = Barrier::new(n);
    let cut_off = AtomicBool::new(false);
    let ns = &lab.ranks[cut].ns;
    let host = lab.points[lab.ranks[cut].host].ip;
    let outcomes = lab
        .on_every_rank(
            message,
            |g, p| {
                // A failure here ends the test instead of leaving the ranks waiting.
                p.collective_timeout = Duration::from_secs(30);
                if g == cut {
                    p.give_up = Duration::from_secs(1);
                }
            },
            |g, wk| {
                // The job's state learnt before the cut (its replies come from the host).
                serve_peers(wk, g, &secret, &addresses, &barrier)?;
                if g == cut {
                    let rule = format!(
                        "table inet xagg_cut {{\n chain input {{\n type filter hook input priority 0;\n ip saddr {host} meta l4proto udp drop\n }}\n}}\n"
                    );
                    cut_off.store(nft(ns, &rule), Ordering::SeqCst);
                }
                // Every rank past the cut before any calls (a rank failing alone would
                // leave the others waiting for it).
                barrier.wait();
                anyhow::ensure!(cut_off.load(Ordering::SeqCst), "nft (nftables) took no rule");
                let case = CollectiveCase::new(Collective::ReduceScatter, 0, g, n, elems, 51);
                let mut c = wk
                    .submit_collective(
                        Collective::ReduceScatter,
                        xagg_common::Op::Sum,
                        0,
                        case.input.map(Buffer::from),
                        Buffer::from(case.output),
                    )?
                    .wait();
                let tried = wk.recover(&mut c);
                // Every worker (and its responder) kept until every rank is done.
                barrier.wait();
                let report = c.status?;
                let got: Vec<i32> = c.buffer.into_vec().expect("i32");
                anyhow::ensure!(got == case.expected, "rank {g}'s block is not the sum's");
                Ok((tried, report.recovered))
            },
        )
        .unwrap_or_else(|e| panic!("{e:#}; counters {:?}", lab.counters()));
    assert!(nft(ns, "delete table inet xagg_cut\n"));
    let segments = if lab.places().is_some() {
        (elems / n).div_ceil(segment)
    } else {
        elems.div_ceil(segment)
    };
    for (g, &(tried, recovered)) in outcomes.iter().enumerate() {
        if g == cut {
            assert_eq!((tried, recovered), (true, segments), "rank {g}");
        } else {
            assert_eq!((tried, recovered), (false, 0), "rank {g}");
        }
    }
}

/// What [`collectives_through_levels`] counted: the segments of its calls' messages, and
/// the points' `complete` at the top and `partial` below it (a ring: `complete` at the
/// hosts) over them.
struct LevelCounts {
    segments: u64,
    switch: u64,
    complete: u64,
    partial: u64,
}

/// Reduce-scatter, all-gather, broadcast (root: the last rank, on the last host) and
/// reduce (root 1) through a tree's levels, each at its own bytes, or a ring's, made as
/// allreduces of the whole message (messages from `first`): one element per block and many
/// segments (`segment` elements each), every rank's result exact.
fn collectives_through_levels(lab: &TreeLab, first: u32, segment: usize) -> LevelCounts {
    use xagg_worker::Collective as C;
    let n = lab.ranks.len();
    let before = lab.counters();
    let mut calls = Vec::new();
    for (k, elems) in [n, 3000 * n].into_iter().enumerate() {
        for (c, root) in [
            (C::ReduceScatter, 0),
            (C::AllGather, 0),
            (C::Broadcast, n - 1),
            (C::Reduce, 1),
        ] {
            calls.push((c, root, elems, 40 + k as u64));
        }
    }
    lab.collectives(first, &calls)
        .unwrap_or_else(|e| panic!("{e:#}; counters {:?}", lab.counters()));
    let c = since(&before, &lab.counters());
    no_refusals(&c);
    let inner = 1..c.len();
    LevelCounts {
        // With the ranks' places, a reduce-scatter's or all-gather's blocks take segments
        // of their own (a call of one segment is made as an allreduce).
        segments: calls
            .iter()
            .map(|&(c, _, elems, _)| {
                let blocks = matches!(c, C::ReduceScatter | C::AllGather) && elems > segment;
                if blocks && lab.places().is_some() {
                    (n * (elems / n).div_ceil(segment)) as u64
                } else {
                    elems.div_ceil(segment) as u64
                }
            })
            .sum(),
        // A ring's point 0 is a plain bridge, without counters.
        switch: c[0].get("complete").copied().unwrap_or(0),
        complete: inner.clone().map(|i| c[i]["complete"]).sum(),
        partial: inner.map(|i| c[i]["partial"]).sum(),
    }
}

/// Exact from one element to many windows, each link within 1.05·S, one partial per
/// segment per point, and `xagg job tree` at a host.
fn hosts_under_a_switch(lab: &TreeLab) {
    // One element, one segment, a short last segment, many windows.
    exact(lab, 0, &[1, 860, 1000, 70_001]);
    bytes_per_link(lab, 4, 1 << 18, TREE_LINK);
    clean_counters(lab);
    // `xagg job tree` at a host: its level, its members, its way up, its counters.
    let out = std::process::Command::new(bin("xagg"))
        .arg("--socket")
        .arg(lab.points[2].socket())
        .args(["job", "tree", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "level: inner: member 1 of job 1 at 10.77.0.1:47800",
        "member 1: 10.77.1.13:47801 on port p1",
        "partials go up through port up0 to 10.77.0.1:47800",
        "this level's counters:",
        "partial ",
    ] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
}

/// 4 hosts of 4 ranks under one switch; full segments (multi-buffer
/// frames at every level).
#[test]
fn four_hosts_of_four_ranks() {
    if !require_root("four_hosts_of_four_ranks") {
        return;
    }
    let seg = xagg_common::wire::MAX_PAYLOAD / 4;
    let lab = lab("tf", Topology::Hosts { hosts: 4, ranks: 4 }, seg);
    exact(&lab, 0, &[1, seg + 1, 50_000]);
    bytes_per_link(&lab, 3, 1 << 17, TREE_LINK);
    clean_counters(&lab);
}

/// A spine over 2 leaf switches, each over 2 hosts of 2 ranks: three levels of
/// aggregation, full segments; then [`ops_and_types`] through its 7 points.
#[test]
fn two_level_tree() {
    if !require_root("two_level_tree") {
        return;
    }
    let seg = xagg_common::wire::MAX_PAYLOAD / 4;
    let lab = lab(
        "tt",
        Topology::Tree {
            leaves: 2,
            hosts: 2,
            ranks: 2,
        },
        seg,
    );
    exact(&lab, 0, &[1, 3 * seg - 1, 40_000]);
    bytes_per_link(&lab, 3, 1 << 17, TREE_LINK);
    clean_counters(&lab);
    ops_and_types(&lab, 7, 100);
}

/// Loss at each level, alone and combined: contributions (partials, at the switch) and
/// result copies dropped at 1, 5 and 20 %; every allreduce stays exact, recovered by the
/// ranks' retransmissions climbing the levels.
fn loss_at_every_level(lab: &TreeLab, first: u32) {
    let before = lab.counters();
    let mut message = first;
    for p in [0.01, 0.05, 0.2] {
        for levels in [&[0][..], &[1], &[0, 1]] {
            for &l in levels {
                lab.inject(l, p, p).unwrap();
            }
            exact(lab, message, &[20_000]);
            message += 1;
            for &l in levels {
                lab.inject(l, 0.0, 0.0).unwrap();
            }
        }
    }
    let c = since(&before, &lab.counters());
    eprintln!("switch: {:?}", c[0]);
    let injected = |name: &str| c.iter().map(|p| p[name]).sum::<u64>();
    assert!(injected("inject_drop_contribution") > 0 && injected("inject_drop_result") > 0);
    // Lost partials and results were recovered through the levels.
    assert!(sum(&c, &[1, 2], "partial_resend") > 0, "partials re-sent");
    assert!(
        c[0]["result_replay"] > 0,
        "the switch answered a host's resend"
    );
    // Reordered segments too.
    exact(lab, message, &[20_000]);
    lab.allreduce(message + 1, 30_000, 3, |p| {
        p.reorder = true;
    })
    .expect("reordered segments");
}

/// A rank forges its host's result (kind Result, the switch's job id, from its own
/// addresses): dropped and counted, and the next allreduce is exact. Then, on the same
/// lab, [`the_level_above_names_its_missing_member`] (host 2 goes) and
/// [`a_level_that_disappears_fails_within_give_up`] (then the switch goes).
#[test]
fn a_rank_cannot_forge_results() {
    if !require_root("a_rank_cannot_forge_results") {
        return;
    }
    let lab = lab("ts", Topology::Hosts { hosts: 2, ranks: 1 }, 860);
    exact(&lab, 0, &[1000]);
    let host = &lab.points[1];
    let rank = &lab.ranks[0];
    let h = xagg_common::Header::builder(xagg_common::Kind::Result)
        .op(xagg_common::Op::Sum)
        .dtype(xagg_common::DType::I32)
        .job(JOB)
        .message(1)
        .count(4)
        .build();
    let forged = contribution(h, &[7, 7, 7, 7]);
    let before = lab.counters();
    xagg_lab::lab::in_netns(&rank.ns, || {
        let s = std::net::UdpSocket::bind((rank.ip, 47999))?;
        for _ in 0..5 {
            s.send_to(&forged, (host.ip, xagg_common::wire::DEFAULT_PORT))?;
        }
        Ok(())
    })
    .unwrap();
    let c = eventually("the forgeries counted", Duration::from_secs(5), || {
        let c = lab.counters();
        if c[1]["drop_not_parent"] >= 5 {
            Ok(c)
        } else {
            Err(c[1].clone())
        }
    });
    assert_eq!(c[1]["drop_not_parent"], 5, "host: {:?}", c[1]);
    assert_eq!(
        c[1]["parent_result"], before[1]["parent_result"],
        "none of them taken"
    );
    exact(&lab, 1, &[1000]);
    // The host's job, as the daemon lists it, names its parent.
    match lab.api(1, &Request::ListJobs).unwrap() {
        xagg_api::Response::Jobs { jobs } => {
            let p = jobs[0].parent.as_ref().expect("an inner job");
            assert_eq!((p.interface.as_str(), p.job, p.member), ("up0", JOB, 0));
        }
        r => panic!("{r:?}"),
    }
    the_level_above_names_its_missing_member(&lab, 2);
    a_level_that_disappears_fails_within_give_up(&lab, 4);
}

/// 4 hosts of 2 ranks in a ring on a plain bridge (no aggregating switch), full
/// (multi-buffer) segments: exact, and each host's link carries 2(h-1)/h·S = 1.5·S each
/// way (± 5 %), the chain's start rotating per segment; then [`ops_and_types`] round it,
/// then loss on every link: partials and results dropped at 1, 5 and 20 %, every
/// allreduce exact.
#[test]
fn ring_of_hosts() {
    if !require_root("ring_of_hosts") {
        return;
    }
    let seg = xagg_common::wire::MAX_PAYLOAD / 4;
    let lab = lab("tr", Topology::Ring { hosts: 4, ranks: 2 }, seg);
    exact(&lab, 0, &[1, 4 * seg + 1, 50_000]);
    let h = 4.0;
    let ring = 2.0 * (h - 1.0) / h;
    bytes_per_link(&lab, 3, 1 << 18, (ring * 0.95, ring * 1.05));
    let c = lab.counters();
    no_refusals(&c);
    // Per segment, the chain's last host completes it and the others each send one
    // partial and take one result.
    let hosts = 1..c.len();
    let complete: u64 = hosts.clone().map(|i| c[i]["complete"]).sum();
    let partial: u64 = hosts.clone().map(|i| c[i]["partial"]).sum();
    let delivered: u64 = hosts.map(|i| c[i]["parent_result"]).sum();
    assert_eq!(partial, 3 * complete);
    assert_eq!(delivered, 3 * complete);

    ops_and_types(&lab, 4, 100);

    let before = lab.counters();
    for (m, p) in [0.01, 0.05, 0.2].into_iter().enumerate() {
        lab.inject(1, p, p).unwrap();
        exact(&lab, 200 + m as u32, &[20_000]);
    }
    let c = since(&before, &lab.counters());
    let sum = |name: &str| (1..c.len()).map(|i| c[i][name]).sum::<u64>();
    assert!(sum("inject_drop_contribution") > 0 && sum("inject_drop_result") > 0);
    assert!(sum("partial_resend") > 0, "partials re-sent");

    lab.inject(1, 0.0, 0.0).unwrap();
    let c = collectives_through_levels(&lab, 300, seg);
    // Each segment completed once, at its chain's last host; the three others sent a
    // partial each.
    assert_eq!(c.complete, c.segments);
    assert_eq!(c.partial, 3 * c.segments);
}

/// Ops and types through the aggregation points of `lab` (messages from `first`): through
/// three levels (a spine over leaves over hosts: 7 points) and through a ring (4 hosts):
/// integers bit-exact, float sums within the bound for N ranks and P points
/// (docs/types.md), avg divided once, every rank the same bits; in the exact float lane,
/// the exact sum rounded once, whatever the points in between.
fn ops_and_types(lab: &TreeLab, points: usize, first: u32) {
    use xagg_common::wire::{DType, Float, Op};
    let cases = [
        (Op::Sum, DType::F32, Float::Fast),
        (Op::Avg, DType::F32, Float::Fast),
        (Op::Sum, DType::F64, Float::Fast),
        (Op::Avg, DType::Bf16, Float::Fast),
        (Op::Max, DType::F16, Float::Fast),
        (Op::Avg, DType::I64, Float::Fast),
        (Op::Xor, DType::U32, Float::Fast),
        (Op::Min, DType::I32, Float::Fast),
        (Op::Sum, DType::F32, Float::Exact),
        (Op::Sum, DType::F64, Float::Exact),
        (Op::Avg, DType::Bf16, Float::Exact),
    ];
    let topology = &lab.topology;
    for (m, (op, dtype, float)) in cases.into_iter().enumerate() {
        let n = 9_001;
        let inputs: Vec<Vec<u8>> = (0..lab.ranks.len())
            .map(|r| xagg_worker::data::generate(dtype, m as u64, r as u32, n))
            .collect();
        let results = lab
            .allreduce_as(first + m as u32, (op, dtype, float), &inputs)
            .unwrap_or_else(|e| panic!("{topology:?}, {op} over {dtype} ({float}): {e:#}"));
        assert!(
            results.iter().all(|r| r == &results[0]),
            "{topology:?}, {op} over {dtype} ({float}): ranks differ"
        );
        if float == Float::Exact {
            assert!(
                results[0] == xagg_worker::data::exact_float_sum(op, dtype, &inputs),
                "{topology:?}, {op} over {dtype}: not the exact sum rounded once"
            );
            continue;
        }
        let lane = xagg_common::wire::lane(op, dtype).unwrap();
        let segment = xagg_common::wire::MAX_PAYLOAD / lane.size();
        let worst =
            xagg_worker::data::check_levels(op, dtype, segment, &inputs, &results[0], points)
                .unwrap_or_else(|e| panic!("{topology:?}, {op} over {dtype}: {e}"));
        eprintln!("{topology:?}: {op} over {dtype} ok (float error {worst:.3} of the bound)");
    }
}

/// Every point below the root handed each result from above to every child as it came,
/// named so its children take it: a copy per child per result, none refused on the way
/// out (a result still named by the parent's id finds no member here and only reaches
/// the ranks as the answer to their retransmissions).
fn delivered_down(lab: &TreeLab, c: &[BTreeMap<String, u64>]) {
    for (i, p) in lab.points.iter().enumerate().skip(1) {
        assert!(c[i]["parent_result"] > 0, "point {i}: {:?}", c[i]);
        assert_eq!(
            c[i]["result_copy"],
            c[i]["parent_result"] * p.children.len() as u64,
            "point {i}: {:?}",
            c[i]
        );
    }
}

/// Ranks join by themselves: each asks its host's daemon, stating the job's 4 ranks and
/// its own; once a host's ranks are in, the host's daemon joins the switch's (named in its
/// configuration, nothing per job) as one member standing for them; the switch's level is
/// complete when its members stand for all 4 ranks. Then the allreduce is exact. On the
/// same lab, before and after: the job goes round a ring of the hosts when the switch is
/// full, and when the switch's daemon does not answer (within 2 s).
#[test]
fn ranks_and_hosts_join_by_themselves() {
    if !require_root("ranks_and_hosts_join_by_themselves") {
        return;
    }
    let mut lab = joinable_tree("tj", Topology::Hosts { hosts: 2, ranks: 2 });
    // The switch is full: a job holds every slot.
    lab.occupy(0, 200, xagg_common::slot::MAX_SLOTS).unwrap();
    ring(&lab, 2, "the switch is full");
    match lab.api(0, &Request::RemoveJob { id: 200 }).unwrap() {
        xagg_api::Response::Ok => {}
        r => panic!("removing the full job: {r:?}"),
    }

    // Each daemon numbers its jobs itself: with a job already at the switch, the joined
    // job's id there is not the hosts' (a result from above is renamed on its way down).
    lab.occupy(0, 1, 1).unwrap();
    let seg = xagg_common::wire::MAX_PAYLOAD / 4;
    let before = lab.counters();
    let reports = lab
        .join_and_allreduce(xagg_worker::JobKey([3; 16]), (seg, SLOTS), 100_000, 5)
        .unwrap_or_else(|e| panic!("{e:#}; counters {:?}", lab.counters()));
    assert!(reports
        .iter()
        .all(|r| r.path == xagg_worker::Path::Tree && r.why.is_none()));
    let c = since(&before, &lab.counters());
    assert!(
        c[1]["partial"] > 0 && c[2]["partial"] > 0,
        "the hosts sent partials"
    );
    assert_eq!(
        c[0]["complete"], c[1]["partial"],
        "the switch completed each segment"
    );
    delivered_down(&lab, &c);

    // The switch's daemon is gone (its dataplane stays, passing what is not its own).
    lab.points[0]
        .daemon
        .take()
        .expect("the switch's daemon")
        .stop(Signal::SIGKILL)
        .unwrap();
    ring(&lab, 6, "did not answer");
}

/// Two levels of switches: a leaf cannot know how many hosts will join it, so it joins
/// the spine at once and says so again as each host comes; the spine's level is complete
/// when its leaves stand for all 8 ranks. Then the spine's daemon goes: each leaf's join
/// there gets no answer, so after `ring_after` the leaf fails its level, its hosts' joins
/// are refused, and they go round a ring instead (through the leaves and the spine, which
/// pass what is not theirs). Every rank's allreduce is exact and says its way, and why.
#[test]
fn leaves_join_the_spine_by_themselves() {
    if !require_root("leaves_join_the_spine_by_themselves") {
        return;
    }
    let mut lab = joinable_tree(
        "tl",
        Topology::Tree {
            leaves: 2,
            hosts: 2,
            ranks: 2,
        },
    );
    lab.occupy(1, 1, 1).unwrap();
    let seg = xagg_common::wire::MAX_PAYLOAD / 4;
    let reports = lab
        .join_and_allreduce(xagg_worker::JobKey([4; 16]), (seg, SLOTS), 100_000, 6)
        .unwrap_or_else(|e| panic!("{e:#}; counters {:?}", lab.counters()));
    assert!(reports
        .iter()
        .all(|r| r.path == xagg_worker::Path::Tree && r.why.is_none()));
    let c = lab.counters();
    let level = |l: usize| -> Vec<usize> {
        (0..lab.points.len())
            .filter(|&i| lab.points[i].level(&lab.points) == l)
            .collect()
    };
    let (leaves, hosts) = (level(1), level(2));
    delivered_down(&lab, &c);
    assert_eq!((leaves.len(), hosts.len()), (2, 4));
    let segments = c[0]["complete"];
    assert!(segments > 0, "the spine completed the segments");
    for i in leaves.iter().chain(&hosts) {
        assert_eq!(
            c[*i]["partial"], segments,
            "point {i} sent one partial per segment"
        );
        assert_eq!(c[*i]["complete"], 0, "point {i} completes nothing itself");
    }

    lab.points[0]
        .daemon
        .take()
        .expect("the spine's daemon")
        .stop(Signal::SIGKILL)
        .unwrap();
    ring(&lab, 5, "did not answer");
}

/// Ranks join with no aggregating switch configured above their hosts (on a plain
/// bridge): the job goes round a ring of the hosts, each allreduce exact and saying so;
/// the MPI library's and the PyTorch backend's ranks too, their totals naming the ring.
#[test]
fn the_ring_when_the_switch_cannot_aggregate() {
    if !require_root("the_ring_when_the_switch_cannot_aggregate") {
        return;
    }
    let lab = joinable_tree("tg", Topology::Ring { hosts: 3, ranks: 2 });
    // The first host numbers the job unlike the others: frames to a neighbour name its id.
    lab.occupy(1, 1, 1).unwrap();
    ring(&lab, 1, "no aggregating switch");

    // An MPI program's ranks on the same hosts: exact round the ring, and the summary
    // says so — none of its calls counted as the switch's.
    let dir = std::env::temp_dir().join("xagg-test-tg-mpi");
    std::fs::create_dir_all(&dir).unwrap();
    let hosts = xagg_lab::mpi::tree_hosts(&lab);
    let agent = xagg_lab::mpi::hosts_agent(&hosts, &dir, "rsh-agent-tg").unwrap();
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi/check.c");
    let check = dir.join("check");
    xagg_lab::mpi::compile(&src, &check, &[]).unwrap();
    let env = crate::mpi::preload(None, &[]);
    let o = xagg_lab::mpi::run_on_hosts(&hosts, &agent, &env, check.to_str().unwrap()).unwrap();
    let (out, err) = crate::mpi::checked(&o);
    assert!(out.contains("failures=0"), "{out}");
    let (switch, fallback, _) = crate::mpi::summary(&err);
    assert_eq!((switch, fallback), (0, 0), "{err}");
    let ring = crate::mpi::summary_count(&err, "allreduces and");
    assert!(ring >= 250, "{ring} allreduces round the ring: {err}");
    assert!(
        err.contains("rank 0: communicators served: 3 joined a ring of hosts"),
        "{err}"
    );

    // A DDP script's ranks through the PyTorch backend, the same: every bucket's result
    // Gloo's, and the totals naming the ring.
    let e = crate::python::hosts_env();
    let model = dir.join("xagg.pt");
    let outputs = xagg_lab::python::tree_torchrun(
        &lab,
        29507,
        &e,
        &crate::python::script("ddp_check.py"),
        &["xagg", "1", model.to_str().unwrap(), "compare"],
    )
    .unwrap();
    let x = ranks_ok(&outputs);
    for r in 0..lab.ranks.len() {
        assert!(
            x.contains(&format!("rank {r}: steps=1 identical=True")),
            "{x}"
        );
    }
    assert!(
        x.contains("allreduces round a ring of hosts (no switch aggregated them), 0 made by Gloo")
            && !x.contains("through the switch"),
        "{x}"
    );
}

/// Ranks join job `key` and go round a ring: every rank's allreduce exact, its path the
/// ring and its reason saying `why`.
fn ring(lab: &TreeLab, key: u8, why: &str) {
    let seg = xagg_common::wire::MAX_PAYLOAD / 4;
    let reports = lab
        .join_and_allreduce(
            xagg_worker::JobKey([key; 16]),
            (seg, SLOTS),
            60_000,
            key.into(),
        )
        .unwrap_or_else(|e| panic!("{e:#}; counters {:?}", lab.counters()));
    for r in &reports {
        assert_eq!(r.path, xagg_worker::Path::Ring, "{r:?}");
        let said = r.why.as_deref().unwrap_or("");
        assert!(said.contains(why), "{said:?} should say {why:?}");
    }
    eprintln!("ring: {}", reports[0].why.as_deref().unwrap_or(""));
}

/// A level that disappears: with the switch's dataplane gone (its daemon detached it),
/// the ranks' allreduce fails within their give-up time, saying their host sent the
/// partial up and the level above did not answer.
fn a_level_that_disappears_fails_within_give_up(lab: &TreeLab, first: u32) {
    lab.api(0, &Request::Detach).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let give_up = Duration::from_secs(2);
    let start = std::time::Instant::now();
    let r = lab.allreduce(first, 5000, 1, |p| p.give_up = give_up);
    let took = start.elapsed();
    let e = format!("{:#}", r.expect_err("the allreduce must fail"));
    eprintln!("after {took:?}: {e}");
    assert!(
        took < give_up + Duration::from_secs(3),
        "failed after {took:?}"
    );
    assert!(
        e.contains("sent its partial up; the level above has not answered"),
        "{e}"
    );
}

/// Ranks that are processes on a host (which the host's XDP cannot see) join the switch
/// directly, as members of its job beside the host aggregators: 2 hosts of 2 ranks and 2
/// ranks on the switch's own ports, exact, every link within 1.05·S each way.
#[test]
fn ranks_on_the_switch_beside_hosts() {
    if !require_root("ranks_on_the_switch_beside_hosts") {
        return;
    }
    let lab = lab(
        "tm",
        Topology::Mixed {
            hosts: 2,
            ranks: 2,
            direct: 2,
        },
        860,
    );
    exact(&lab, 0, &[1, 9_000]);
    bytes_per_link(&lab, 2, 1 << 17, TREE_LINK);
    let c = lab.counters();
    no_refusals(&c);
    // The switch's job: 2 hosts and 2 ranks; each segment completed once.
    assert_eq!(c[0]["complete"], c[1]["partial"]);
    assert_eq!(c[0]["complete"], c[2]["partial"]);
}

/// A host that disappears: the ranks of the other host wait while the switch says it waits
/// for it, and at the collective timeout fail saying what the level above waits for —
/// their host forwards their status queries to the switch, which names the missing host.
fn the_level_above_names_its_missing_member(lab: &TreeLab, first: u32) {
    exact(lab, first, &[5000]);
    lab.api(2, &Request::Detach).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // Waited for while the switch answers, up to the collective timeout.
    let r = lab.allreduce(first + 1, 5000, 1, |p| {
        p.give_up = Duration::from_secs(2);
        p.collective_timeout = Duration::from_secs(3);
    });
    let e = format!("{:#}", r.expect_err("the allreduce must fail"));
    eprintln!("{e}");
    assert!(
        e.contains("rank 0") && e.contains("the level above waits for its members [1]"),
        "{e}"
    );
    let c = lab.counters();
    assert!(
        c[1]["status_forward"] > 0 && c[1]["status_relay"] > 0,
        "{:?}",
        c[1]
    );
}
