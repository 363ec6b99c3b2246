//! How a call's buffers map onto the segments of its message, for every collective.
//!
//! A message of S bytes is cut into blocks, and each block into segments of at most the
//! job's segment bytes, so a segment never straddles two blocks and has one root: for
//! reduce-scatter and all-gather, S is n blocks of S/n bytes and member i owns block i (its
//! segments' root is i); allreduce, reduce and broadcast have one block, the whole buffer,
//! whose segments' root is the call's root (0 for allreduce). Every member derives the same
//! segments from the call alone: the slot schedule ([`crate::engine`]) depends on nothing
//! else.

use std::ops::Range;

use xagg_common::wire::Collective;

/// The segments of one call, as member `member` sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub collective: Collective,
    /// Bytes of one block, blocks in the message, segments per block and buffer bytes of
    /// a full segment.
    pub block: usize,
    pub blocks: usize,
    pub per_block: usize,
    pub segment_bytes: usize,
    /// The root of a reduce or broadcast (0 otherwise).
    pub root: u8,
    pub member: u8,
}

impl Layout {
    /// The layout of `collective` over blocks of `block` bytes (`blocks` of them) in
    /// segments of at most `segment_bytes` (a positive number of bytes).
    pub fn new(
        collective: Collective,
        block: usize,
        blocks: usize,
        segment_bytes: usize,
        root: u8,
        member: u8,
    ) -> Self {
        Self {
            collective,
            block,
            blocks,
            per_block: block.div_ceil(segment_bytes),
            segment_bytes,
            root,
            member,
        }
    }

    /// Segments of the message.
    pub fn segments(&self) -> usize {
        self.blocks * self.per_block
    }

    /// Bytes of the message (all blocks).
    pub fn message_bytes(&self) -> usize {
        self.blocks * self.block
    }

    /// Segment `segment`'s block and its bytes within the block.
    fn within(&self, segment: usize) -> (usize, Range<usize>) {
        let block = segment / self.per_block;
        let lo = segment % self.per_block * self.segment_bytes;
        (block, lo..(lo + self.segment_bytes).min(self.block))
    }

    /// Segment `segment`'s bytes within the whole message.
    pub fn range(&self, segment: usize) -> Range<usize> {
        let (block, r) = self.within(segment);
        block * self.block + r.start..block * self.block + r.end
    }

    /// Segment `segment`'s root: the owner of its block, or the call's root.
    pub fn root_of(&self, segment: usize) -> u8 {
        match self.collective {
            Collective::ReduceScatter | Collective::AllGather => self.within(segment).0 as u8,
            _ => self.root,
        }
    }

    /// Where this member's data for segment `segment` is in the buffer it sends from (the
    /// input, or the buffer itself in place); `None`: it sends no data, only its header.
    pub fn source(&self, segment: usize) -> Option<Range<usize>> {
        let mine = self.root_of(segment) == self.member;
        match self.collective {
            Collective::Allreduce | Collective::ReduceScatter | Collective::Reduce => {
                Some(self.range(segment))
            }
            Collective::AllGather => mine.then(|| self.within(segment).1),
            Collective::Broadcast => mine.then(|| self.range(segment)),
        }
    }

    /// Where segment `segment`'s result goes in this member's output; `None`: this member
    /// gets only the round's completion.
    pub fn destination(&self, segment: usize) -> Option<Range<usize>> {
        if !self
            .collective
            .delivers_to(self.member, self.root_of(segment))
        {
            return None;
        }
        Some(match self.collective {
            Collective::ReduceScatter => self.within(segment).1,
            _ => self.range(segment),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_never_straddle_blocks() {
        // 4 blocks of 10 bytes in segments of 4: 3 per block, the last of each short.
        let l = Layout::new(Collective::ReduceScatter, 10, 4, 4, 0, 2);
        assert_eq!(l.segments(), 12);
        assert_eq!(l.range(2), 8..10);
        assert_eq!(l.range(3), 10..14);
        assert_eq!(l.root_of(3), 1);
        assert_eq!(l.root_of(11), 3);
        // Member 2 sends everything and gets its own block's results, at its output's
        // start.
        assert_eq!(l.source(0), Some(0..4));
        assert_eq!(l.destination(0), None);
        assert_eq!(l.destination(6), Some(0..4));
        assert_eq!(l.destination(8), Some(8..10));
    }

    #[test]
    fn gathers_send_only_their_own() {
        let l = Layout::new(Collective::AllGather, 10, 3, 4, 0, 1);
        assert_eq!(l.source(2), None);
        assert_eq!(l.source(3), Some(0..4));
        assert_eq!(l.source(5), Some(8..10));
        assert_eq!(l.destination(3), None);
        assert_eq!(l.destination(0), Some(0..4));
        let b = Layout::new(Collective::Broadcast, 10, 1, 4, 2, 2);
        assert_eq!((b.source(1), b.destination(1)), (Some(4..8), None));
        let b = Layout::new(Collective::Broadcast, 10, 1, 4, 2, 0);
        assert_eq!((b.source(1), b.destination(1)), (None, Some(4..8)));
        let r = Layout::new(Collective::Reduce, 10, 1, 4, 2, 0);
        assert_eq!((r.source(1), r.destination(1)), (Some(4..8), None));
    }
}
