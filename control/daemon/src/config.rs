//! The daemon's configuration file (TOML). Every key is documented in `docs/daemon.md`;
//! errors name the key and the fix.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::job::JobSpec;

pub const DEFAULT_SOCKET: &str = "/run/xagg/xaggd.sock";
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/xagg";

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub switch: SwitchSection,
    #[serde(default)]
    pub daemon: DaemonSection,
    /// Jobs added at start (unless already present in a pinned dataplane).
    #[serde(default, rename = "job", skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobSpec>,
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
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    /// Unix socket of the local API.
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// Directory in a bpffs where programs, links and maps are pinned.
    #[serde(default = "default_pin_path")]
    pub pin_path: PathBuf,
    /// Detach the dataplane when the daemon exits instead of leaving it running.
    #[serde(default)]
    pub detach_on_exit: bool,
}

impl Default for DaemonSection {
    fn default() -> Self {
        Self {
            socket: default_socket(),
            pin_path: default_pin_path(),
            detach_on_exit: false,
        }
    }
}

fn default_port() -> u16 {
    xagg_common::wire::DEFAULT_PORT
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    Native,
    Generic,
    Auto,
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))
    }

    /// The configuration as a TOML file.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a configuration serializes")
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let cfg: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), String> {
        let s = &self.switch;
        if s.ports.is_empty() {
            return Err("switch.ports is empty: list the interfaces the switch aggregates on, e.g. ports = [\"eth1\", \"eth2\"]".into());
        }
        if s.address.is_unspecified() {
            return Err("switch.address is 0.0.0.0: give the switch's own IPv4 address, the one workers send to".into());
        }
        if s.udp_port == 0 {
            return Err(format!(
                "switch.udp_port is 0: use a free UDP port (default {})",
                default_port()
            ));
        }
        if let Some(m) = &s.mac {
            xagg_sys::iface::parse_mac(m).map_err(|e| format!("switch.mac: {e}"))?;
        }
        self.mode()?;
        Ok(())
    }

    pub fn mode(&self) -> Result<XdpMode, String> {
        match self.switch.xdp_mode.as_str() {
            "native" => Ok(XdpMode::Native),
            "generic" => Ok(XdpMode::Generic),
            "auto" => Ok(XdpMode::Auto),
            m => Err(format!(
                "switch.xdp_mode = \"{m}\": use \"native\", \"generic\" or \"auto\""
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal() {
        let c = Config::parse("[switch]\nports = [\"p0\"]\naddress = \"10.0.0.1\"\n").unwrap();
        assert_eq!(c.switch.udp_port, 47800);
        assert!(!c.daemon.detach_on_exit);
        assert_eq!(c.mode(), Ok(XdpMode::Auto));
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

    #[test]
    fn errors_name_the_key() {
        let e = Config::parse("[switch]\nports = []\naddress = \"10.0.0.1\"\n").unwrap_err();
        assert!(e.contains("switch.ports"), "{e}");
        let e = Config::parse(
            "[switch]\nports = [\"a\"]\naddress = \"10.0.0.1\"\nxdp_mode = \"fast\"\n",
        )
        .unwrap_err();
        assert!(e.contains("switch.xdp_mode"), "{e}");
        let e = Config::parse("[switch]\nports = [\"a\"]\naddress = \"10.0.0.300\"\n").unwrap_err();
        assert!(e.contains("address"), "{e}");
        let e = Config::parse("[switch]\nports = [\"a\"]\naddress = \"10.0.0.1\"\nportz = 1\n")
            .unwrap_err();
        assert!(e.contains("portz"), "{e}");
    }
}
