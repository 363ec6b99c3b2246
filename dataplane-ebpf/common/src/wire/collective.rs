//! Which collective a message is: the switch aggregates every one of them the same way per
//! segment, and differs only in who sends data and who receives it.

/// A message's collective, carried in every contribution and result (header byte 22), with
/// the segment's root (byte 28): the member that owns the segment's block (reduce-scatter,
/// all-gather) or the collective's root (reduce, broadcast).
///
/// Behind a host level the root is named at both levels: a rank's contribution carries the
/// root's member index at its host ([`ROOT_ELSEWHERE`] if the root is another host's rank)
/// in byte 28 and the root's host's member index at the parent in byte 27 (`relay`), which
/// the host writes into byte 28 of its partial. A gather's root named at the parent carries
/// [`ROOT_HOST`]: it is a host whose other ranks need the data too.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every member sends its buffer; every member gets the reduced buffer.
    Allreduce = 0,
    /// Every member sends its buffer; each segment's result goes to the owner of its block
    /// alone, the others get a header-only completion.
    ReduceScatter = 1,
    /// Each member sends its own block; every other member gets it. The others send
    /// header-only contributions, so the round completes only once everyone is in.
    AllGather = 2,
    /// The root sends the buffer; every other member gets it (contributions as all-gather).
    Broadcast = 3,
    /// Every member sends its buffer; the root alone gets the result (as reduce-scatter,
    /// with one owner for every segment).
    Reduce = 4,
}

/// A root byte at a host level: the segment's root is a rank of another host. Nobody here
/// gets a reduce-scatter's or reduce's data, everybody a gather's.
pub const ROOT_ELSEWHERE: u8 = 0xff;

/// Set in a gather's root byte at the parent of host levels: the root is a host, whose
/// ranks other than the root's own need the data, so it gets the data like every member.
pub const ROOT_HOST: u8 = 0x80;

impl Collective {
    pub const ALL: [Self; 5] = [
        Self::Allreduce,
        Self::ReduceScatter,
        Self::AllGather,
        Self::Broadcast,
        Self::Reduce,
    ];

    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Allreduce),
            1 => Some(Self::ReduceScatter),
            2 => Some(Self::AllGather),
            3 => Some(Self::Broadcast),
            4 => Some(Self::Reduce),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Allreduce => "allreduce",
            Self::ReduceScatter => "reduce_scatter",
            Self::AllGather => "all_gather",
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
        }
    }

    /// Whether only the root's contribution carries data and the round's result is that
    /// data, moved rather than reduced (all-gather, broadcast).
    pub const fn gathers(self) -> bool {
        matches!(self, Self::AllGather | Self::Broadcast)
    }

    /// Whether member `member` of a round whose root is `root` gets the round's data in its
    /// copy of the result; the others get a header-only completion. The root of a gather
    /// sent the data, so it needs only the completion.
    pub const fn delivers_to(self, member: u8, root: u8) -> bool {
        match self {
            Self::Allreduce => true,
            Self::ReduceScatter | Self::Reduce => member == root,
            Self::AllGather | Self::Broadcast => member != root,
        }
    }
}

impl core::fmt::Display for Collective {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for Collective {
    type Err = super::UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or(super::UnknownName::COLLECTIVE)
    }
}
