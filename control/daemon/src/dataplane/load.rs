//! Loading the programs, attaching them to the ports, pinning them with the maps, and adopting
//! an earlier daemon's pinned dataplane.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::Mutex,
};

use aya::{
    maps::{Array, CpuMap, DevMap, HashMap, Map, MapData, PerCpuArray, ProgramArray},
    programs::{links::FdLink, tc, Program, SchedClassifier, TcAttachType, Xdp, XdpMode},
    Ebpf,
};
use log::{info, warn};
use xagg_common::{
    job::{Steer, SwitchConfig},
    slot::{Fold, DELIVER, DELIVER_PROGRAM},
    LAYOUT_VERSION,
};
use xagg_linux::{iface, XdpObject};

use crate::{
    config::{Config, XdpMode as Mode},
    dataplane::{map_err, pin_err, Dataplane, Error, Result, MAP_NAMES},
};

impl Dataplane {
    /// Adopts the pinned dataplane if there is one (and `pin` is set), else loads and
    /// attaches a fresh one from `object` (the switch's, `xagg_objects::SWITCH`). Must run in
    /// the ports' network namespace.
    pub fn start(cfg: &Config, object: XdpObject, pinned: bool) -> Result<Self> {
        let pin = pinned.then(|| cfg.daemon.pin_path.clone());
        if let Some(dir) = &pin {
            if let Some(pinned_ports) = Self::pinned_at(cfg)? {
                let mut dp = Self::adopt(dir)?;
                dp.ports = pinned_ports;
                let configured = cfg.steer_cpus()?;
                if dp.steer != configured {
                    return Err(Error::SteerChanged {
                        pin: dir.clone(),
                        pinned: dp.steer.clone(),
                        configured,
                    });
                }
                info!("adopted the pinned dataplane at {}", dir.display());
                dp.configure_switch(cfg)?;
                return Ok(dp);
            }
        }
        // A start that fails half-way leaves no pins behind, unless they were there.
        let fresh = pin.as_ref().is_some_and(|d| !d.exists());
        let loaded = Self::load(cfg, object, pin.clone());
        if let (Err(_), true, Some(dir)) = (&loaded, fresh, &pin) {
            let _ = xagg_linux::pins::unpin(dir);
        }
        loaded
    }

    /// The ports of the dataplane pinned at the configuration's pin path, if one is there
    /// and this configuration may adopt it (its layout this daemon's, its ports the
    /// configured ones); nothing is changed.
    pub fn pinned_at(cfg: &Config) -> Result<Option<Vec<String>>> {
        let dir = &cfg.daemon.pin_path;
        if !dir.join("maps/JOBS").exists() {
            return Ok(None);
        }
        let pinned = read_layout(dir)?;
        if pinned != LAYOUT_VERSION {
            return Err(Error::LayoutChanged {
                pin: dir.clone(),
                pinned,
                ours: LAYOUT_VERSION,
            });
        }
        let pinned_ports = read_ports(dir)?;
        if pinned_ports != cfg.switch.ports {
            return Err(Error::PortsChanged {
                pin: dir.clone(),
                pinned: pinned_ports,
                configured: cfg.switch.ports.clone(),
            });
        }
        Ok(Some(pinned_ports))
    }

    fn load(cfg: &Config, object: XdpObject, pin: Option<PathBuf>) -> Result<Self> {
        let mut ebpf = Ebpf::load(object.bytes().map_err(Error::NoObject)?)?;
        let mode = cfg.mode()?;
        let steer = cfg.steer_cpus()?;
        // Roughly the longest to verify first (the folds, the exact lanes' among the first),
        // so that the loading threads end together.
        let mut programs: Vec<_> = fold_programs().rev().map(|(_, name)| name).collect();
        // The steered path's programs are verified only where it is used.
        if !steer.is_empty() {
            programs.extend(Fold::ALL.iter().rev().map(|f| f.steered_program()));
            programs.push(STEERED_PROGRAM);
        }
        programs.extend(["xagg_fanout", "xagg_switch", "xagg_result"]);
        load_programs(&mut ebpf, &programs)?;

        let result: &mut Xdp = prog(&mut ebpf, "xagg_result")?;
        let result_fd = result
            .fd()
            .map_err(|source| Error::Program {
                name: "xagg_result",
                source,
            })?
            .try_clone()
            .map_err(Error::DupFd)?;

        if let Some(dir) = &pin {
            for sub in ["maps", "links", "links/fanout"] {
                fs::create_dir_all(dir.join(sub)).map_err(|e| pin_err(dir)(Box::new(e)))?;
            }
        }
        let mut maps = BTreeMap::new();
        for name in MAP_NAMES {
            let map = ebpf.take_map(name).ok_or(Error::NoMap(name))?;
            if let Some(dir) = &pin {
                let path = dir.join("maps").join(name);
                map.pin(&path).map_err(|e| pin_err(&path)(Box::new(e)))?;
            }
            maps.insert(name, map);
        }
        let mut take = |name: &'static str| maps.remove(name).expect("taken above");
        let mut layout: Array<MapData, u32> =
            Array::try_from(take("LAYOUT")).map_err(map_err("LAYOUT"))?;
        layout
            .set(0, LAYOUT_VERSION, 0)
            .map_err(map_err("LAYOUT"))?;

        let mut ports: DevMap<MapData> =
            DevMap::try_from(take("PORTS")).map_err(map_err("PORTS"))?;
        for (i, port) in cfg.switch.ports.iter().enumerate() {
            let ifindex = iface::ifindex(port).map_err(|error| Error::Port { index: i, error })?;
            ports
                .set(i as u32, ifindex, Some(&result_fd), 0)
                .map_err(|error| Error::PortMap {
                    index: i,
                    port: port.clone(),
                    error,
                })?;
        }

        let mut folds: ProgramArray<MapData> =
            ProgramArray::try_from(take("FOLDS")).map_err(map_err("FOLDS"))?;
        enter_folds(&mut ebpf, &mut folds)?;
        let mut steered_folds: ProgramArray<MapData> =
            ProgramArray::try_from(take("FOLDS_STEERED")).map_err(map_err("FOLDS_STEERED"))?;
        let cpus_map = take("CPUS");
        let cpus_id = match &cpus_map {
            Map::CpuMap(md) => md.info().map_err(map_err("CPUS"))?.id(),
            _ => return Err(Error::NoMap("CPUS")),
        };
        let mut cpus: CpuMap<MapData> = CpuMap::try_from(cpus_map).map_err(map_err("CPUS"))?;
        let mut steer_map: Array<MapData, Steer> =
            Array::try_from(take("STEER")).map_err(map_err("STEER"))?;
        if !steer.is_empty() {
            for f in Fold::ALL {
                let name = f.steered_program();
                let fd = prog(&mut ebpf, name)?
                    .fd()
                    .map_err(|source| Error::Program { name, source })?;
                steered_folds
                    .set(f as u32, fd, 0)
                    .map_err(map_err("FOLDS_STEERED"))?;
            }
            let fd = prog(&mut ebpf, STEERED_PROGRAM)?
                .fd()
                .map_err(|source| Error::Program {
                    name: STEERED_PROGRAM,
                    source,
                })?;
            let mut value = Steer {
                count: steer.len() as u32,
                ..Steer::default()
            };
            for (i, &cpu) in steer.iter().enumerate() {
                value.cpu[i] = cpu as u32;
                cpus.set(cpu as u32, STEER_QUEUE, Some(fd), 0)
                    .map_err(|error| Error::SteerCpu { cpu, error })?;
            }
            steer_map.set(0, value, 0).map_err(map_err("STEER"))?;
            first_in_line(cpus_id, &steer)?;
            info!("contributions are folded on CPUs {steer:?}, each slot on one of them");
        }

        // The fan-out of multi-buffer results, on each port's tc ingress.
        let fanout: &mut SchedClassifier = ebpf
            .program_mut("xagg_fanout")
            .ok_or(Error::NoProgram("xagg_fanout"))?
            .try_into()
            .map_err(|source| Error::Program {
                name: "xagg_fanout",
                source,
            })?;
        let mut fanout_links = Vec::new();
        let mut link_pins = Vec::new();
        for port in &cfg.switch.ports {
            let err = |source| Error::Attach {
                port: port.clone(),
                source,
            };
            // Kernels since 6.6 take the program without a qdisc (tcx), and nothing is left
            // on the port after it; older ones need a clsact qdisc, added only then (EEXIST:
            // the port has one), and left behind.
            let id = match fanout.attach(port, TcAttachType::Ingress) {
                Ok(id) => id,
                Err(_) => {
                    let _ = tc::qdisc_add_clsact(port);
                    fanout.attach(port, TcAttachType::Ingress).map_err(err)?
                }
            };
            let link = fanout.take_link(id).map_err(err)?;
            if pin.is_some() {
                let fd: FdLink = link.try_into().map_err(|error| Error::Unpinnable {
                    what: "tc link",
                    port: port.clone(),
                    error,
                })?;
                link_pins.push((format!("fanout/{port}"), fd));
            } else {
                fanout_links.push(link);
            }
        }

        let switch: &mut Xdp = prog(&mut ebpf, "xagg_switch")?;
        let mut links = Vec::new();
        for port in &cfg.switch.ports {
            let id = attach(switch, port, mode)?;
            let link = switch.take_link(id).map_err(|source| Error::Program {
                name: "xagg_switch",
                source,
            })?;
            if pin.is_some() {
                let fd: FdLink = link.try_into().map_err(|error| Error::Unpinnable {
                    what: "link",
                    port: port.clone(),
                    error,
                })?;
                link_pins.push((port.clone(), fd));
            } else {
                links.push(link);
            }
        }

        if let Some(dir) = &pin {
            for (port, fd) in link_pins {
                let path = dir.join("links").join(&port);
                fd.pin(&path).map_err(|e| pin_err(&path)(Box::new(e)))?;
            }
        }

        drop(ports);
        let mut dp = Self {
            jobs: Array::try_from(take("JOBS")).map_err(map_err("JOBS"))?,
            egress: HashMap::try_from(take("EGRESS")).map_err(map_err("EGRESS"))?,
            slots: Array::try_from(take("SLOTS")).map_err(map_err("SLOTS"))?,
            switch: Array::try_from(take("SWITCH")).map_err(map_err("SWITCH"))?,
            faults: Array::try_from(take("FAULTS")).map_err(map_err("FAULTS"))?,
            counters: PerCpuArray::try_from(take("COUNTERS")).map_err(map_err("COUNTERS"))?,
            hellos: HashMap::try_from(take("HELLOS")).map_err(map_err("HELLOS"))?,
            hello_released: HashMap::try_from(take("HELLO_RELEASED"))
                .map_err(map_err("HELLO_RELEASED"))?,
            parents: HashMap::try_from(take("PARENTS")).map_err(map_err("PARENTS"))?,
            job_counters: PerCpuArray::try_from(take("JOB_COUNTERS"))
                .map_err(map_err("JOB_COUNTERS"))?,
            drops: Array::try_from(take("DROPS")).map_err(map_err("DROPS"))?,
            pin,
            _links: links,
            _fanout_links: fanout_links,
            _folds: vec![folds, steered_folds],
            _cpus: Some(cpus),
            steer,
            _ebpf: Some(ebpf),
            adopted: false,
            ports: cfg.switch.ports.clone(),
        };
        dp.configure_switch(cfg)?;
        info!(
            "dataplane attached to {} ({})",
            cfg.switch.ports.join(", "),
            if dp.pin.is_some() {
                "pinned"
            } else {
                "detached on exit"
            }
        );
        Ok(dp)
    }

    fn adopt(dir: &Path) -> Result<Self> {
        let open = |name: &'static str| -> Result<Map> {
            let md = MapData::from_pin(dir.join("maps").join(name)).map_err(map_err(name))?;
            Map::from_map_data(md).map_err(map_err(name))
        };
        Ok(Self {
            jobs: Array::try_from(open("JOBS")?).map_err(map_err("JOBS"))?,
            egress: HashMap::try_from(open("EGRESS")?).map_err(map_err("EGRESS"))?,
            slots: Array::try_from(open("SLOTS")?).map_err(map_err("SLOTS"))?,
            switch: Array::try_from(open("SWITCH")?).map_err(map_err("SWITCH"))?,
            faults: Array::try_from(open("FAULTS")?).map_err(map_err("FAULTS"))?,
            counters: PerCpuArray::try_from(open("COUNTERS")?).map_err(map_err("COUNTERS"))?,
            hellos: HashMap::try_from(open("HELLOS")?).map_err(map_err("HELLOS"))?,
            hello_released: HashMap::try_from(open("HELLO_RELEASED")?)
                .map_err(map_err("HELLO_RELEASED"))?,
            parents: HashMap::try_from(open("PARENTS")?).map_err(map_err("PARENTS"))?,
            job_counters: PerCpuArray::try_from(open("JOB_COUNTERS")?)
                .map_err(map_err("JOB_COUNTERS"))?,
            drops: Array::try_from(open("DROPS")?).map_err(map_err("DROPS"))?,
            pin: Some(dir.to_owned()),
            _links: Vec::new(),
            _fanout_links: Vec::new(),
            _folds: Vec::new(),
            _cpus: None,
            steer: read_steer(&Array::try_from(open("STEER")?).map_err(map_err("STEER"))?)?,
            _ebpf: None,
            adopted: true,
            ports: Vec::new(),
        })
    }

    /// Writes the switch's address, port and MAC into the `SWITCH` map.
    fn configure_switch(&mut self, cfg: &Config) -> Result<()> {
        let mac = match &cfg.switch.mac {
            Some(m) => iface::parse_mac(m)?,
            None => {
                let holder = iface::holding(cfg.switch.address)?
                    .ok_or(Error::AddressNotHere(cfg.switch.address))?;
                iface::mac(&holder)?
            }
        };
        let value = SwitchConfig {
            ip: cfg.switch.address.octets(),
            port: cfg.switch.udp_port.to_be_bytes(),
            ports: cfg.switch.udp_ports,
            _pad: [0; 3],
            mac,
        };
        self.switch.set(0, value, 0).map_err(map_err("SWITCH"))
    }

    pub fn pinned(&self) -> bool {
        self.pin.is_some()
    }
}

/// The map layout of a pinned dataplane: its `LAYOUT` map, or 1 when it has none (pinned
/// by a build from before layouts were versioned).
fn read_layout(dir: &Path) -> Result<u32> {
    let path = dir.join("maps/LAYOUT");
    if !path.exists() {
        return Ok(1);
    }
    let md = MapData::from_pin(&path).map_err(map_err("LAYOUT"))?;
    let layout: Array<MapData, u32> =
        Array::try_from(Map::from_map_data(md).map_err(map_err("LAYOUT"))?)
            .map_err(map_err("LAYOUT"))?;
    layout.get(&0, 0).map_err(map_err("LAYOUT"))
}

/// The ports of a pinned dataplane, from its broadcast devmap (bpffs holds no plain
/// files, and the devmap is what the dataplane really uses).
fn read_ports(dir: &Path) -> Result<Vec<String>> {
    let md = MapData::from_pin(dir.join("maps/PORTS")).map_err(map_err("PORTS"))?;
    let ports: DevMap<MapData> =
        DevMap::try_from(Map::from_map_data(md).map_err(map_err("PORTS"))?)
            .map_err(map_err("PORTS"))?;
    let mut names = Vec::new();
    for i in 0..ports.len() {
        match ports.get(i, 0) {
            Ok(v) if v.if_index != 0 => names.push(
                nix::net::if_::if_indextoname(v.if_index)
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| format!("ifindex {}", v.if_index)),
            ),
            _ => break,
        }
    }
    Ok(names)
}

/// The program the cpumap runs on a steered contribution's CPU.
const STEERED_PROGRAM: &str = "xagg_switch_steered";

/// Frames each steering CPU's queue holds: a whole window of every port's bursts (a
/// full queue drops, and the worker recovers by retransmission after its timeout).
const STEER_QUEUE: u32 = 4096;

/// Gives the cpumap's threads (one per steering CPU, named `cpumap/CPU/map:ID`) the
/// first turn on their CPUs: at equal weight, the ports' packet processing on the same
/// CPU (one thread per port) filled a thread's queue faster than it got to run, and the
/// queue dropped a sixth of the contributions (measured, 4 ports on one CPU).
fn first_in_line(id: u32, steer: &[usize]) -> Result<()> {
    const NICE: i32 = -10;
    for &cpu in steer {
        // A thread's name is cut at 15 bytes.
        let mut name = format!("cpumap/{cpu}/map:{id}");
        name.truncate(15);
        let threads = xagg_linux::proc::threads_named(&name)?;
        if threads.is_empty() {
            warn!("no thread {name} found to put first in line on CPU {cpu}");
        }
        for pid in threads {
            xagg_linux::proc::set_nice(pid, NICE)
                .map_err(|error| Error::SteerThread { cpu, error })?;
        }
    }
    Ok(())
}

/// The CPUs a dataplane's `STEER` map steers to.
fn read_steer(map: &Array<MapData, Steer>) -> Result<Vec<usize>> {
    let s = map.get(&0, 0).map_err(map_err("STEER"))?;
    Ok(s.cpu[..(s.count as usize).min(s.cpu.len())]
        .iter()
        .map(|&c| c as usize)
        .collect())
}

/// The fold programs and `xagg_deliver` after them, each with its index in `FOLDS`.
fn fold_programs() -> impl DoubleEndedIterator<Item = (u32, &'static str)> {
    Fold::ALL
        .iter()
        .map(|f| (*f as u32, f.program()))
        .chain([(DELIVER, DELIVER_PROGRAM)])
}

/// Loads every fold program of `ebpf` and enters it in `folds` (the object's `FOLDS` map),
/// where `xagg_switch` finds it by its `Fold`, and `xagg_deliver` after them.
pub fn load_folds(ebpf: &mut Ebpf, folds: &mut ProgramArray<MapData>) -> Result<()> {
    let names: Vec<&'static str> = fold_programs().map(|(_, name)| name).collect();
    load_programs(ebpf, &names)?;
    enter_folds(ebpf, folds)
}

/// Enters the loaded fold programs in `folds`.
fn enter_folds(ebpf: &mut Ebpf, folds: &mut ProgramArray<MapData>) -> Result<()> {
    for (index, name) in fold_programs() {
        let fd = prog(ebpf, name)?
            .fd()
            .map_err(|source| Error::Program { name, source })?;
        folds.set(index, fd, 0).map_err(map_err("FOLDS"))?;
    }
    Ok(())
}

/// Loads the programs `names` of `ebpf` (a name may repeat: folds share programs), in that
/// order, on as many threads as there are CPUs: nearly all of a daemon's start is the
/// kernel verifying them (2.4–3.2 s of CPU, the exact lanes' folds the longest at 0.3 s
/// each), and the verifier runs on the loading thread.
pub fn load_programs(ebpf: &mut Ebpf, names: &[&'static str]) -> Result<()> {
    let mut queue: Vec<(&'static str, &mut Program)> = Vec::with_capacity(names.len());
    for (name, p) in ebpf.programs_mut() {
        if let Some(&name) = names.iter().find(|n| **n == name) {
            queue.push((name, p));
        }
    }
    if let Some(&missing) = names.iter().find(|n| !queue.iter().any(|(q, _)| q == *n)) {
        return Err(Error::NoProgram(missing));
    }
    // Taken from the end.
    queue.sort_by_key(|(name, _)| std::cmp::Reverse(names.iter().position(|n| n == name)));
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(queue.len());
    let queue = Mutex::new(queue);
    let next = || queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    while let Some((name, p)) = next() {
                        let loaded = match p {
                            Program::Xdp(x) => x.load(),
                            Program::SchedClassifier(c) => c.load(),
                            _ => Err(aya::programs::ProgramError::UnexpectedProgramType),
                        };
                        loaded.map_err(|source| Error::Program { name, source })?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a loading thread does not panic"))
    })
}

fn prog<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp> {
    ebpf.program_mut(name)
        .ok_or(Error::NoProgram(name))?
        .try_into()
        .map_err(|source| Error::Program { name, source })
}

fn attach(prog: &mut Xdp, port: &str, mode: Mode) -> Result<aya::programs::xdp::XdpLinkId> {
    let err = |source| Error::Attach {
        port: port.to_owned(),
        source,
    };
    match mode {
        Mode::Native => prog.attach(port, XdpMode::Driver).map_err(err),
        Mode::Generic => prog.attach(port, XdpMode::Skb).map_err(err),
        Mode::Auto => match prog.attach(port, XdpMode::Driver) {
            Ok(id) => Ok(id),
            Err(e) => {
                warn!("native XDP on {port} failed ({e}); falling back to generic mode, which is slower");
                prog.attach(port, XdpMode::Skb).map_err(err)
            }
        },
    }
}
