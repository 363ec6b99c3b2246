//! A round: one segment of one message, the unit a shadow copy aggregates. The switch and
//! the workers order rounds alike — by message, then by segment — with serial-number
//! arithmetic (RFC 1982), so both ids may wrap.

/// One segment of one message.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    pub message: u32,
    pub segment: u32,
}

const _: () = assert!(core::mem::size_of::<Round>() == 8);

impl Round {
    #[inline(always)]
    pub const fn new(message: u32, segment: u32) -> Self {
        Self { message, segment }
    }

    /// The first round of `message`: compared with another message's first round, the
    /// order of the two messages.
    #[inline(always)]
    pub const fn first(message: u32) -> Self {
        Self::new(message, 0)
    }

    /// Whether this round comes before `other`.
    ///
    /// Exactly half the id space apart the order is undefined: there each of the two
    /// rounds comes before the other, and neither after it ([`Self::is_after`]) — so a
    /// round that far off never counts as the newer one.
    #[inline(always)]
    pub fn is_before(self, other: Self) -> bool {
        self.is_before_lazy(other.message, || other.segment)
    }

    /// [`Self::is_before`] a round of `message` whose segment `segment` reads only when the
    /// messages are the same: the dataplane compares with a shadow copy's round, and reading
    /// both of its ids up front costs the verified program instructions.
    #[inline(always)]
    pub fn is_before_lazy(self, message: u32, segment: impl FnOnce() -> u32) -> bool {
        let dm = self.message.wrapping_sub(message) as i32;
        dm < 0 || (dm == 0 && (self.segment.wrapping_sub(segment()) as i32) < 0)
    }

    /// Whether this round comes after `other` (see [`Self::is_before`] for rounds half the
    /// id space apart).
    #[inline(always)]
    pub const fn is_after(self, other: Self) -> bool {
        let dm = self.message.wrapping_sub(other.message) as i32;
        dm > 0 || (dm == 0 && (self.segment.wrapping_sub(other.segment) as i32) > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::Round;

    const HALF: u32 = 1 << 31;

    fn r(message: u32, segment: u32) -> Round {
        Round::new(message, segment)
    }

    /// `a` strictly before `b`, seen from both sides.
    fn ordered(a: Round, b: Round) {
        assert!(a.is_before(b), "{a:?} before {b:?}");
        assert!(!a.is_after(b), "{a:?} not after {b:?}");
        assert!(b.is_after(a), "{b:?} after {a:?}");
        assert!(!b.is_before(a), "{b:?} not before {a:?}");
    }

    #[test]
    fn rounds_go_by_message_then_segment() {
        ordered(r(4, 0), r(5, 0));
        ordered(r(4, 7), r(5, 0));
        ordered(r(4, 3), r(4, 7));
        ordered(Round::first(9), r(9, 1));
        let same = r(4, 3);
        assert!(!same.is_before(same) && !same.is_after(same));
    }

    #[test]
    fn ids_wrap() {
        ordered(r(u32::MAX, 0), r(0, 0));
        ordered(r(u32::MAX, 9), r(0, 0));
        ordered(r(u32::MAX - 2, 0), r(3, 0));
        ordered(r(4, u32::MAX), r(4, 0));
        // Up to just under half the id space either way.
        ordered(r(0, 0), r(HALF - 1, 0));
        ordered(r(HALF + 1, 0), r(0, 0));
        ordered(r(7, 0), r(7, HALF - 1));
    }

    #[test]
    fn half_the_id_space_apart_neither_is_newer() {
        for (a, b) in [(r(0, 0), r(HALF, 0)), (r(5, 0), r(5, HALF))] {
            assert!(a.is_before(b) && b.is_before(a));
            assert!(!a.is_after(b) && !b.is_after(a));
        }
    }
}
