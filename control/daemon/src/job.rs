//! The daemon's side of a job ([`JobSpec`], in `xagg_api`): its validation against this
//! switch (ports, addresses, a parent or a ring) into the dataplane's [`Job`] entry, the
//! spec back from an entry, and where its slots go.

use std::net::{Ipv4Addr, SocketAddrV4};

use xagg_api::{Error, JobSpec, MemberSpec, Neighbour, ParentSpec, RingSpec};
use xagg_common::{
    job::{MemberAddr, Role},
    wire::{self, DType, Lane, Op},
    Job,
};
use xagg_linux::iface;

/// Checks a spec against this switch's `ports` without a dataplane (start-up and
/// `xaggd --check` do it for the configuration's jobs): its fields, each member behind a
/// port whose MTU carries the job's packets, an uplink that is a port.
pub fn check_spec(spec: &JobSpec, ports: &[String]) -> Result<(), Error> {
    to_job(spec, 0)?;
    let shape = spec.shape()?;
    let need = wire::ip_packet_len(shape.segment_bytes());
    let not_port = |field: String, name: &str, what: &str| {
        Error::job(
            field,
            format!(
                "`{name}` is not a port of this switch (its ports: {}): name {what}",
                ports.join(", ")
            ),
        )
    };
    for (i, m) in spec.members.iter().enumerate() {
        // A segment must fit the link: a full one is one IPv4 packet.
        let mtu = iface::mtu(&m.interface).unwrap_or(usize::MAX);
        if mtu < need {
            let lane = xagg_api::lane(spec.op, spec.dtype)?;
            let fits = wire::payload_for_mtu(mtu) / lane.size();
            return Err(Error::job(
                "segment",
                format!(
                    "{} elements make {need}-byte packets, but members[{i}]'s port {} has an MTU of {mtu}: choose a segment of at most {fits} elements, or raise the MTU",
                    spec.segment, m.interface
                ),
            ));
        }
        if !ports.contains(&m.interface) {
            return Err(not_port(
                format!("members[{i}].interface"),
                &m.interface,
                "the port the member is behind",
            ));
        }
    }
    let uplink = match (&spec.parent, &spec.ring) {
        (Some(p), _) => Some(("parent", &p.interface)),
        (None, Some(r)) => Some(("ring", &r.interface)),
        (None, None) => None,
    };
    if let Some((field, interface)) = uplink {
        if !ports.contains(interface) {
            return Err(not_port(
                format!("{field}.interface"),
                interface,
                "the uplink",
            ));
        }
    }
    Ok(())
}

/// Checks the spec and builds the `JOBS` entry, resolving interfaces in the calling
/// thread's network namespace. `slot_base` is where the switch placed the job.
pub fn to_job(spec: &JobSpec, slot_base: u32) -> Result<Job, Error> {
    let shape = spec.shape()?;
    let mut job = Job::new(&shape, spec.op, spec.dtype, slot_base)
        .expect("the shape is whole lanes of a supported op and type");
    for (i, m) in spec.members.iter().enumerate() {
        let field = format!("members[{i}]");
        let ifindex = iface::ifindex(&m.interface).map_err(|e| {
            Error::job(
                format!("{field}.interface"),
                format!("{e:#}: name a switch port of this switch"),
            )
        })?;
        let mac = iface::parse_mac(&m.mac)
            .map_err(|e| Error::job(format!("{field}.mac"), e.to_string()))?;
        if m.addr.ip().is_unspecified() || m.addr.port() == 0 {
            return Err(Error::job(
                format!("{field}.addr"),
                format!(
                    "`{}`: give the member's own IPv4 address and UDP port",
                    m.addr
                ),
            ));
        }
        // Results are addressed per port: two members behind one port would get one copy.
        if let Some(j) = spec.members[..i]
            .iter()
            .position(|o| o.interface == m.interface)
        {
            return Err(Error::job(
                format!("{field}.interface"),
                format!(
                    "`{}` is also members[{j}]'s port: each member of a job must be behind its own switch port",
                    m.interface
                ),
            ));
        }
        job.member[i] = MemberAddr {
            ifindex,
            ip: m.addr.ip().octets(),
            mac,
            port: m.addr.port().to_be_bytes(),
        };
    }
    if let Some(p) = &spec.parent {
        let ifindex = iface::ifindex(&p.interface).map_err(|e| {
            Error::job(
                "parent.interface",
                format!("{e:#}: name the port of this switch the parent is behind"),
            )
        })?;
        let mac = iface::parse_mac(&p.mac).map_err(|e| Error::job("parent.mac", e.to_string()))?;
        if p.addr.ip().is_unspecified() || p.addr.port() == 0 {
            return Err(Error::job(
                "parent.addr",
                format!(
                    "`{}`: give the parent's collective IPv4 address and UDP port",
                    p.addr
                ),
            ));
        }
        // The uplink tells results coming down from contributions coming up.
        if let Some(i) = spec.members.iter().position(|m| m.interface == p.interface) {
            return Err(Error::job(
                "parent.interface",
                format!(
                    "`{}` is also members[{i}]'s port: the parent must be behind a port of its own (the uplink)",
                    p.interface
                ),
            ));
        }
        if usize::from(p.member) >= wire::MAX_MEMBERS {
            return Err(Error::job(
                "parent.member",
                format!(
                    "{}: a member index is below {}",
                    p.member,
                    wire::MAX_MEMBERS
                ),
            ));
        }
        job.role = Role::Inner as u8;
        job.parent = MemberAddr {
            ifindex,
            ip: p.addr.ip().octets(),
            mac,
            port: p.addr.port().to_be_bytes(),
        };
        job.parent_job = p.job;
        job.parent_member = p.member;
    }
    if let Some(r) = &spec.ring {
        if spec.parent.is_some() {
            return Err(Error::job(
                "ring",
                "a job has a parent or a ring, not both: drop one of them",
            ));
        }
        if r.size == 0 || r.position >= r.size {
            return Err(Error::job(
                "ring.position",
                format!(
                    "{} of {}: a ring has 1 or more hosts, each at a place below its size",
                    r.position, r.size
                ),
            ));
        }
        let ifindex = iface::ifindex(&r.interface).map_err(|e| {
            Error::job(
                "ring.interface",
                format!("{e:#}: name the port of this host the ring's neighbours are behind"),
            )
        })?;
        if let Some(i) = spec.members.iter().position(|m| m.interface == r.interface) {
            return Err(Error::job(
                "ring.interface",
                format!(
                    "`{}` is also members[{i}]'s port: the neighbours must be behind a port of their own",
                    r.interface
                ),
            ));
        }
        let predecessor = spec.members.len();
        if predecessor >= wire::MAX_MEMBERS {
            return Err(Error::job(
                "members",
                format!(
                    "a ring host takes at most {} ranks: its predecessor needs a member index too",
                    wire::MAX_MEMBERS - 1
                ),
            ));
        }
        let neighbour = |n: &Neighbour, field: &str| -> Result<MemberAddr, Error> {
            let mac = iface::parse_mac(&n.mac)
                .map_err(|e| Error::job(format!("ring.{field}.mac"), e.to_string()))?;
            if n.addr.ip().is_unspecified() || n.addr.port() == 0 {
                return Err(Error::job(
                    format!("ring.{field}.addr"),
                    format!(
                        "`{}`: give the neighbour's collective IPv4 address and UDP port",
                        n.addr
                    ),
                ));
            }
            Ok(MemberAddr {
                ifindex,
                ip: n.addr.ip().octets(),
                mac,
                port: n.addr.port().to_be_bytes(),
            })
        };
        job.role = Role::Ring as u8;
        job.parent = neighbour(&r.successor, "successor")?;
        job.parent_job = r.successor.job.unwrap_or(spec.id);
        job.predecessor_job = r.predecessor.job.unwrap_or(spec.id);
        job.parent_member = r.successor.member;
        job.member[predecessor] = neighbour(&r.predecessor, "predecessor")?;
        job.predecessor = predecessor as u8;
        job.ring_size = r.size;
        job.ring_position = r.position;
    }
    Ok(job)
}

/// The spec back from a `JOBS` entry (interfaces by name, resolved in this namespace).
pub fn from_job(id: u32, job: &Job) -> JobSpec {
    // The daemon wrote both; an entry it cannot read is not one of its own.
    let op = Op::from_u8(job.op).unwrap_or(Op::Sum);
    let dtype = DType::from_u8(job.dtype).unwrap_or(DType::I32);
    let lane = wire::lane(op, dtype).unwrap_or(Lane::I32);
    let members = job.member[..job.member_count()]
        .iter()
        .map(|m| MemberSpec {
            interface: port_name(m.ifindex),
            mac: iface::fmt_mac(&m.mac),
            addr: SocketAddrV4::new(Ipv4Addr::from(m.ip), u16::from_be_bytes(m.port)),
        })
        .collect();
    JobSpec {
        id,
        op,
        dtype,
        segment: (usize::from(job.segment_bytes) / lane.size()) as u16,
        slots: job.slot_count,
        members,
        slot_base: Some(job.slot_base),
        ring: (job.role == Role::Ring as u8).then(|| {
            let neighbour = |m: &MemberAddr, member: u8, job: u32| Neighbour {
                mac: iface::fmt_mac(&m.mac),
                addr: SocketAddrV4::new(Ipv4Addr::from(m.ip), u16::from_be_bytes(m.port)),
                member,
                job: (job != id).then_some(job),
            };
            RingSpec {
                interface: port_name(job.parent.ifindex),
                size: job.ring_size,
                position: job.ring_position,
                predecessor: neighbour(
                    &job.member[usize::from(job.predecessor) & 63],
                    0,
                    job.predecessor_job,
                ),
                successor: neighbour(&job.parent, job.parent_member, job.parent_job),
            }
        }),
        parent: (job.role == Role::Inner as u8).then(|| ParentSpec {
            interface: port_name(job.parent.ifindex),
            mac: iface::fmt_mac(&job.parent.mac),
            addr: SocketAddrV4::new(
                Ipv4Addr::from(job.parent.ip),
                u16::from_be_bytes(job.parent.port),
            ),
            job: job.parent_job,
            member: job.parent_member,
        }),
    }
}

/// A port's name in this namespace (its index if it has none).
fn port_name(ifindex: u32) -> String {
    nix::net::if_::if_indextoname(ifindex)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("ifindex {ifindex}"))
}

/// First free range of `want` slots in `0..total`, given the ranges in use.
pub fn allocate_slots(used: &[(u32, u32)], want: u32, total: u32) -> Option<u32> {
    let mut ranges = used.to_vec();
    ranges.sort();
    let mut start = 0u32;
    for (base, count) in ranges {
        if base >= start && base - start >= want {
            return Some(start);
        }
        start = start.max(base + count);
    }
    (total.checked_sub(start)? >= want).then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit() {
        assert_eq!(allocate_slots(&[], 10, 100), Some(0));
        assert_eq!(allocate_slots(&[(0, 10)], 10, 100), Some(10));
        assert_eq!(allocate_slots(&[(0, 10), (20, 5)], 10, 100), Some(10));
        assert_eq!(allocate_slots(&[(0, 10), (15, 5)], 10, 100), Some(20));
        assert_eq!(allocate_slots(&[(0, 95)], 10, 100), None);
        assert_eq!(allocate_slots(&[], 101, 100), None);
    }

    /// The spec's shape is checked first: its errors are the shape's.
    #[test]
    fn the_shape_first() {
        let spec = JobSpec {
            id: 1,
            op: Op::Sum,
            dtype: DType::I32,
            segment: 5000,
            slots: 8,
            members: vec![],
            slot_base: None,
            parent: None,
            ring: None,
        };
        let e = to_job(&spec, 0).unwrap_err();
        assert!(
            matches!(&e, Error::Job { field, .. } if field == "segment"),
            "{e}"
        );
    }
}
