//! Nothing on the wire is trusted: each defect a hostile-network test found, rebuilt the
//! way it was found — forged results (at the switch, and at the worker with the switch's
//! check out of the way), a packet filter on a worker's host, a job continued by new
//! processes while a member still waits for a result, and ordinary IP to the switch's
//! own address.

use std::{
    collections::BTreeMap,
    net::{SocketAddrV4, UdpSocket},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use xagg_api::Response;
use xagg_common::wire::{self, DType, Header, Kind, Op, DEFAULT_PORT};
use xagg_lab::lab::{self, in_netns, SWITCH_IP, WORKER_PORT};
use xagg_tests::*;

/// The switch's address in BPF_PROG_RUN harness frames.
const SWITCH_IP_HARNESS: std::net::Ipv4Addr = xagg_lab::testrun::SWITCH_IP;

/// `nft` commands in the network namespace `ns`, which must take.
fn nft(ns: &str, rules: &str) {
    assert!(xagg_tests::nft(ns, rules), "nft (nftables): {rules}");
}

/// A forged result of job `job`, message 0, for segment `segment` on slot
/// `segment % slots`, first use (shadow copy 0), `count` i32 of garbage.
fn forged_result(job: u32, segment: u32, slots: u32, count: u16) -> Vec<u8> {
    let h = Header::builder(Kind::Result)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(job)
        .segment(segment)
        .slot((segment % slots) as u16)
        .count(count)
        .build();
    let garbage = vec![0x5au8; usize::from(count) * 4];
    let mut out = vec![0u8; wire::HEADER_LEN + garbage.len() + 8];
    let n = wire::encode(&h, &garbage, &mut out).unwrap();
    out.truncate(n);
    out
}

/// Floods member 0 of job `job` with forged results from worker 2's namespace, sent from
/// `from` (bound with IP_FREEBIND and IP_TRANSPARENT, so it may be an address worker 2
/// does not hold), until
/// `stop`; returns how many it sent.
fn flood(sw: &TestSwitch, job: u32, from: SocketAddrV4, stop: &AtomicBool) -> u64 {
    let ns = sw.lab.worker_ns(2);
    let victim = SocketAddrV4::new(lab::worker_ip(0), WORKER_PORT);
    in_netns(&ns, || {
        let s = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Datagram,
            nix::sys::socket::SockFlag::empty(),
            None,
        )?;
        // Bound and sending from an address this host does not hold.
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::IpFreebind, &true)?;
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::IpTransparent, &true)?;
        nix::sys::socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            &nix::sys::socket::SockaddrIn::from(from),
        )?;
        let sock = UdpSocket::from(s);
        let packets: Vec<Vec<u8>> = (0..64).map(|k| forged_result(job, k, 8, 256)).collect();
        let mut sent = 0;
        // Until stopped, and in any case for no more than 5 s (a failed run stops nothing).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            for p in &packets {
                if sock.send_to(p, victim).is_ok() {
                    sent += 1;
                }
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(sent)
    })
    .unwrap()
}

/// Member 0 waits for member 1 (which starts late) while forged results flood it; its
/// result must still be the exact sum. Returns the forgeries sent and what member 0
/// refused.
fn allreduce_under_forgery(sw: &TestSwitch, job: u32, from: SocketAddrV4) -> (u64, u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let flooder = s.spawn(|| flood(sw, job, from, &stop));
        std::thread::sleep(Duration::from_millis(50));
        // Member 1 starts 300 ms late: member 0 sits waiting for results meanwhile.
        let reports = sw.allreduce_with(
            &Allreduce {
                job,
                message: 0,
                segment: 256,
                slots: 8,
                workers: &[0, 1],
                port: WORKER_PORT,
                elems: 64 * 256,
                seed: 11,
            },
            |p| {
                if p.member == 1 {
                    std::thread::sleep(Duration::from_millis(300));
                }
            },
        );
        stop.store(true, Ordering::Relaxed);
        (flooder.join().unwrap(), reports[0].refused)
    })
}

#[test]
fn forged_results_claiming_the_switch_are_dropped_at_the_switch() {
    if !require_root("forged_results_claiming_the_switch_are_dropped_at_the_switch") {
        return;
    }
    let sw = TestSwitch::start("xfa", 3, |_| {});
    let r = sw.add_job(5, 256, 8, &[0, 1]);
    assert!(matches!(r, Response::Job { .. }), "{r:?}");
    // Worker 2 knows the victim's MAC (an ARP request claiming the switch's address would
    // itself be dropped).
    let mac = xagg_linux::iface::fmt_mac(&sw.lab.worker_mac(0).unwrap());
    lab::ip(&[
        "-n",
        &sw.lab.worker_ns(2),
        "neigh",
        "replace",
        &lab::worker_ip(0).to_string(),
        "lladdr",
        &mac,
        "dev",
        "eth0",
    ])
    .unwrap();
    let before = sw.counters();
    // From the switch's own address and collective port: what the worker accepts, so only
    // the switch's check stands between the forgery and the result.
    let (sent, refused) =
        allreduce_under_forgery(&sw, 5, SocketAddrV4::new(SWITCH_IP, DEFAULT_PORT));
    let dropped = sw.counters()["drop_spoofed_source"] - before["drop_spoofed_source"];
    eprintln!("{sent} forged results claiming the switch; {dropped} dropped at the switch");
    assert!(
        sent > 0 && dropped >= sent,
        "{sent} sent, {dropped} dropped"
    );
    assert_eq!(refused, 0, "none reached the worker");
}

#[test]
fn forged_results_from_elsewhere_are_refused_by_the_worker() {
    if !require_root("forged_results_from_elsewhere_are_refused_by_the_worker") {
        return;
    }
    let sw = TestSwitch::start("xfb", 3, |_| {});
    assert!(matches!(
        sw.add_job(6, 256, 8, &[0, 1]),
        Response::Job { .. }
    ));
    // From worker 2's own address: the switch passes it like any traffic between hosts,
    // so only the worker's check stands between the forgery and the result.
    let before = sw.counters();
    let (sent, refused) =
        allreduce_under_forgery(&sw, 6, SocketAddrV4::new(lab::worker_ip(2), DEFAULT_PORT));
    assert_eq!(
        sw.counters()["drop_spoofed_source"],
        before["drop_spoofed_source"]
    );
    eprintln!("{sent} forged results from another host: {refused} refused by the worker");
    assert!(sent > 0 && refused > 0, "{sent} sent, {refused} refused");
}

#[test]
fn a_packet_filter_dropping_contributions_is_a_loss_not_an_error() {
    if !require_root("a_packet_filter_dropping_contributions_is_a_loss_not_an_error") {
        return;
    }
    let sw = TestSwitch::start("xfc", 3, |_| {});
    assert!(matches!(
        sw.add_job(7, 860, 64, &[0, 1, 2]),
        Response::Job { .. }
    ));
    // Member 0's host drops 1 % of what it sends to the switch, then 5 %: sendmsg fails
    // with EPERM for each.
    let ns = sw.lab.worker_ns(0);
    for (k, percent) in [1u32, 5].into_iter().enumerate() {
        nft(
            &ns,
            &format!(
                "flush ruleset\ntable inet xagg_test {{\n  chain out {{\n    type filter hook output priority 0;\n    udp dport {DEFAULT_PORT} numgen random mod 100 < {percent} drop\n  }}\n}}\n"
            ),
        );
        // At 1 % one datagram per send (so about 12 of the 1217 contributions are
        // refused); at 5 % GSO bursts, each refused whole.
        let reps = sw.allreduce_with(
            &Allreduce {
                job: 7,
                message: k as u32,
                segment: 860,
                slots: 64,
                workers: &[0, 1, 2],
                port: WORKER_PORT,
                elems: (4 << 20) / 4,
                seed: 3,
            },
            |p| p.gso = percent != 1,
        );
        let lost: u64 = reps.iter().map(|r| r.lost_sends).sum();
        let retx: u64 = reps.iter().map(|r| r.retransmissions).sum();
        eprintln!("{percent} % filtered on output: bit-exact, {lost} sends refused, {retx} retransmissions");
        assert!(lost > 0, "the filter refused no send");
        assert!(retx >= lost, "every refused send needs a retransmission");
    }
    nft(&ns, "flush ruleset\n");
}

/// One member's allreduce of `nseg` segments (message `message`, seed `seed`) in a
/// process of its own — a new `Worker` — checked against the sum over all 3 members.
fn member_run(
    sw: &TestSwitch,
    member: u8,
    message: u32,
    nseg: usize,
    give_up: Duration,
) -> Result<(), String> {
    const SLOTS: usize = 4;
    const SEG: usize = 256;
    let elems = nseg * SEG;
    let seed = 100 + u64::from(message);
    in_netns(&sw.lab.worker_ns(usize::from(member)), || {
        let mut p = xagg_worker::WorkerParams::new(
            SocketAddrV4::new(SWITCH_IP, DEFAULT_PORT),
            SocketAddrV4::new(lab::worker_ip(usize::from(member)), WORKER_PORT),
            8,
            member,
            i32_shape(3, SLOTS, SEG),
        );
        p.first_message = Some(message);
        p.give_up = give_up;
        let w = xagg_worker::Worker::new(p)?;
        let mut buf = vec![0i32; elems];
        xagg_worker::data::fill(seed, u32::from(member), &mut buf);
        w.allreduce(&mut buf)?;
        let want = xagg_worker::data::expected_sum(seed, 3, elems);
        anyhow::ensure!(
            buf == want,
            "member {member}, message {message}: wrong result"
        );
        Ok(())
    })
    .map_err(|e| format!("member {member}, message {message}: {e:#}"))
}

/// Members run one message per process (a new `Worker` each). Member 2 misses the result
/// of the last segment of message k while members 0 and 1 finish it and start message
/// k + 1 in new processes; once the result gets through again, member 2 must still get
/// it from the switch's stored copy, and then run k + 1 with the others. Message lengths
/// give odd and even numbers of rounds per slot, so every way a new process could take
/// the wrong shadow copy comes up.
#[test]
fn a_job_continued_by_new_processes_keeps_results_someone_needs() {
    if !require_root("a_job_continued_by_new_processes_keeps_results_someone_needs") {
        return;
    }
    let sw = TestSwitch::start("xfd", 3, |_| {});
    assert!(matches!(
        sw.add_job(8, 256, 4, &[0, 1, 2]),
        Response::Job { .. }
    ));
    let ns2 = sw.lab.worker_ns(2);
    // (segments of message k, of message k + 1) with 4 slots: rounds per slot 3 then 2,
    // 1 then 2, 2 then 3.
    let mut message = 0;
    for (a, b) in [(12usize, 8usize), (3, 8), (8, 12)] {
        let last = a - 1;
        // Results (kind 2) of message k's last segment do not reach member 2 for now.
        nft(
            &ns2,
            &format!(
                "flush ruleset\ntable inet xagg_test {{\n  chain in {{\n    type filter hook input priority 0;\n    udp sport {DEFAULT_PORT} @th,72,8 2 @th,160,32 {last} drop\n  }}\n}}\n"
            ),
        );
        let finished_k = std::sync::atomic::AtomicUsize::new(0);
        let give_up = Duration::from_secs(8);
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let mut hs = Vec::new();
            for m in [0u8, 1] {
                let (sw, finished_k) = (&sw, &finished_k);
                hs.push(s.spawn(move || {
                    member_run(sw, m, message, a, give_up)?;
                    finished_k.fetch_add(1, Ordering::SeqCst);
                    member_run(sw, m, message + 1, b, give_up)
                }));
            }
            let sw_ref = &sw;
            hs.push(s.spawn(move || {
                member_run(sw_ref, 2, message, a, give_up)?;
                member_run(sw_ref, 2, message + 1, b, give_up)
            }));
            let t = Instant::now();
            while finished_k.load(Ordering::SeqCst) < 2 && t.elapsed() < give_up {
                std::thread::sleep(Duration::from_millis(5));
            }
            // Members 0 and 1 have started message k + 1 in new processes by now.
            std::thread::sleep(Duration::from_millis(200));
            nft(&ns2, "flush ruleset\n");
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let failed: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        assert!(failed.is_empty(), "{failed:#?}");
        eprintln!(
            "messages {message} ({a} segments) and {} ({b}): member 2 caught up",
            message + 1
        );
        message += 2;
    }
}

/// Ordinary IP traffic to the switch's own address, to another port: a datagram with IPv4
/// options, and one whose second fragment's bytes read as the collective port. Both
/// reach a listener on the switch.
#[test]
fn ordinary_ip_to_the_switch_address_passes() {
    if !require_root("ordinary_ip_to_the_switch_address_passes") {
        return;
    }
    let sw = TestSwitch::start("xfe", 1, |_| {});
    let listener = in_netns(&sw.lab.switch_ns(), || {
        let l = UdpSocket::bind(SocketAddrV4::new(SWITCH_IP, 9999))?;
        l.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(l)
    })
    .unwrap();
    let before = sw.counters();
    // Every second byte pair of the payload reads 47800, wherever a fragment starts.
    let big: Vec<u8> = DEFAULT_PORT.to_be_bytes().repeat(4000);
    in_netns(&sw.lab.worker_ns(0), || {
        let with_options = UdpSocket::bind(SocketAddrV4::new(lab::worker_ip(0), 0))?;
        // IPv4 options: three no-ops and the end of the list.
        let opts = [1u8, 1, 1, 0];
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&with_options),
                libc::IPPROTO_IP,
                libc::IP_OPTIONS,
                opts.as_ptr().cast(),
                opts.len() as u32,
            )
        };
        anyhow::ensure!(r == 0, "IP_OPTIONS: {}", std::io::Error::last_os_error());
        with_options.send_to(b"with options", SocketAddrV4::new(SWITCH_IP, 9999))?;
        let plain = UdpSocket::bind(SocketAddrV4::new(lab::worker_ip(0), 0))?;
        plain.send_to(&big, SocketAddrV4::new(SWITCH_IP, 9999))?;
        Ok(())
    })
    .unwrap();
    let mut buf = vec![0u8; 16384];
    let (n, _) = listener
        .recv_from(&mut buf)
        .expect("the datagram with options arrives");
    assert_eq!(&buf[..n], b"with options");
    let (n, _) = listener
        .recv_from(&mut buf)
        .expect("the fragmented datagram arrives");
    assert_eq!(&buf[..n], &big[..]);
    let after = sw.counters();
    assert_eq!(after["drop_bad_ip"], before["drop_bad_ip"], "{after:?}");
}

/// The switch's programs are frags-aware: its ports and the members' interfaces take a
/// 9000-byte MTU (a program without the flag makes the kernel refuse more than 3506), a
/// jumbo datagram between two members crosses the switch whole, and a jumbo datagram to
/// the collective port that is not a collective packet is dropped and counted.
#[test]
fn switch_ports_carry_jumbo_frames() {
    if !require_root("switch_ports_carry_jumbo_frames") {
        return;
    }
    let sw = TestSwitch::start("xjb", 2, |_| {});
    let set_mtu = |ns: &str, dev: &str| {
        lab::ip(&["-n", ns, "link", "set", dev, "mtu", "9000"])
            .unwrap_or_else(|e| panic!("MTU 9000 on {dev} in {ns}: {e}"));
    };
    set_mtu(&sw.lab.switch_ns(), "br0");
    for i in 0..2 {
        set_mtu(&sw.lab.switch_ns(), &lab::Lab::port(i));
        set_mtu(&sw.lab.worker_ns(i), "eth0");
    }
    let listener = in_netns(&sw.lab.worker_ns(1), || {
        let l = UdpSocket::bind(SocketAddrV4::new(lab::worker_ip(1), 9999))?;
        l.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(l)
    })
    .unwrap();
    let before = sw.counters();
    let big: Vec<u8> = (0..8000u32).map(|i| (i * 7) as u8).collect();
    in_netns(&sw.lab.worker_ns(0), || {
        let s = UdpSocket::bind(SocketAddrV4::new(lab::worker_ip(0), 0))?;
        s.send_to(&big, SocketAddrV4::new(lab::worker_ip(1), 9999))?;
        s.send_to(&big, SocketAddrV4::new(SWITCH_IP, DEFAULT_PORT))?;
        Ok(())
    })
    .unwrap();
    let mut buf = vec![0u8; 16384];
    let (n, _) = listener
        .recv_from(&mut buf)
        .expect("the jumbo datagram crosses the switch");
    assert_eq!(&buf[..n], &big[..]);
    std::thread::sleep(Duration::from_millis(100));
    let after = sw.counters();
    assert_eq!(
        after["drop_bad_version"],
        before["drop_bad_version"] + 1,
        "{after:?}"
    );
}

/// A frame's IPv4 header checksum, recomputed after an edit.
fn fix_ip_checksum(f: &mut [u8]) {
    f[24..26].copy_from_slice(&[0, 0]);
    let c = ipv4_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

/// What the switch program refuses, and what it lets through, of frames it cannot trust:
/// built byte by byte from a valid frame.
#[test]
fn switch_refuses_forgeries_and_passes_ordinary_ip() {
    if !require_root("switch_refuses_forgeries_and_passes_ordinary_ip") {
        return;
    }
    let mut sw = load_switch();
    sw.add_job(3, job(2, Op::Sum, DType::I32, 64, 0, 4));
    let contrib = |m: u8, segment: u32| {
        let h = Header::builder(Kind::Contribution)
            .op(Op::Sum)
            .dtype(DType::I32)
            .job(3)
            .segment(segment)
            .slot((segment % 4) as u16)
            .member(m)
            .count(16)
            .build();
        frame(&member(m), PORT, &contribution(h, &[7; 16]))
    };
    let mut case = |what: &str, f: Vec<u8>, action: u32, counter: xagg_common::Counter| {
        let before = sw.counter(counter);
        let r = sw.run(&f);
        assert_eq!(r.action, action, "{what}");
        assert_eq!(
            sw.counter(counter),
            before + 1,
            "{what}: {}",
            counter.name()
        );
    };
    use xagg_common::Counter as C;

    // A result from the switch's address to a member, entering a port: forged.
    let mut forged = contrib(0, 0);
    forged[26..30].copy_from_slice(&SWITCH_IP_HARNESS.octets());
    forged[30..34].copy_from_slice(&member(1).ip);
    forged[42 + 1] = Kind::Result as u8;
    fix_ip_checksum(&mut forged);
    case(
        "result claiming the switch's IP",
        forged,
        XDP_DROP,
        C::DropSpoofedSource,
    );
    // The switch's MAC as the source of anything.
    let mut mac = frame(&member(0), 53, &[1, 2, 3, 4]);
    mac[6..12].copy_from_slice(&SWITCH_MAC);
    case(
        "frame claiming the switch's MAC",
        mac,
        XDP_DROP,
        C::DropSpoofedSource,
    );
    // ARP claiming the switch's address (poisoning the members' caches).
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&member(1).mac);
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
    arp.extend_from_slice(&member(1).mac);
    arp.extend_from_slice(&SWITCH_IP_HARNESS.octets());
    arp.extend_from_slice(&[0; 10]);
    case(
        "ARP claiming the switch's IP",
        arp,
        XDP_DROP,
        C::DropSpoofedSource,
    );

    // Behind VLAN tags (802.1Q, 802.1ad, the older 0x9100; up to four read through).
    let tagged = |mut f: Vec<u8>, tpids: &[[u8; 2]]| {
        for (i, t) in tpids.iter().enumerate() {
            f.splice(12 + 4 * i..12 + 4 * i, [t[0], t[1], 0, 5 + i as u8]);
        }
        f
    };
    const Q: [u8; 2] = [0x81, 0x00];
    const AD: [u8; 2] = [0x88, 0xa8];
    const OLD: [u8; 2] = [0x91, 0x00];
    let mut result = contrib(0, 3);
    result[26..30].copy_from_slice(&SWITCH_IP_HARNESS.octets());
    result[30..34].copy_from_slice(&member(1).ip);
    result[42 + 1] = Kind::Result as u8;
    fix_ip_checksum(&mut result);
    for (what, tpids) in [
        ("a result claiming the switch's IP behind one tag", &[Q][..]),
        ("... behind 802.1ad + 802.1Q", &[AD, Q]),
        ("... behind 0x9100 + 802.1Q", &[OLD, Q]),
        ("... behind four tags", &[AD, Q, Q, Q]),
    ] {
        case(
            what,
            tagged(result.clone(), tpids),
            XDP_DROP,
            C::DropSpoofedSource,
        );
    }
    let mut arp_tagged = vec![0xff; 6];
    arp_tagged.extend_from_slice(&member(1).mac);
    arp_tagged.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
    arp_tagged.extend_from_slice(&member(1).mac);
    arp_tagged.extend_from_slice(&SWITCH_IP_HARNESS.octets());
    arp_tagged.extend_from_slice(&[0; 10]);
    case(
        "ARP claiming the switch's IP behind a tag",
        tagged(arp_tagged, &[Q]),
        XDP_DROP,
        C::DropSpoofedSource,
    );
    case(
        "a member's contribution behind a tag",
        tagged(contrib(0, 3), &[Q]),
        XDP_DROP,
        C::DropTagged,
    );
    case(
        "ordinary traffic to the switch's address behind a tag",
        tagged(frame(&member(0), 53, &[1, 2, 3, 4]), &[Q]),
        XDP_PASS,
        C::Pass,
    );
    case(
        "ordinary traffic behind four tags",
        tagged(frame(&member(0), 53, &[1, 2, 3, 4]), &[AD, Q, Q, Q]),
        XDP_PASS,
        C::Pass,
    );
    case(
        "anything behind five tags",
        tagged(frame(&member(0), 53, &[1, 2, 3, 4]), &[AD, Q, Q, Q, Q]),
        XDP_DROP,
        C::DropTagged,
    );
    let mut later_tagged = frame(&member(0), 53, &[0; 64]);
    later_tagged[20..22].copy_from_slice(&(0x2000u16 | 185).to_be_bytes());
    fix_ip_checksum(&mut later_tagged);
    case(
        "a later fragment to the switch's address behind a tag",
        tagged(later_tagged, &[Q]),
        XDP_DROP,
        C::DropTagged,
    );

    // IPv4 options: passed to another port, dropped to the collective one.
    let with_options = |port: u16| {
        let mut f = frame(&member(0), port, &contribution_bytes());
        f.splice(34..34, [1u8, 1, 1, 0]);
        f[14] = 0x46;
        let len = u16::from_be_bytes([f[16], f[17]]) + 4;
        f[16..18].copy_from_slice(&len.to_be_bytes());
        fix_ip_checksum(&mut f);
        f
    };
    case("options, another port", with_options(53), XDP_PASS, C::Pass);
    case(
        "options, collective port",
        with_options(PORT),
        XDP_DROP,
        C::DropBadIp,
    );
    // Fragments: a later one whose bytes read as the collective port passes; a first one
    // to the collective port is dropped.
    let mut later = frame(&member(0), 53, &[0; 64]);
    later[34..42].copy_from_slice(&[0xba, 0xb8, 0xba, 0xb8, 0xba, 0xb8, 0xba, 0xb8]);
    later[20..22].copy_from_slice(&(0x2000u16 | 185).to_be_bytes());
    fix_ip_checksum(&mut later);
    case("a later fragment", later, XDP_PASS, C::Pass);
    let mut first = contrib(0, 1);
    first[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
    fix_ip_checksum(&mut first);
    case("a first fragment", first, XDP_DROP, C::DropBadIp);

    // Checksums and lengths of contributions.
    let mut bad_sum = contrib(0, 2);
    bad_sum[24] ^= 0x55;
    case("bad IPv4 checksum", bad_sum, XDP_DROP, C::DropBadChecksum);
    let mut long_ip = contrib(0, 2);
    let len = u16::from_be_bytes([long_ip[16], long_ip[17]]) + 8;
    long_ip[16..18].copy_from_slice(&len.to_be_bytes());
    fix_ip_checksum(&mut long_ip);
    case(
        "IPv4 length past the frame",
        long_ip,
        XDP_DROP,
        C::DropTruncated,
    );
    let mut padded = contrib(0, 2);
    padded.extend_from_slice(&[0; 8]);
    case(
        "frame padded past the IPv4 length",
        padded,
        XDP_DROP,
        C::DropBadLength,
    );
    let mut udp_len = contrib(0, 2);
    let ul = u16::from_be_bytes([udp_len[38], udp_len[39]]) - 8;
    udp_len[38..40].copy_from_slice(&ul.to_be_bytes());
    case(
        "UDP length short of the IPv4 length",
        udp_len,
        XDP_DROP,
        C::DropBadLength,
    );
    // The UDP checksum is not enforced (docs/protocol.md says why): accepted.
    let mut udp_sum = contrib(0, 2);
    udp_sum[40..42].copy_from_slice(&[0x12, 0x34]);
    case("wrong UDP checksum", udp_sum, XDP_DROP, C::Contribution);

    // Multi-buffer frames (BPF_PROG_RUN puts what passes 3520 bytes of frame in further
    // buffers, as veth does): their lengths are judged over every buffer; other traffic
    // passes, so a switch port can carry jumbo frames.
    let mut big = contribution_bytes();
    big.resize(8000, 0);
    let jumbo = frame(&member(0), PORT, &big);
    assert!(jumbo.len() > 3520);
    case(
        "multi-buffer, payload longer than its element count",
        jumbo.clone(),
        XDP_DROP,
        C::DropBadLength,
    );
    let mut cut = jumbo.clone();
    cut.truncate(5000);
    case(
        "multi-buffer, a fragment cut short of the IPv4 length",
        cut,
        XDP_DROP,
        C::DropTruncated,
    );
    let mut short_ip = jumbo;
    short_ip[16..18].copy_from_slice(&3000u16.to_be_bytes());
    fix_ip_checksum(&mut short_ip);
    case(
        "multi-buffer, IPv4 length short of the frame",
        short_ip,
        XDP_DROP,
        C::DropBadLength,
    );
    let mut huge = contribution_bytes();
    huge.resize(xagg_common::wire::MAX_IP_PACKET, 0);
    case(
        "longer than the largest segment's packet",
        frame(&member(0), PORT, &huge),
        XDP_DROP,
        C::DropOversize,
    );
    case(
        "multi-buffer, another port",
        frame(&member(0), 53, &[0u8; 8000]),
        XDP_PASS,
        C::Pass,
    );
}

/// A collective payload (header and 16 elements) to carry in test frames.
fn contribution_bytes() -> Vec<u8> {
    let h = Header::builder(Kind::Contribution)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(3)
        .count(16)
        .build();
    contribution(h, &[7; 16])
}

/// A worker whose results never arrive says what the switch did, instead of blaming it:
/// the switch completed the round (results dropped by a packet filter on the worker's
/// host), or it answered status queries the worker never got (nothing runs on the
/// worker's end of the veth link).
#[test]
fn lost_results_are_not_blamed_on_the_switch() {
    if !require_root("lost_results_are_not_blamed_on_the_switch") {
        return;
    }
    let mut sw = TestSwitch::start("xfg", 1, |_| {});
    assert!(matches!(sw.add_job(2, 256, 4, &[0]), Response::Job { .. }));
    let ns = sw.lab.worker_ns(0);
    let run = |sw: &TestSwitch| {
        in_netns(&sw.lab.worker_ns(0), || {
            let mut p = xagg_worker::WorkerParams::new(
                SocketAddrV4::new(SWITCH_IP, DEFAULT_PORT),
                SocketAddrV4::new(lab::worker_ip(0), WORKER_PORT),
                2,
                0,
                i32_shape(1, 4, 256),
            );
            p.give_up = Duration::from_secs(1);
            let w = xagg_worker::Worker::new(p)?;
            Ok(w.allreduce(&mut [1i32; 256]).unwrap_err().to_string())
        })
        .unwrap()
    };
    // Results (kind 2) dropped on the worker's input; status replies get through.
    nft(
        &ns,
        &format!(
            "flush ruleset\ntable inet xagg_test {{\n  chain in {{\n    type filter hook input priority 0;\n    udp sport {DEFAULT_PORT} @th,72,8 2 drop\n  }}\n}}\n"
        ),
    );
    let err = run(&sw);
    assert!(
        err.contains("slot 0 segment 0: the switch completed it and sent the result, which never arrived here"),
        "{err}"
    );
    // Its contributions (kind 1) dropped on the way out: the switch never begins the
    // round, and the worker says so at its give-up time (before, it waited out the
    // collective timeout, 30 minutes, as if for a slow member).
    nft(
        &ns,
        &format!(
            "flush ruleset\ntable inet xagg_test {{\n  chain out {{\n    type filter hook output priority 0;\n    udp dport {DEFAULT_PORT} @th,72,8 1 drop\n  }}\n}}\n"
        ),
    );
    let err = run(&sw);
    assert!(
        err.contains(
            "the switch has not begun this round: none of this member's (0) contributions reached it"
        ),
        "{err}"
    );
    nft(&ns, "flush ruleset\n");
    // Nothing on the worker's end of the veth: every reply is dropped on the link.
    sw.lab.detach_hosts();
    let replies = sw.counters()["status_reply"];
    let err = run(&sw);
    assert!(
        err.contains("no status reply") && err.contains("runs no XDP program"),
        "{err}"
    );
    assert!(
        sw.counters()["status_reply"] > replies,
        "the switch did answer"
    );
}

/// Workers started again on a job that already ran, without a message id, take up the
/// job where it stands (the message after the newest the switch holds) instead of
/// sending rounds the switch drops as stale.
#[test]
fn a_new_process_takes_up_the_next_message_from_the_switch() {
    if !require_root("a_new_process_takes_up_the_next_message_from_the_switch") {
        return;
    }
    let sw = TestSwitch::start("xfh", 2, |_| {});
    assert!(matches!(
        sw.add_job(9, 256, 4, &[0, 1]),
        Response::Job { .. }
    ));
    for message in 0..3 {
        sw.allreduce(&Allreduce {
            job: 9,
            message,
            segment: 256,
            slots: 4,
            workers: &[0, 1],
            port: WORKER_PORT,
            elems: 3000,
            seed: 5,
        });
    }
    // New processes, no message id given: they take up message 3.
    let elems = 5000;
    let expected = xagg_worker::data::expected_sum(77, 2, elems);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u8)
            .map(|m| {
                let (sw, expected) = (&sw, &expected);
                s.spawn(move || {
                    in_netns(&sw.lab.worker_ns(usize::from(m)), || {
                        let p = xagg_worker::WorkerParams::new(
                            SocketAddrV4::new(SWITCH_IP, DEFAULT_PORT),
                            SocketAddrV4::new(lab::worker_ip(usize::from(m)), WORKER_PORT),
                            9,
                            m,
                            i32_shape(2, 4, 256),
                        );
                        let w = xagg_worker::Worker::new(p)?;
                        let mut buf = vec![0i32; elems];
                        xagg_worker::data::fill(77, u32::from(m), &mut buf);
                        w.allreduce(&mut buf)?;
                        anyhow::ensure!(&buf == expected, "member {m}: wrong result");
                        Ok(())
                    })
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap().unwrap();
        }
    });
    let stale = sw.counters()["drop_stale"];
    assert_eq!(stale, 0, "no round was sent with an old message id");
}

/// A worker the switch will not take is told why, from the switch, at once: not the
/// member it claims to be, a job the switch does not have, more slots than the job's,
/// fewer (its segments would go to other slots than the other members').
#[test]
fn a_refused_worker_is_told_why() {
    if !require_root("a_refused_worker_is_told_why") {
        return;
    }
    let sw = TestSwitch::start("xfi", 2, |_| {});
    assert!(matches!(
        sw.add_job(11, 256, 4, &[0, 1]),
        Response::Job { .. }
    ));
    let attempt = |job: u32, member: u8, slots: usize| {
        in_netns(&sw.lab.worker_ns(0), || {
            let mut p = xagg_worker::WorkerParams::new(
                SocketAddrV4::new(SWITCH_IP, DEFAULT_PORT),
                SocketAddrV4::new(lab::worker_ip(0), WORKER_PORT),
                job,
                member,
                i32_shape(2, slots, 256),
            );
            p.give_up = Duration::from_secs(5);
            let w = xagg_worker::Worker::new(p)?;
            let t = Instant::now();
            let e = w.allreduce(&mut [1i32; 256]).unwrap_err().to_string();
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(2),
                "told only after {:?}: {e}",
                t.elapsed()
            );
            Ok(e)
        })
        .unwrap()
    };
    let before = sw.counters();
    let e = attempt(11, 1, 4);
    assert!(
        e.contains("the switch refused this member: this is not member 1"),
        "{e}"
    );
    let e = attempt(99, 0, 4);
    assert!(e.contains("the switch has no job 99"), "{e}");
    // The first reply gives the job's slot count; the queries past it were refused.
    let e = attempt(11, 0, 8);
    assert!(
        e.contains("the job has 4 slots and this worker's --slots is 8"),
        "{e}"
    );
    let e = attempt(11, 0, 2);
    assert!(
        e.contains("the job has 4 slots and this worker's --slots is 2"),
        "{e}"
    );
    let after = sw.counters();
    for c in ["drop_not_member", "drop_unknown_job", "drop_slot_range"] {
        assert!(after[c] > before[c], "{c} counts the refusal");
    }
}

/// A lasting send failure (no route to the switch) ends the request at once with its
/// cause, unlike the passing refusals of a packet filter.
#[test]
fn no_route_to_the_switch_ends_the_request_with_its_cause() {
    if !require_root("no_route_to_the_switch_ends_the_request_with_its_cause") {
        return;
    }
    let sw = TestSwitch::start("xfj", 1, |_| {});
    let e = in_netns(&sw.lab.worker_ns(0), || {
        // 192.0.2.0/24 (TEST-NET-1): no route to it in the worker's namespace.
        let p = xagg_worker::WorkerParams::new(
            SocketAddrV4::new([192, 0, 2, 1].into(), DEFAULT_PORT),
            SocketAddrV4::new(lab::worker_ip(0), WORKER_PORT),
            1,
            0,
            i32_shape(1, 4, 256),
        );
        let w = xagg_worker::Worker::new(p)?;
        let t = Instant::now();
        let e = w.allreduce(&mut [1i32; 256]).unwrap_err().to_string();
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(2),
            "after {:?}: {e}",
            t.elapsed()
        );
        Ok(e)
    })
    .unwrap();
    assert!(e.contains("socket") && e.contains("unreachable"), "{e}");
}

/// How a forged frame is wrapped on the link: behind an 802.1Q priority tag (VID 0, which
/// Linux takes as untagged), an 802.1Q tag of VLAN 5, or 802.1ad + 802.1Q (Q-in-Q).
const WRAPS: [&[[u8; 2]]; 3] = [
    &[[0x81, 0x00]],
    &[[0x81, 0x00]],
    &[[0x88, 0xa8], [0x81, 0x00]],
];
const WRAP_VIDS: [u16; 3] = [0, 5, 7];

/// An Ethernet frame from `src_mac` to `dst_mac`, behind the tags `tpids` (each with VLAN
/// `vid`), carrying a UDP datagram of `payload` from `from` to `to` (no UDP checksum).
fn raw_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    tpids: &[[u8; 2]],
    vid: u16,
    from: SocketAddrV4,
    to: SocketAddrV4,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::with_capacity(64 + payload.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    for t in tpids {
        f.extend_from_slice(t);
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&[0x08, 0x00]);
    let ip = f.len();
    let total = (20 + 8 + payload.len()) as u16;
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&from.ip().octets());
    f.extend_from_slice(&to.ip().octets());
    let mut sum: u32 = f[ip..ip + 20]
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    f[ip + 10..ip + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&from.port().to_be_bytes());
    f.extend_from_slice(&to.port().to_be_bytes());
    f.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// Sends `frames` out of interface `dev` of namespace `ns` with a packet socket, over and
/// over until `stop` (at most 5 s); returns how many it sent.
fn inject(ns: &str, dev: &str, frames: &[Vec<u8>], stop: &AtomicBool) -> u64 {
    in_netns(ns, || {
        let ifindex = xagg_linux::iface::ifindex(dev)?;
        // Safety: plain socket calls on a descriptor owned here and closed at the end.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        anyhow::ensure!(
            fd >= 0,
            "packet socket: {}",
            std::io::Error::last_os_error()
        );
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = ifindex as i32;
        to.sll_halen = 6;
        let mut sent = 0;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            for f in frames {
                to.sll_addr[..6].copy_from_slice(&f[..6]);
                let n = unsafe {
                    libc::sendto(
                        fd,
                        f.as_ptr() as *const _,
                        f.len(),
                        0,
                        &to as *const libc::sockaddr_ll as *const libc::sockaddr,
                        std::mem::size_of::<libc::sockaddr_ll>() as u32,
                    )
                };
                if n == f.len() as isize {
                    sent += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        unsafe { libc::close(fd) };
        Ok(sent)
    })
    .unwrap()
}

/// A forged packet of kind `kind` for job `job`, message `message`, segment `segment` on
/// slot `segment % slots`: a result of `count` i32 of garbage, or a status reply refusing
/// the query (`status`).
fn forged(kind: Kind, job: u32, message: u32, segment: u32, slots: u32, count: u16) -> Vec<u8> {
    let mut b = Header::builder(kind)
        .op(Op::Sum)
        .dtype(DType::I32)
        .job(job)
        .message(message)
        .segment(segment)
        .slot((segment % slots) as u16);
    let payload = if kind == Kind::Result {
        b = b.count(count);
        vec![0x5au8; usize::from(count) * 4]
    } else {
        vec![0u8; wire::STATUS_PAYLOAD]
    };
    let mut h = b.build();
    if kind == Kind::StatusReply {
        h.status = wire::status::REFUSED_NOT_MEMBER;
    }
    let mut out = vec![0u8; wire::HEADER_LEN + payload.len() + 8];
    let n = wire::encode(&h, &payload, &mut out).unwrap();
    out.truncate(n);
    out
}

/// Every forgery of `kind` for job `job`, message `message` (64 segments over 8 slots,
/// 256 elements), to each of workers 0 and 1 from the switch's addresses and `src_mac`,
/// once in each of `WRAPS` (or untagged if `untagged`).
fn forgeries(
    sw: &TestSwitch,
    kind: Kind,
    job: u32,
    message: u32,
    src_mac: [u8; 6],
    untagged: bool,
) -> Vec<Vec<u8>> {
    let from = SocketAddrV4::new(SWITCH_IP, DEFAULT_PORT);
    let mut frames = Vec::new();
    for victim in [0, 1] {
        let mac = sw.lab.worker_mac(victim).unwrap();
        let to = SocketAddrV4::new(lab::worker_ip(victim), WORKER_PORT);
        for k in 0..64 {
            let p = forged(kind, job, message, k, 8, 256);
            if untagged {
                frames.push(raw_frame(mac, src_mac, &[], 0, from, to, &p));
            }
            for (tpids, vid) in WRAPS.iter().zip(WRAP_VIDS) {
                frames.push(raw_frame(mac, src_mac, tpids, vid, from, to, &p));
            }
        }
    }
    frames
}

/// What came of a run under injected frames: how many were sent, the switch's counters
/// before and after, and what the members' workers refused.
struct Injected {
    sent: u64,
    before: BTreeMap<String, u64>,
    after: BTreeMap<String, u64>,
    refused: u64,
}

impl Injected {
    /// How much counter `c` moved.
    fn delta(&self, c: &str) -> u64 {
        self.after[c] - self.before[c]
    }
}

/// Members 0 and 1 of job 12 run message `message` (member 1 starts `late`) while each
/// `(dev, frames)` of `injections` is sent out of `dev` in namespace `ns`; both results
/// must be exact.
fn run_under_injection(
    sw: &TestSwitch,
    message: u32,
    afxdp: bool,
    late: Duration,
    ns: &str,
    injections: &[(String, &[Vec<u8>])],
) -> Injected {
    let stop = AtomicBool::new(false);
    let before = sw.counters();
    std::thread::scope(|s| {
        let injectors: Vec<_> = injections
            .iter()
            .map(|(dev, frames)| s.spawn(|| inject(ns, dev, frames, &stop)))
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        let reports = sw.allreduce_with(
            &Allreduce {
                job: 12,
                message,
                segment: 256,
                slots: 8,
                workers: &[0, 1],
                port: WORKER_PORT,
                elems: 64 * 256,
                seed: 17 + u64::from(message),
            },
            |p| {
                p.afxdp = afxdp.then_some(xagg_objects::HOST);
                if p.member == 1 {
                    std::thread::sleep(late);
                }
            },
        );
        stop.store(true, Ordering::Relaxed);
        Injected {
            sent: injectors.into_iter().map(|i| i.join().unwrap()).sum(),
            before,
            after: sw.counters(),
            refused: reports.iter().map(|r| r.refused).sum(),
        }
    })
}

/// The one lab of the tagged-forgery tests, its job 12 of workers 0 and 1, worker 2 the
/// stranger.
fn tagged_lab(prefix: &str) -> TestSwitch {
    let sw = TestSwitch::start(prefix, 3, |_| {});
    assert!(matches!(
        sw.add_job(12, 256, 8, &[0, 1]),
        Response::Job { .. }
    ));
    sw
}

/// A stranger on the switch's segment (worker 2) sends results claiming the switch's
/// address and collective port behind a priority tag, a VLAN tag and two tags, while
/// member 0 waits for member 1: every result stays exact on both receive paths, every
/// forged frame is dropped as a spoofed source, and the switch copies none of them to the
/// members (result copies: exactly two per completed round).
#[test]
fn tagged_forged_results_change_no_result_and_are_not_copied() {
    if !require_root("tagged_forged_results_change_no_result_and_are_not_copied") {
        return;
    }
    let mut sw = tagged_lab("xfk");
    let stranger = sw.lab.worker_mac(2).unwrap();
    for (message, afxdp) in [(0, false), (1, true)] {
        if afxdp {
            // Each worker attaches its own xagg_host, with its AF_XDP socket.
            sw.lab.detach_hosts();
        }
        let frames = forgeries(&sw, Kind::Result, 12, message, stranger, false);
        let r = run_under_injection(
            &sw,
            message,
            afxdp,
            Duration::from_millis(300),
            &sw.lab.worker_ns(2),
            &[("eth0".into(), &frames)],
        );
        let (sent, after) = (r.sent, &r.after);
        let d = |c: &str| r.delta(c);
        eprintln!(
            "afxdp {afxdp}: {sent} tagged forgeries sent, {} dropped as spoofed, {} result copies for {} rounds",
            d("drop_spoofed_source"),
            d("result_copy"),
            d("complete")
        );
        assert!(sent > 0, "nothing was sent");
        assert!(
            d("drop_spoofed_source") >= sent,
            "{sent} sent, {} dropped",
            d("drop_spoofed_source")
        );
        assert_eq!(d("complete"), 64, "{after:?}");
        assert_eq!(d("result_copy"), 2 * d("complete"), "{after:?}");
    }
}

/// The same stranger sends refusals claiming the switch behind the same tags while the
/// members' workers start (their first status queries): every member starts and runs,
/// on both receive paths; then ICMP saying the path to the switch takes small frames.
#[test]
fn tagged_forged_refusals_do_not_stop_a_job() {
    if !require_root("tagged_forged_refusals_do_not_stop_a_job") {
        return;
    }
    let mut sw = tagged_lab("xfl");
    let stranger = sw.lab.worker_mac(2).unwrap();
    for (message, afxdp) in [(0, false), (1, true)] {
        if afxdp {
            sw.lab.detach_hosts();
        }
        let frames = forgeries(&sw, Kind::StatusReply, 12, message, stranger, false);
        let r = run_under_injection(
            &sw,
            message,
            afxdp,
            Duration::ZERO,
            &sw.lab.worker_ns(2),
            &[("eth0".into(), &frames)],
        );
        let (sent, spoofed) = (r.sent, r.delta("drop_spoofed_source"));
        eprintln!("afxdp {afxdp}: {sent} tagged refusals sent, {spoofed} dropped as spoofed");
        assert!(
            sent > 0 && spoofed >= sent,
            "{sent} sent, {spoofed} dropped"
        );
    }

    // The stranger sends member 0 ICMP "fragmentation needed" (MTU 552) from its own
    // address, quoting member 0's flow to the switch, while the job runs (ordinary IP: the
    // switch passes it). Taken, it lowered member 0's path MTU to the switch for 10 minutes
    // and every send of a 1 KiB segment failed (EMSGSIZE): the worker stopped, the job
    // stalled. Member 0's kernel receives them (its ICMP counter) and the job runs exact.
    let unreachable = || {
        // The thread's own view: in_netns moves this thread alone.
        let snmp = in_netns(&sw.lab.worker_ns(0), || {
            Ok(std::fs::read_to_string("/proc/thread-self/net/snmp")?)
        })
        .unwrap();
        let mut icmp = snmp.lines().filter(|l| l.starts_with("Icmp:"));
        let (names, values) = (icmp.next().unwrap(), icmp.next().unwrap());
        let at = names.split_whitespace().position(|n| n == "InDestUnreachs");
        values
            .split_whitespace()
            .nth(at.unwrap())
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let before = unreachable();
    let frames = [icmp_too_big(&sw, 552)];
    let r = run_under_injection(
        &sw,
        2,
        // The hosts' programs are detached by now: each worker attaches its own.
        true,
        Duration::from_millis(300),
        &sw.lab.worker_ns(2),
        &[("eth0".into(), &frames)],
    );
    let taken = unreachable() - before;
    eprintln!(
        "{} ICMP fragmentation-needed sent, {taken} received by member 0",
        r.sent
    );
    assert!(r.sent > 0 && taken > 0, "{} sent, {taken} received", r.sent);
}

/// An ICMP "fragmentation needed" with next-hop MTU `mtu` from worker 2 (the stranger) to
/// worker 0, quoting worker 0's datagram to the switch's collective port.
fn icmp_too_big(sw: &TestSwitch, mtu: u16) -> Vec<u8> {
    let ip_header = |len: usize, protocol: u8, from: [u8; 4], to: [u8; 4]| {
        let mut h = vec![0x45, 0];
        h.extend_from_slice(&(len as u16).to_be_bytes());
        h.extend_from_slice(&[0, 0, 0x40, 0, 64, protocol, 0, 0]);
        h.extend_from_slice(&from);
        h.extend_from_slice(&to);
        let c = xagg_lab::testrun::ipv4_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    };
    let (member, stranger) = (lab::worker_ip(0).octets(), lab::worker_ip(2).octets());
    let mut icmp = vec![3, 4, 0, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend(ip_header(1052, 17, member, SWITCH_IP.octets()));
    icmp.extend_from_slice(&WORKER_PORT.to_be_bytes());
    icmp.extend_from_slice(&DEFAULT_PORT.to_be_bytes());
    icmp.extend_from_slice(&1032u16.to_be_bytes());
    icmp.extend_from_slice(&[0, 0]);
    let c = xagg_lab::testrun::ipv4_checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = sw.lab.worker_mac(0).unwrap().to_vec();
    f.extend_from_slice(&sw.lab.worker_mac(2).unwrap());
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend(ip_header(20 + icmp.len(), 1, stranger, member));
    f.extend(icmp);
    f
}

/// Results and refusals that reach a member's link with the switch's MAC, address and port
/// but without the member's cookie (as from a misconfigured port or a hub: sent here out of
/// the member's own switch port, past every check of the switch) are ignored by the worker,
/// untagged and tagged, on both receive paths: results exact, the job runs.
#[test]
fn results_and_refusals_without_the_members_cookie_are_ignored() {
    if !require_root("results_and_refusals_without_the_members_cookie_are_ignored") {
        return;
    }
    let mut sw = tagged_lab("xfm");
    let switch_mac = in_netns(&sw.lab.switch_ns(), || Ok(xagg_linux::iface::mac("br0")?)).unwrap();
    let ns = sw.lab.switch_ns();
    let mut message = 0;
    for afxdp in [false, true] {
        if afxdp {
            sw.lab.detach_hosts();
        }
        for kind in [Kind::Result, Kind::StatusReply] {
            // Out of each member's own port, toward the member.
            let frames = forgeries(&sw, kind, 12, message, switch_mac, true);
            // Member 0's forgeries out of its port, member 1's out of its own. Member 1
            // starts late, so member 0 waits on them and member 1's first queries meet them.
            let (f0, f1) = frames.split_at(frames.len() / 2);
            let r = run_under_injection(
                &sw,
                message,
                afxdp,
                Duration::from_millis(300),
                &ns,
                &[
                    (xagg_lab::lab::Lab::port(0), f0),
                    (xagg_lab::lab::Lab::port(1), f1),
                ],
            );
            eprintln!(
                "afxdp {afxdp}, {kind:?}: {} forgeries on the members' links, {} refused by the workers",
                r.sent, r.refused
            );
            assert!(r.sent > 0);
            assert!(r.refused > 0, "the workers refused nothing");
            message += 1;
        }
    }
}
