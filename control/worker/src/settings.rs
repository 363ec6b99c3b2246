//! Joining a job from the settings a launcher hands every rank (`XAGG_DAEMON`,
//! `XAGG_CREDENTIAL`, `XAGG_CREDENTIAL_FILE`, `XAGG_SLOTS`, `XAGG_JOIN_TIMEOUT_MS`,
//! `XAGG_GIVE_UP_MS`, `XAGG_TIMEOUT_S`; `XAGG_FLOAT`, as rank 0 has it): what the
//! MPI library and the Python module share. The caller brings what its ranks agree on —
//! the job's key and secret, and this rank's [`Placement`] — and gets a worker that has
//! joined and learnt the job's state from the switch.

use std::{
    net::{SocketAddr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use xagg_common::{
    wire::{payload_for_mtu, Float, MAX_PAYLOAD},
    JobShape,
};

use crate::{AllreduceError, CredentialKey, Error, JobKey, JoinParams, Placement, Secret, Worker};

/// How long the ranks wait for each other to join, unless told otherwise. The ranks of a
/// launch come within seconds of each other; a launcher's own timeout (torch's group
/// timeout is 30 minutes) would hold a job with a missing rank that long.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Slots per job unless told otherwise (as the bench's runs).
pub const SLOTS: usize = 128;

/// How a rank joins its job: the same on every rank of a host.
#[derive(Clone, Debug)]
pub struct JoinSettings {
    /// The daemon's network listener (`XAGG_DAEMON`): where every host runs its own
    /// daemon, this host's.
    pub daemon: SocketAddr,
    /// The admission credential, for the rank that creates the job: `XAGG_CREDENTIAL=NAME`
    /// with the key in the file `XAGG_CREDENTIAL_FILE` names (64 hex digits, as the daemon's `key_file`:
    /// no secret in the environment or on a launcher's command line), or
    /// `XAGG_CREDENTIAL=NAME:KEY`.
    pub credential: Option<(String, CredentialKey)>,
    /// Slots per job (`XAGG_SLOTS`, [`SLOTS`]).
    pub slots: usize,
    /// How long the ranks wait for each other to join (`XAGG_JOIN_TIMEOUT_MS`,
    /// [`JOIN_TIMEOUT`]).
    pub join_timeout: Duration,
    /// How long an allreduce waits for the switch (`XAGG_GIVE_UP_MS`; unset: the
    /// library's, [`crate::WorkerParams::give_up`]).
    pub give_up: Option<Duration>,
    /// How long an allreduce waits for slow ranks while the switch answers
    /// (`XAGG_TIMEOUT_S`; unset: the library's,
    /// [`crate::WorkerParams::collective_timeout`]).
    pub collective_timeout: Option<Duration>,
    /// The job's segment in bytes, as every rank agreed (the smallest of their
    /// [`JoinSettings::segment_bytes`]); unset: this rank's path's own.
    pub segment: Option<usize>,
    /// How float sums travel (`XAGG_FLOAT`, as rank 0 has it: the caller shares it, since
    /// every rank must use the same); the library's default is the fast lane.
    pub float: Float,
}

impl JoinSettings {
    /// The daemon's listener and every other setting's default.
    pub fn new(daemon: SocketAddr) -> Self {
        Self {
            daemon,
            credential: None,
            slots: SLOTS,
            join_timeout: JOIN_TIMEOUT,
            give_up: None,
            collective_timeout: None,
            segment: None,
            float: Float::Fast,
        }
    }

    /// The settings from the environment; `XAGG_DAEMON` is required.
    pub fn from_env() -> Result<Self, Error> {
        Self::from_vars(None, |name| std::env::var(name).ok())
    }

    /// The settings from the environment, the daemon's listener given (`XAGG_DAEMON` is
    /// not read).
    pub fn from_env_at(daemon: SocketAddr) -> Result<Self, Error> {
        Self::from_vars(Some(daemon), |name| std::env::var(name).ok())
    }

    fn from_vars(
        daemon: Option<SocketAddr>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Error> {
        let daemon = match daemon {
            Some(d) => d,
            None => {
                let d = var("XAGG_DAEMON").ok_or(Error::NoDaemon)?;
                d.trim()
                    .parse()
                    .map_err(|_| Error::NotAnAddress { value: d })?
            }
        };
        let number = |name: &str| -> Result<Option<u64>, Error> {
            var(name)
                .map(|v| {
                    v.trim().parse().map_err(|_| Error::NotANumber {
                        name: name.into(),
                        value: v,
                    })
                })
                .transpose()
        };
        let defaults = Self::new(daemon);
        Ok(Self {
            credential: credential(var("XAGG_CREDENTIAL"), var("XAGG_CREDENTIAL_FILE"))?,
            slots: number("XAGG_SLOTS")?.map_or(defaults.slots, |n| n as usize),
            join_timeout: number("XAGG_JOIN_TIMEOUT_MS")?
                .map_or(defaults.join_timeout, Duration::from_millis),
            give_up: number("XAGG_GIVE_UP_MS")?.map(Duration::from_millis),
            collective_timeout: number("XAGG_TIMEOUT_S")?.map(Duration::from_secs),
            ..defaults
        })
    }

    /// The longest segment this rank's path carries, in bytes: what the MTU of its
    /// interface toward the daemon leaves, and what the daemon says its ports carry (the
    /// smallest of its ports' MTUs). The ranks of a job take the smallest of theirs
    /// ([`JoinSettings::segment`]), never a constant: a 1500-byte network gives 1432.
    pub fn segment_bytes(&self) -> Result<usize, Error> {
        let bind = local_address(self.daemon)?;
        let mut bytes = MAX_PAYLOAD;
        if let Some(iface) = xagg_linux::iface::holding(*bind.ip())? {
            bytes = bytes.min(payload_for_mtu(xagg_linux::iface::mtu(&iface)?));
        }
        let reply = xagg_join::client::Client::new(self.daemon).nonce()?;
        if let Some(b) = reply.segment_bytes {
            bytes = bytes.min(b as usize);
        }
        Ok(bytes)
    }

    /// Joins the job of `key` and `secret` as `placed` says, from this host's address
    /// toward the daemon, with segments of [`JoinSettings::segment`] bytes (or this path's
    /// longest) and [`JoinSettings::slots`] slots; then learns the job's state from the
    /// switch ([`Worker::join_synced`]).
    pub fn join(
        &self,
        key: JobKey,
        secret: Secret,
        placed: &Placement,
    ) -> Result<Worker, AllreduceError> {
        let bind = local_address(self.daemon).map_err(|e| AllreduceError::Join(e.into()))?;
        let segment = match self.segment {
            Some(b) => b,
            None => self
                .segment_bytes()
                .map_err(|e| AllreduceError::Join(e.into()))?,
        };
        let shape = JobShape::new(placed.members, self.slots, segment)
            .map_err(|e| AllreduceError::Invalid(format!("the job's {}: {e}", e.field())))?;
        let j = JoinParams {
            daemon: self.daemon,
            key,
            secret,
            rank: placed.member,
            shape,
            bind,
            credential: self.credential.clone(),
            timeout: self.join_timeout,
            levels: placed.levels,
        };
        Worker::join_synced(j, |p| {
            p.places.clone_from(&placed.places);
            if let Some(g) = self.give_up {
                p.give_up = g;
            }
            if let Some(t) = self.collective_timeout {
                p.collective_timeout = t;
            }
            p.float = self.float;
        })
    }
}

/// The float mode `XAGG_FLOAT=value` names (`fast` or `exact`); `default` where it is
/// empty or unset; `None` for `none` (float sums do not take the switch: the drop-ins hand
/// them to Open MPI or Gloo). The error names the setting and the values it takes.
pub fn float_mode(value: Option<&str>, default: Float) -> Result<Option<Float>, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(Some(default)),
        Some("none") => Ok(None),
        Some(v) => v
            .parse()
            .map(Some)
            .map_err(|e| format!("XAGG_FLOAT={v}: {e}, or none (float sums by Open MPI or Gloo)")),
    }
}

/// An admission credential written `NAME:KEY`: its name in the daemon's configuration and
/// its key as 64 hex digits. `what` names the setting in errors.
pub fn parse_credential(s: &str, what: &str) -> Result<(String, CredentialKey), Error> {
    let (name, key) = s
        .split_once(':')
        .ok_or_else(|| Error::NotCredential { what: what.into() })?;
    let key = xagg_join::from_hex(key.trim(), &format!("{what}'s key"))?;
    Ok((name.to_string(), CredentialKey(key)))
}

/// An admission credential from its name and the file holding its key (64 hex digits, as the
/// daemon's `key_file` holds it), or from `NAME:KEY` alone: the drop-ins' `XAGG_CREDENTIAL` and
/// `XAGG_CREDENTIAL_FILE`, `xagg allreduce`'s `--credential` and `--credential-file`.
pub fn credential(
    name: Option<String>,
    file: Option<String>,
) -> Result<Option<(String, CredentialKey)>, Error> {
    match (name, file) {
        (None, None) => Ok(None),
        (Some(c), None) => parse_credential(&c, "XAGG_CREDENTIAL").map(Some),
        (Some(name), Some(file)) if !name.contains(':') => {
            let text = std::fs::read_to_string(&file).map_err(|error| Error::CredentialFile {
                file: file.clone(),
                error,
            })?;
            let key = xagg_join::from_hex(text.trim(), &format!("the key in {file}"))?;
            Ok(Some((name.trim().to_string(), CredentialKey(key))))
        }
        (Some(_), Some(file)) => Err(Error::CredentialTwice { file }),
        (None, Some(file)) => Err(Error::CredentialUnnamed { file }),
    }
}

/// This host's address toward the daemon (the route's source; port 0, any free one):
/// where the switch will see this rank. Nothing is sent.
pub fn local_address(daemon: SocketAddr) -> Result<SocketAddrV4, Error> {
    let s = UdpSocket::bind("0.0.0.0:0").map_err(Error::UdpSocket)?;
    s.connect(daemon)
        .map_err(|error| Error::NoRoute { daemon, error })?;
    match s.local_addr() {
        Ok(SocketAddr::V4(a)) => Ok(SocketAddrV4::new(*a.ip(), 0)),
        Ok(local) => Err(Error::NotIpv4 { local }),
        Err(error) => Err(Error::NoLocalAddress { daemon, error }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn settings(vars: &[(&str, &str)]) -> Result<JoinSettings, Error> {
        JoinSettings::from_vars(None, |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn a_credential_is_a_name_and_a_key() {
        let (name, key) = parse_credential(&format!("lab:{KEY}"), "XAGG_CREDENTIAL").unwrap();
        assert_eq!(name, "lab");
        assert_eq!(key.0[..2], [0x00, 0x11]);
        // Spaces around the key (a file's newline) are not part of it.
        assert!(parse_credential(&format!("lab: {KEY}\n"), "XAGG_CREDENTIAL").is_ok());
        let e = parse_credential(KEY, "XAGG_CREDENTIAL")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("XAGG_CREDENTIAL must be NAME:KEY"), "{e}");
        let e = parse_credential("lab:00ff", "credential")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("credential's key is not 64 hexadecimal digits"),
            "{e}"
        );
    }

    #[test]
    fn only_the_daemon_is_required() {
        let s = settings(&[("XAGG_DAEMON", " 10.77.0.1:47900 ")]).unwrap();
        assert_eq!(s.daemon, "10.77.0.1:47900".parse().unwrap());
        assert!(s.credential.is_none());
        assert_eq!(s.slots, SLOTS);
        assert_eq!(s.join_timeout, Duration::from_secs(30));
        assert_eq!(s.give_up, None);
        // The daemon given: XAGG_DAEMON is not read.
        let d = "10.0.0.9:1".parse().unwrap();
        let s = JoinSettings::from_vars(Some(d), |_| None).unwrap();
        assert_eq!(s.daemon, d);
    }

    #[test]
    fn every_setting_from_its_variable() {
        let credential = format!("team:{KEY}");
        let s = settings(&[
            ("XAGG_DAEMON", "10.77.0.1:47900"),
            ("XAGG_CREDENTIAL", &credential),
            ("XAGG_SLOTS", "32"),
            ("XAGG_JOIN_TIMEOUT_MS", "2500"),
            ("XAGG_GIVE_UP_MS", "2000"),
        ])
        .unwrap();
        assert_eq!(s.credential.unwrap().0, "team");
        assert_eq!(s.slots, 32);
        assert_eq!(s.join_timeout, Duration::from_millis(2500));
        assert_eq!(s.give_up, Some(Duration::from_secs(2)));
    }

    #[test]
    fn wrong_settings_say_which_and_how() {
        let e = settings(&[]).unwrap_err().to_string();
        assert!(e.starts_with("XAGG_DAEMON is not set"), "{e}");
        let e = settings(&[("XAGG_DAEMON", "10.77.0.1")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("XAGG_DAEMON=10.77.0.1 is not an address"), "{e}");
        let d = ("XAGG_DAEMON", "10.77.0.1:47900");
        for name in ["XAGG_SLOTS", "XAGG_JOIN_TIMEOUT_MS", "XAGG_GIVE_UP_MS"] {
            let e = settings(&[d, (name, "10s")]).unwrap_err().to_string();
            assert_eq!(e, format!("{name}=10s is not a number"));
        }
        let e = settings(&[d, ("XAGG_CREDENTIAL", "lab")])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("XAGG_CREDENTIAL must be NAME:KEY"), "{e}");
    }

    #[test]
    fn the_credentials_key_from_a_file() {
        let dir = std::env::temp_dir().join(format!("xagg-credential-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("team.key");
        std::fs::write(&file, format!("{KEY}\n")).unwrap();
        let file = file.to_str().unwrap();
        let d = ("XAGG_DAEMON", "10.77.0.1:47900");
        let s = settings(&[
            d,
            ("XAGG_CREDENTIAL", "team"),
            ("XAGG_CREDENTIAL_FILE", file),
        ])
        .unwrap();
        let (name, key) = s.credential.unwrap();
        assert_eq!(
            (name.as_str(), key.0.to_vec()),
            (
                "team",
                xagg_join::from_hex::<32>(KEY, "key").unwrap().to_vec()
            )
        );
        let twice = format!("team:{KEY}");
        for (vars, says) in [
            (vec![("XAGG_CREDENTIAL_FILE", file)], "names no credential"),
            (
                vec![
                    ("XAGG_CREDENTIAL", twice.as_str()),
                    ("XAGG_CREDENTIAL_FILE", file),
                ],
                "give the key once",
            ),
            (
                vec![
                    ("XAGG_CREDENTIAL", "team"),
                    ("XAGG_CREDENTIAL_FILE", "/nonexistent/team.key"),
                ],
                "/nonexistent/team.key",
            ),
        ] {
            let mut vars = vars;
            vars.push(d);
            let e = settings(&vars).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_local_address_is_the_routes_source() {
        let a = local_address("127.0.0.1:47900".parse().unwrap()).unwrap();
        assert_eq!(a, "127.0.0.1:0".parse().unwrap());
    }
}
