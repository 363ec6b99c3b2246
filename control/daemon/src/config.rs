//! The daemon's configuration file (TOML). Every key is documented in `docs/daemon.md`;
//! errors name the key and the fix.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Deserializer, Serialize};

use xagg_api::{JobSpec, DEFAULT_PIN_PATH, DEFAULT_SOCKET};
use xagg_common::job::{MAX_STEER, MAX_SWITCH_PORTS};

use crate::{Error, Result};

/// The API socket's permissions by default: its owner (root) and its group.
pub const DEFAULT_SOCKET_MODE: &str = "0660";

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub switch: SwitchSection,
    #[serde(default)]
    pub daemon: DaemonSection,
    /// Jobs added at start (unless already present in a pinned dataplane).
    #[serde(default, rename = "job", skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobSpec>,
    /// Admission credentials: who may create jobs over the network, and how many slots.
    #[serde(default, rename = "credential", skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<CredentialSection>,
    /// This aggregation point's parent, if it is a host or a lower switch: jobs joined
    /// here with ranks beyond this point's members join the parent's daemon as one member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentSection>,
    /// Ranks' ends of veths whose host ends are this daemon's ports, given `xagg_host` at
    /// start (as `xagg host attach` does), so their ranks get results.
    #[serde(default, rename = "host_end", skip_serializing_if = "Vec::is_empty")]
    pub host_ends: Vec<HostEndSection>,
}

/// A rank's end of a veth (`[[host_end]]`): its interface, in its network namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEndSection {
    /// The rank's interface (e.g. `eth0` in a container).
    pub iface: String,
    /// Its network namespace, as `ip netns` names it (a container's: `ip netns attach NAME
    /// PID` names it).
    pub netns: String,
}

/// The aggregation point above this one (`[parent]`): nothing is configured per job.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParentSection {
    /// The uplink: the port of this switch the parent (or a ring's other hosts) is behind.
    pub interface: String,
    /// The parent daemon's network listener (its `daemon.listen`); none: no aggregating
    /// switch above, jobs with more ranks than this host's go round a ring of hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<std::net::SocketAddr>,
    /// The admission credential this daemon gives the parent to create jobs there: its
    /// name at the parent and a file holding its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// How long the parent may not answer before a job goes round the ring instead (when
    /// its ranks named a coordinator), in milliseconds.
    #[serde(default = "default_ring_after")]
    pub ring_after_ms: u64,
}

fn default_ring_after() -> u64 {
    2000
}

/// An admission credential (`[[credential]]`): its key stays in a file of its own, never
/// in the configuration, a log or a listing.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialSection {
    /// The name joins give.
    pub name: String,
    /// A file holding the key: 64 hexadecimal digits (e.g. `openssl rand -hex 32`),
    /// readable by the daemon only.
    pub key_file: PathBuf,
    /// Slots all the jobs created with this credential may hold at once.
    pub slot_quota: u32,
}

impl CredentialSection {
    /// Says so when the key file is open to other users than its owner (its key then is
    /// anyone's on this host), with the command that closes it.
    pub fn open_to_others(&self) -> Option<String> {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&self.key_file).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then(|| {
            format!(
                "credential {}: its key file {} is mode {mode:04o}, so other users of this host can read the key: `chmod 0600 {}`",
                self.name,
                self.key_file.display(),
                self.key_file.display()
            )
        })
    }

    /// Reads the key from its file.
    pub fn key(&self) -> Result<xagg_join::CredentialKey> {
        let text = std::fs::read_to_string(&self.key_file).map_err(|error| Error::ReadKey {
            credential: self.name.clone(),
            file: self.key_file.clone(),
            error,
        })?;
        text.parse().map_err(|error| Error::BadKey {
            credential: self.name.clone(),
            file: self.key_file.clone(),
            error,
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSection {
    /// Switch ports: the interfaces the switch program is attached to.
    pub ports: Vec<String>,
    /// The switch's own IPv4 address: workers send contributions to it.
    pub address: Ipv4Addr,
    /// UDP port of the collective protocol.
    #[serde(default = "default_port")]
    pub udp_port: u16,
    /// Collective ports, from `udp_port` on: workers send each slot's contributions to
    /// `udp_port + slot % udp_ports`, so that a NIC's flow rules on the destination port
    /// (`ethtool -N IF flow-type udp4 dst-port P action Q`) give each slot one receive queue
    /// and CPU. Results come from `udp_port`.
    #[serde(default = "default_udp_ports")]
    pub udp_ports: u8,
    /// Source MAC of results; by default the MAC of the interface holding `address`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// `native`, `generic`, or `auto` (native, falling back to generic with a warning).
    #[serde(default = "default_mode")]
    pub xdp_mode: String,
    /// Network namespace (from `ip netns add`) the ports live in; the daemon's threads
    /// enter it, its mounts stay the host's so pins outlive it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// CPUs to fold contributions on (`"0-3"`): each slot's contributions are handed to one
    /// of them (through a cpumap) wherever they came in, so its state stays in one cache
    /// and its lock is never contended; none: each is folded where it came in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steer_cpus: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    /// Unix socket of the local API.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Permissions of the API socket, in octal: whoever may write to it may add and remove
    /// jobs, inject faults and detach the switch.
    #[serde(default = "default_socket_mode", deserialize_with = "octal_string")]
    pub socket_mode: String,
    /// Group owning the API socket; by default the daemon's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<String>,
    /// Directory in a bpffs where programs, links and maps are pinned.
    #[serde(default = "default_pin_path")]
    pub pin_path: PathBuf,
    /// Detach the dataplane when the daemon exits instead of leaving it running.
    #[serde(default)]
    pub detach_on_exit: bool,
    /// Address and TCP port of the network listener, where workers join jobs (it serves
    /// only nonces, joins, leaves and a member's own job status); none: no listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<std::net::SocketAddr>,
    /// Address and TCP port of the Prometheus endpoint (`GET /metrics`); none: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Where the daemon keeps the joined jobs' state (keys, secrets, members), so they
    /// survive a restart; the file in it is readable by the daemon only.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// Seconds a joined job waits for all its ranks before its joins fail.
    #[serde(default = "default_join_timeout")]
    pub join_timeout_s: u64,
    /// Seconds an open level (a parent's job, whose members are other daemons) may make
    /// no progress before it is removed.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_s: u64,
    /// Seconds a rank keeps its membership of a joined job without renewing it: its
    /// worker renews it while the rank's process lives, however long it is idle, and a
    /// job whose rank stopped renewing (its process is gone) is removed.
    #[serde(default = "default_lease")]
    pub lease_s: u64,
}

impl Default for DaemonSection {
    fn default() -> Self {
        Self {
            socket: default_socket(),
            socket_mode: default_socket_mode(),
            socket_group: None,
            pin_path: default_pin_path(),
            detach_on_exit: false,
            listen: None,
            metrics: None,
            state_dir: default_state_dir(),
            join_timeout_s: default_join_timeout(),
            idle_timeout_s: default_idle_timeout(),
            lease_s: default_lease(),
        }
    }
}

fn default_state_dir() -> PathBuf {
    "/var/lib/xagg".into()
}
fn default_join_timeout() -> u64 {
    60
}
fn default_idle_timeout() -> u64 {
    600
}
fn default_lease() -> u64 {
    30
}
fn default_port() -> u16 {
    xagg_common::wire::DEFAULT_PORT
}
fn default_udp_ports() -> u8 {
    1
}
fn default_mode() -> String {
    "auto".into()
}
fn default_socket() -> PathBuf {
    DEFAULT_SOCKET.into()
}
fn default_pin_path() -> PathBuf {
    DEFAULT_PIN_PATH.into()
}
fn default_socket_mode() -> String {
    DEFAULT_SOCKET_MODE.into()
}

/// `daemon.socket_mode` as written: a string, because a TOML number is decimal
/// (`socket_mode = 660` would be mode 01224).
fn octal_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Text(String),
        Number(i64),
    }
    match Written::deserialize(d)? {
        Written::Text(s) => Ok(s),
        Written::Number(n) => Err(serde::de::Error::custom(format!(
            "daemon.socket_mode = {n}: write the mode as an octal string, e.g. socket_mode = \"{DEFAULT_SOCKET_MODE}\""
        ))),
    }
}

impl DaemonSection {
    /// The API socket's permission bits (`daemon.socket_mode`).
    pub fn socket_mode(&self) -> Result<u32> {
        let m = &self.socket_mode;
        let digits = m.strip_prefix('0').filter(|d| d.len() == 3).unwrap_or(m);
        match u32::from_str_radix(digits, 8) {
            Ok(mode) if digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(mode),
            _ => Err(Error::SocketMode { mode: m.clone() }),
        }
    }

    /// The group the API socket is given (`daemon.socket_group`); `None`: the daemon's own.
    pub fn socket_gid(&self) -> Result<Option<nix::unistd::Gid>> {
        let Some(name) = &self.socket_group else {
            return Ok(None);
        };
        match nix::unistd::Group::from_name(name) {
            Ok(Some(g)) => Ok(Some(g.gid)),
            Ok(None) => Err(Error::NoGroup {
                group: name.clone(),
            }),
            Err(errno) => Err(Error::GroupLookup {
                group: name.clone(),
                errno,
            }),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    Native,
    Generic,
    Auto,
}

impl Config {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|error| Error::ReadConfig {
            path: path.to_owned(),
            error,
        })?;
        Self::parse(&text).map_err(|e| Error::Config {
            path: path.to_owned(),
            error: Box::new(e),
        })
    }

    /// The configuration as a TOML file.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a configuration serializes")
    }

    pub fn parse(text: &str) -> Result<Self> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            match e.span().and_then(|s| key_at(text, s.start)) {
                Some((key, line)) => Error::ConfigValue {
                    key,
                    line,
                    message: e.message().trim_end().to_string(),
                },
                None => Error::Toml(e),
            }
        })?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        let s = &self.switch;
        if s.ports.is_empty() {
            return Err(Error::NoPorts);
        }
        if s.address.is_unspecified() {
            return Err(Error::NoAddress);
        }
        if s.udp_port == 0 {
            return Err(Error::NoUdpPort {
                default: default_port(),
            });
        }
        if s.udp_ports == 0
            || s.udp_ports > MAX_SWITCH_PORTS
            || u32::from(s.udp_port) + u32::from(s.udp_ports) - 1 > u32::from(u16::MAX)
        {
            return Err(Error::UdpPorts {
                port: s.udp_port,
                ports: s.udp_ports,
            });
        }
        if let Some(m) = &s.mac {
            xagg_linux::iface::parse_mac(m).map_err(Error::SwitchMac)?;
        }
        self.mode()?;
        self.steer_cpus()?;
        self.daemon.socket_mode()?;
        self.daemon.socket_gid()?;
        if self.daemon.join_timeout_s == 0
            || self.daemon.idle_timeout_s == 0
            || self.daemon.lease_s < 3
        {
            return Err(Error::ZeroTimeout);
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, c) in self.credentials.iter().enumerate() {
            if c.name.is_empty() || !names.insert(c.name.as_str()) {
                return Err(Error::CredentialName {
                    index: i,
                    name: c.name.clone(),
                });
            }
            if c.slot_quota == 0 {
                return Err(Error::NoQuota {
                    credential: c.name.clone(),
                });
            }
        }
        // Checked here, not when the jobs are added: a start would attach the dataplane
        // first (and `--reload` replace the running one) before finding the second.
        let mut ids = std::collections::BTreeMap::new();
        for j in &self.jobs {
            *ids.entry(j.id).or_insert(0usize) += 1;
        }
        if let Some((&id, &count)) = ids.iter().find(|(_, &n)| n > 1) {
            return Err(Error::DuplicateJob { id, count });
        }
        if self.daemon.listen.is_some() && self.credentials.is_empty() {
            return Err(Error::NoCredential);
        }
        if let Some(p) = &self.parent {
            if !s.ports.contains(&p.interface) {
                return Err(Error::UplinkNotPort {
                    interface: p.interface.clone(),
                    ports: s.ports.clone(),
                });
            }
        }
        Ok(())
    }

    /// The credential this daemon gives its parent (`[parent]`'s `credential` and
    /// `key_file`), when it joins one; a parent daemon named without both is an error.
    pub fn parent_credential(&self) -> Result<Option<CredentialSection>> {
        let Some(p) = &self.parent else {
            return Ok(None);
        };
        match (p.daemon, &p.credential, &p.key_file) {
            (None, _, _) => Ok(None),
            (Some(_), Some(name), Some(key_file)) => Ok(Some(CredentialSection {
                name: name.clone(),
                key_file: key_file.clone(),
                slot_quota: 0,
            })),
            (Some(daemon), _, _) => Err(Error::ParentCredential { daemon }),
        }
    }

    /// The CPUs `switch.steer_cpus` lists (none when it is not set).
    pub fn steer_cpus(&self) -> Result<Vec<usize>> {
        let Some(text) = &self.switch.steer_cpus else {
            return Ok(Vec::new());
        };
        let bad = |why: String| Error::SteerCpus {
            value: text.clone(),
            why,
        };
        let cpus = xagg_linux::cpus::parse(text).map_err(bad)?;
        let available = xagg_linux::cpus::available();
        if let Some(c) = cpus.iter().find(|&&c| c >= available) {
            return Err(bad(format!(
                "CPU {c} does not exist: this host has CPUs 0 to {}",
                available - 1
            )));
        }
        if cpus.is_empty() || cpus.len() > MAX_STEER {
            return Err(bad(format!("name 1 to {MAX_STEER} CPUs")));
        }
        Ok(cpus)
    }

    pub fn mode(&self) -> Result<XdpMode> {
        match self.switch.xdp_mode.as_str() {
            "native" => Ok(XdpMode::Native),
            "generic" => Ok(XdpMode::Generic),
            "auto" => Ok(XdpMode::Auto),
            m => Err(Error::XdpMode { mode: m.into() }),
        }
    }
}

/// The key whose line holds byte `at` of a TOML text, as `section.key`, and that line's
/// number: where a parse error points, named as the docs name keys.
fn key_at(text: &str, at: usize) -> Option<(String, usize)> {
    let before = text.get(..at.min(text.len()))?;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let key = line.split_once('=')?.0.trim();
    if key.is_empty() || key.starts_with(['[', '#']) {
        return None;
    }
    let section = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|h| h.trim_matches(['[', ']']).trim().to_string());
    let key = section.map_or(key.to_string(), |s| format!("{s}.{key}"));
    Some((key, before.matches('\n').count() + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value of the wrong type, or one TOML cannot read (an address unquoted), is named
    /// by its key and line, with how to write it; a mistyped key as TOML says it, named too.
    #[test]
    fn a_bad_value_names_its_key() {
        let cases = [
            (
                "[switch]\nports = [\"p0\"]\naddress = \"10.0.0.1\"\nudp_port = \"47800\"\n",
                "line 4, `switch.udp_port`: invalid type: string \"47800\", expected u16; write `switch.udp_port` as docs/daemon.md gives it",
            ),
            (
                "[switch]\nports = [\"p0\"]\naddress = 10.0.0.1\n",
                "line 3, `switch.address`: invalid",
            ),
            (
                "[switch]\nports = [\"p0\"]\naddress = \"10.0.0.1\"\n[daemon]\nsocket = \"/tmp/s\"\nlisten = true\n",
                "line 6, `daemon.listen`: invalid type: boolean `true`",
            ),
            (
                "[switch]\nports = [\"p0\"]\nadress = \"10.0.0.1\"\n",
                "line 3, `switch.adress`: unknown field `adress`",
            ),
        ];
        for (text, want) in cases {
            let got = Config::parse(text).unwrap_err().to_string();
            assert!(got.starts_with(want), "{text}: {got}");
        }
    }

    #[test]
    fn minimal() {
        let c = Config::parse("[switch]\nports = [\"p0\"]\naddress = \"10.0.0.1\"\n").unwrap();
        assert_eq!(c.switch.udp_port, 47800);
        assert!(!c.daemon.detach_on_exit);
        assert_eq!(c.mode().ok(), Some(XdpMode::Auto));
    }

    #[test]
    fn written_as_read() {
        let c = Config::parse(
            "[switch]\nports = [\"p0\", \"p1\"]\naddress = \"10.0.0.1\"\nnetns = \"ns\"\n[daemon]\nsocket = \"/tmp/s\"\n",
        )
        .unwrap();
        let again = Config::parse(&c.to_toml()).unwrap();
        assert_eq!(again.to_toml(), c.to_toml());
        assert_eq!(again.switch.ports, ["p0", "p1"]);
        assert_eq!(again.switch.netns.as_deref(), Some("ns"));
        assert_eq!(again.daemon.socket, PathBuf::from("/tmp/s"));
    }

    /// Two `[[job]]` tables of one id: refused as the file is read (so `--check` says
    /// it), not by a start that attached the dataplane first.
    #[test]
    fn a_job_id_given_twice_is_refused() {
        let job = |port: u16| {
            format!("[[job]]\nid = 1\nsegment = 860\nslots = 16\nmembers = [ {{ interface = \"a\", mac = \"02:00:00:00:00:01\", addr = \"10.0.0.11:{port}\" }} ]\n")
        };
        let head = "[switch]\nports = [\"a\"]\naddress = \"10.0.0.1\"\n";
        assert!(Config::parse(&format!("{head}{}", job(1))).is_ok());
        let e = Config::parse(&format!("{head}{}{}", job(1), job(2)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[[job]] id = 1 is given by 2 [[job]] tables"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::parse("[switch]\nports = []\naddress = \"10.0.0.1\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("switch.ports"), "{e}");
        let e = Config::parse(
            "[switch]\nports = [\"a\"]\naddress = \"10.0.0.1\"\nxdp_mode = \"fast\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("switch.xdp_mode"), "{e}");
        let e = Config::parse("[switch]\nports = [\"a\"]\naddress = \"10.0.0.300\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("address"), "{e}");
        let e = Config::parse("[switch]\nports = [\"a\"]\naddress = \"10.0.0.1\"\nportz = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("portz"), "{e}");
        for (key, value, says) in [
            ("udp_ports", "0", "1 to 64"),
            ("udp_ports", "65", "1 to 64"),
            ("steer_cpus", "\"2-1\"", "not a CPU or a range"),
            ("steer_cpus", "\"100000\"", "does not exist"),
        ] {
            let e = Config::parse(&format!(
                "[switch]\nports = [\"a\"]\naddress = \"10.0.0.1\"\n{key} = {value}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(
                e.contains(&format!("switch.{key}")) && e.contains(says),
                "{e}"
            );
        }
        let c = Config::parse(
            "[switch]\nports = [\"a\"]\naddress = \"10.0.0.1\"\nudp_ports = 4\nsteer_cpus = \"0\"\n",
        )
        .unwrap();
        assert_eq!((c.switch.udp_ports, c.steer_cpus().unwrap()), (4, vec![0]));
        // The uplink is one of the ports: a job's partials leave through it.
        let up = |iface: &str| {
            Config::parse(&format!(
                "[switch]\nports = [\"a\", \"up0\"]\naddress = \"10.0.0.1\"\n[parent]\ninterface = \"{iface}\"\n"
            ))
        };
        assert!(up("up0").is_ok());
        let e = up("up1").unwrap_err().to_string();
        assert!(
            e.contains("[parent] interface = \"up1\" is not one of switch.ports")
                && e.contains("add it to switch.ports"),
            "{e}"
        );
    }

    fn with_daemon(keys: &str) -> Result<Config> {
        Config::parse(&format!(
            "[switch]\nports = [\"a\"]\naddress = \"10.0.0.1\"\n[daemon]\n{keys}\n"
        ))
    }

    #[test]
    fn socket_permissions() {
        let c = with_daemon("").unwrap();
        assert_eq!(c.daemon.socket_mode().ok(), Some(0o660));
        assert_eq!(c.daemon.socket_gid().ok(), Some(None));
        for (written, mode) in [("0600", 0o600), ("660", 0o660), ("0666", 0o666)] {
            let c = with_daemon(&format!("socket_mode = \"{written}\"")).unwrap();
            assert_eq!(c.daemon.socket_mode().ok(), Some(mode), "{written}");
            let again = Config::parse(&c.to_toml()).unwrap();
            assert_eq!(again.daemon.socket_mode().ok(), Some(mode), "{written}");
        }
        let c = with_daemon("socket_group = \"root\"").unwrap();
        assert_eq!(
            c.daemon.socket_gid().ok(),
            Some(Some(nix::unistd::Gid::from_raw(0)))
        );
        assert!(Config::parse(&c.to_toml())
            .unwrap()
            .to_toml()
            .contains("socket_group"));
    }

    #[test]
    fn socket_permission_errors() {
        for bad in [
            "999",
            "0999",
            "1660",
            "04755",
            "00660",
            "0o660",
            "+660",
            "rw-rw----",
            "",
        ] {
            let e = with_daemon(&format!("socket_mode = \"{bad}\""))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("daemon.socket_mode = \"{bad}\"")) && e.contains("\"0660\""),
                "{e}"
            );
        }
        // A TOML number is decimal: refused, with the string to write instead.
        let e = with_daemon("socket_mode = 660").unwrap_err().to_string();
        assert!(
            e.contains("daemon.socket_mode = 660") && e.contains("socket_mode = \"0660\""),
            "{e}"
        );
        let e = with_daemon("socket_group = \"no-such-group-xagg\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("daemon.socket_group = \"no-such-group-xagg\"") && e.contains("groupadd"),
            "{e}"
        );
    }
}
