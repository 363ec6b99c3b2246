//! What can go wrong in the daemon: its configuration, the dataplane (loading,
//! attaching, pinning, adopting, the map operations), the joins and their state file, a
//! host's join at its parent. The API answers a request's error with its text
//! (`{"result": "error", "message": ...}`); a join's refusal carries it to the member.
//!
//! A variant that prints the error it wraps does not also give it as its `source()`, so an
//! error chain printed whole says it once.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
    time::Duration,
};

use xagg_common::JobShape;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config {}: {error}", path.display())]
    ReadConfig {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The configuration file `path` is wrong: `error` says where.
    #[error("config {}: {error}", path.display())]
    Config { path: PathBuf, error: Box<Error> },
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// A value TOML or the key's type refuses, at the key the error's position names.
    #[error("line {line}, `{key}`: {message}{}", if message.starts_with("invalid") { format!("; write `{key}` as docs/daemon.md gives it: text (names, paths, addresses) in double quotes, numbers and true or false bare, lists in [ ]") } else { String::new() })]
    ConfigValue {
        key: String,
        line: usize,
        message: String,
    },
    /// Another daemon holds what this one's configuration claims.
    #[error("{}", taken(what, key, *pid, socket.as_deref()))]
    Taken {
        what: String,
        key: &'static str,
        pid: Option<u32>,
        socket: Option<String>,
    },
    #[error("the lock file {}: {error}", path.display())]
    Lock {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("switch.ports is empty: list the interfaces the switch aggregates on, e.g. ports = [\"eth1\", \"eth2\"]")]
    NoPorts,
    #[error(
        "switch.address is 0.0.0.0: give the switch's own IPv4 address, the one workers send to"
    )]
    NoAddress,
    #[error("switch.udp_port is 0: use a free UDP port (default {default})")]
    NoUdpPort { default: u16 },
    #[error("switch.udp_ports = {ports} (from udp_port {port}): use 1 to 64 consecutive ports that stay below 65536 (1, the default, unless flow rules steer slots by destination port)")]
    UdpPorts { port: u16, ports: u8 },
    #[error("switch.mac: {0}")]
    SwitchMac(xagg_linux::Error),
    #[error("switch.xdp_mode = \"{mode}\": use \"native\", \"generic\" or \"auto\"")]
    XdpMode { mode: String },
    #[error("switch.steer_cpus = \"{value}\": {why}; list the CPUs to fold contributions on as taskset does (\"2-5\", \"0,2\"), or leave the key out (each is folded on the CPU it came in on)")]
    SteerCpus { value: String, why: String },
    #[error("switch.steer_cpus: CPU {cpu} cannot take steered contributions: {error}")]
    SteerCpu {
        cpu: usize,
        #[source]
        error: aya::maps::xdp::XdpMapError,
    },
    #[error("switch.steer_cpus: giving CPU {cpu}'s folding thread its priority: {error}")]
    SteerThread {
        cpu: usize,
        #[source]
        error: std::io::Error,
    },
    #[error("the pinned dataplane at {pin} steers contributions to CPUs {pinned:?}, the configuration to {configured:?}: run `xaggd --reload --config FILE` (or `xagg detach --pin-path {pin}`) to replace it (running jobs are dropped), or restore the configuration")]
    SteerChanged {
        pin: PathBuf,
        pinned: Vec<usize>,
        configured: Vec<usize>,
    },
    #[error("daemon.socket_mode = \"{mode}\": use three octal digits, optionally after a 0, e.g. \"0660\" (the daemon's user and the socket's group may use the API) or \"0600\" (only the daemon's user)")]
    SocketMode { mode: String },
    #[error("daemon.socket_group = \"{group}\": no such group on this host; create it (`groupadd {group}`, then add the users who may manage jobs: `usermod -aG {group} USER`), or name an existing group, or leave the key out (the daemon's own group)")]
    NoGroup { group: String },
    #[error("daemon.socket_group = \"{group}\": cannot look the group up ({errno}); name a group from /etc/group, or leave the key out")]
    GroupLookup { group: String, errno: nix::Error },
    #[error("daemon.join_timeout_s and daemon.idle_timeout_s must be at least 1 (seconds), daemon.lease_s at least 3 (a rank renews every third of it)")]
    ZeroTimeout,
    #[error("credential[{index}].name = \"{name}\": give each credential a name of its own")]
    CredentialName { index: usize, name: String },
    #[error("[[job]] id = {id} is given by {count} [[job]] tables: each job needs an id of its own (renumber or delete all but one)")]
    DuplicateJob { id: u32, count: usize },
    #[error("credential {credential}: slot_quota = 0 lets it create no job: give the slots its jobs may hold")]
    NoQuota { credential: String },
    #[error("daemon.listen is set but no [[credential]] is: nobody could create a job over the network; add one (name, key_file, slot_quota)")]
    NoCredential,
    #[error("[parent] interface = \"{interface}\" is not one of switch.ports {ports:?}: the uplink is the port of this switch the parent (or a ring's other hosts) is behind; add it to switch.ports")]
    UplinkNotPort {
        interface: String,
        ports: Vec<String>,
    },
    #[error("credential {credential}: cannot read key_file {}: {error}", file.display())]
    ReadKey {
        credential: String,
        file: PathBuf,
        error: std::io::Error,
    },
    #[error("credential {credential}: key_file {}: {error}; write one with `openssl rand -hex 32 > {}`", file.display(), file.display())]
    BadKey {
        credential: String,
        file: PathBuf,
        error: xagg_join::Error,
    },

    #[error("{0}")]
    NoObject(&'static str),
    #[error("loading the XDP object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("object lacks map {0}")]
    NoMap(&'static str),
    #[error("object lacks program {0}")]
    NoProgram(&'static str),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("duplicating a program fd: {0}")]
    DupFd(std::io::Error),
    #[error(
        "attaching to {port}: {source} (try xdp_mode = \"generic\" if the driver lacks native XDP)"
    )]
    Attach {
        port: String,
        source: aya::programs::ProgramError,
    },
    /// A link that cannot be pinned; `what` is "link" or "tc link".
    #[error("{what} on {port} is not a bpf_link, cannot pin it: {error}")]
    Unpinnable {
        what: &'static str,
        port: String,
        error: aya::programs::links::LinkError,
    },
    #[error("switch.ports[{index}]: {error}")]
    Port {
        index: usize,
        error: xagg_linux::Error,
    },
    #[error("PORTS[{index}] = {port}: {error}")]
    PortMap {
        index: usize,
        port: String,
        error: aya::maps::xdp::XdpMapError,
    },
    /// This host's interfaces: the one holding the switch's address, its MAC.
    #[error(transparent)]
    Host(#[from] xagg_linux::Error),
    #[error("switch.address {0} is on no interface here: assign it to one (e.g. the bridge of the ports: its ARP answers tell workers where the switch is), or set switch.mac and give every worker a static neighbour for it (`ip neigh replace {0} lladdr MAC dev IFACE nud permanent`)")]
    AddressNotHere(Ipv4Addr),
    /// Where nothing answers ARP for the switch's address.
    #[error("switch.address {address} is on no interface here and switch.mac = {mac:?}: nothing answers the workers' ARP for {address}, so each worker needs a static neighbour (`ip neigh replace {address} lladdr {mac} dev IFACE nud permanent`) or proxy ARP on its network, or its hellos and contributions never leave it")]
    AddressWithMac { address: Ipv4Addr, mac: String },
    #[error("cannot bind {key} = {addr}: {error} (an address of this host, in switch.netns if that is set, that no other program listens on)")]
    Bind {
        key: &'static str,
        addr: std::net::SocketAddr,
        error: std::io::Error,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error(
        "pinning under {path}: {source} (is a bpffs mounted there? `mount -t bpf bpf /sys/fs/bpf`)"
    )]
    Pin {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("counting CPUs: {0}")]
    Cpus(std::io::Error),
    #[error("per-CPU values: {0}")]
    PerCpu(std::io::Error),
    #[error("{0}")]
    Job(#[from] xagg_api::Error),
    #[error("job {0} already exists: remove it first (`xagg job remove {0}`)")]
    JobExists(u32),
    #[error("no job {0} on this switch: `xagg job list` shows its jobs, `xagg job status` the jobs ranks joined")]
    NoJob(u32),
    #[error("job {id} needs {want} slots but the largest free range is smaller ({free} of {total} slots free in all): ask for fewer slots or remove a job")]
    NoSlots {
        id: u32,
        want: u32,
        free: u32,
        total: u32,
    },
    #[error("{name} = {p}: a probability is between 0 and 1")]
    Probability { name: &'static str, p: f64 },
    #[error("the pinned dataplane at {pin} was started with ports {pinned:?}, the configuration names {configured:?}: run `xagg detach --pin-path {pin}` (or `xaggd --reload --config FILE`) to replace it (running jobs are dropped), or restore the configuration")]
    PortsChanged {
        pin: PathBuf,
        pinned: Vec<String>,
        configured: Vec<String>,
    },
    #[error("the pinned dataplane at {pin} has map layout {pinned}, this build has layout {ours}: run `xaggd --reload --config FILE` (or `xagg detach --pin-path {pin}`, then start xaggd) to replace it with this build's (running jobs are dropped), or run the build that pinned it")]
    LayoutChanged {
        pin: PathBuf,
        pinned: u32,
        ours: u32,
    },
    #[error("encoding metrics: {0}")]
    Metrics(std::fmt::Error),

    #[error("unknown, spent or expired nonce: get a fresh one (GET /v1/nonce) for each request")]
    Nonce,
    #[error("no job has this key, and the join carries no admission to create one (the first rank to join needs the admission credential: a [[credential]] of the daemon, its name and key given as XAGG_CREDENTIAL and XAGG_CREDENTIAL_FILE to the MPI library and the PyTorch backend, or `--credential NAME --credential-file FILE` to `xagg allreduce --join`)")]
    NoAdmission,
    /// An unknown credential and a wrong key answer alike, so a stranger learns no names
    /// (the daemon's log tells them apart).
    #[error("credential `{credential}` is not one this daemon knows with that key: give the name and key of one of its [[credential]] (its key_file)")]
    AdmissionRefused { credential: String },
    #[error("the join's proof does not match the secret it carries")]
    SealedSecretProof,
    #[error("credential `{credential}` holds {used} of its {quota} slots; this job needs {needs} (`xagg job status` lists the joined jobs holding them; a job whose ranks died gives its slots back when their leases run out, daemon.lease_s; the drop-ins make a job of every communicator or process group they serve, of XAGG_SLOTS slots each: a smaller XAGG_SLOTS, or a larger slot_quota, fits more)")]
    OverQuota {
        credential: String,
        used: usize,
        quota: u32,
        needs: usize,
    },
    #[error("the switch is full: {free} slots free (after the jobs still gathering their ranks), this job needs {needs}")]
    SwitchFull { free: usize, needs: usize },
    #[error("the switch is full: all {indices} job indices are taken")]
    NoJobIndex { indices: u16 },
    /// `why` says how it ended (timed out, failed at its parent).
    #[error(
        "the job {why} and was removed (its slots are free): start all ranks again, with a new key"
    )]
    JobGone { why: String },
    #[error("the join's proof does not match the job's secret")]
    JobProof,
    #[error("the job has {} members, {} slots, {}-byte segments{}; this join says {}, {}, {}{}: every rank must give the same shape", job.members(), job.slots(), job.segment_bytes(), ranks_in_all(*job_ranks), join.members(), join.slots(), join.segment_bytes(), ranks_in_all(*join_ranks))]
    ShapeDiffers {
        job: JobShape,
        job_ranks: Option<u32>,
        join: JobShape,
        join_ranks: Option<u32>,
    },
    #[error("the job's shape: {0}")]
    Shape(xagg_common::ShapeError),
    #[error("levels: {ranks} ranks in all, this member standing for {weight} from rank {first}, {members} members here: a member stands for 1 or more of the job's ranks, and the job has at least its members")]
    Levels {
        ranks: u32,
        weight: u32,
        first: u32,
        members: usize,
    },
    #[error("{0} members: a join to a level its children gather (levels.open) states a shape of one member, itself")]
    OpenShape(usize),
    #[error("rank {rank} of a job of {members} members: ranks are 0 to {}", members.saturating_sub(1))]
    RankOutside { rank: u8, members: usize },
    /// A rank that left while the level joined its parent.
    #[error("member {0} left before the job could run")]
    MemberLeft(usize),
    #[error("interface index {0} is no longer a port")]
    PortGone(u32),
    #[error("reading {}: {error}", file.display())]
    ReadState {
        file: PathBuf,
        error: std::io::Error,
    },
    /// The joins' state file `file` is wrong: `error` says how.
    #[error("{}: {error}: move it away to start without the joined jobs it holds", file.display())]
    StateFile { file: PathBuf, error: Box<Error> },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A key or secret that is not hex, or a call to a parent's or coordinator's daemon.
    #[error(transparent)]
    Protocol(#[from] xagg_join::Error),

    #[error("a socket on {local} for hellos to the parent: {errno}")]
    HelloSocket {
        local: SocketAddrV4,
        errno: nix::Error,
    },
    #[error("has {ranks} ranks but this daemon has {members} of them and no [parent] to join for the rest")]
    NoParent { ranks: u32, members: usize },
    #[error("[parent] daemon = {daemon} needs credential and key_file: the admission credential this daemon creates jobs with there")]
    ParentCredential { daemon: std::net::SocketAddr },
    #[error("no [parent] daemon to join, and no coordinator for a ring")]
    NowhereToJoin,
    #[error("the parent's daemon does not tell its MAC (an older xaggd)")]
    NoParentMac,
    #[error("the parent refused it: {reason}")]
    ParentRefused { reason: String },
    #[error("the parent did not answer for {after:?}: {error}")]
    ParentSilent {
        after: Duration,
        error: xagg_join::Error,
    },
    #[error("the coordinator refused the ring: {reason}")]
    CoordinatorRefused { reason: String },
    /// `why` is why the tree failed, as told to the coordinator.
    #[error("the ring did not form within {timeout:?} ({why})")]
    NoRing { timeout: Duration, why: String },
    #[error("the parent's job did not run within {timeout:?}")]
    ParentNotRunning { timeout: Duration },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A job's ranks in all, where it has levels, for a message.
fn ranks_in_all(ranks: Option<u32>) -> String {
    ranks.map_or_else(String::new, |r| format!(" and {r} ranks in all"))
}

fn taken(what: &str, key: &str, pid: Option<u32>, socket: Option<&str>) -> String {
    let Some(pid) = pid else {
        return format!(
            "another xaggd already {what}: stop it first, or give this daemon another {key}"
        );
    };
    let at = socket
        .filter(|s| !s.is_empty())
        .map(|s| format!(", API socket {s}"))
        .unwrap_or_default();
    format!(
        "another xaggd (pid {pid}{at}) already {what}: stop it with `kill {pid}` (SIGTERM: a pinned dataplane keeps aggregating and the next daemon adopts it, jobs included; `xagg detach` would drop its jobs), or give this daemon another {key}"
    )
}
