//! A datagram the transport took in: its bytes in one piece (a UDP socket's), or in the
//! buffers of a multi-buffer frame as AF_XDP hands them over, read where they lie instead
//! of joined first (joining was 15 % of a busy worker's CPU).

use std::ops::Range;

#[derive(Clone, Copy)]
pub struct Datagram<'a> {
    parts: &'a [&'a [u8]],
    len: usize,
}

impl<'a> Datagram<'a> {
    /// The datagram made of `parts`, in order.
    pub fn new(parts: &'a [&'a [u8]]) -> Self {
        Self {
            parts,
            len: parts.iter().map(|p| p.len()).sum(),
        }
    }

    /// The first piece: the whole datagram, or at least its header (the transport joins a
    /// frame whose first buffer is shorter).
    pub fn head(&self) -> &'a [u8] {
        self.parts.first().copied().unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of `range`, piece by piece (as much of it as the datagram holds).
    pub fn pieces(&self, range: Range<usize>) -> impl Iterator<Item = &'a [u8]> + 'a {
        let mut at = 0;
        self.parts.iter().filter_map(move |p| {
            let (start, end) = (at, at + p.len());
            at = end;
            let (from, to) = (range.start.max(start), range.end.min(end));
            (from < to).then(|| &p[from - start..to - start])
        })
    }

    /// Copies the bytes from `offset` into `out` (as many as fit); how many it copied.
    pub fn copy_to(&self, offset: usize, out: &mut [u8]) -> usize {
        let mut n = 0;
        for p in self.pieces(offset..offset + out.len()) {
            out[n..n + p.len()].copy_from_slice(p);
            n += p.len();
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_a_range_across_parts() {
        let (a, b, c) = ([0u8, 1, 2], [3u8, 4], [5u8, 6, 7, 8]);
        let parts: [&[u8]; 3] = [&a, &b, &c];
        let d = Datagram::new(&parts);
        assert_eq!(d.len(), 9);
        let got: Vec<&[u8]> = d.pieces(2..6).collect();
        assert_eq!(got, [&[2u8][..], &[3, 4], &[5]]);
        assert_eq!(
            d.pieces(3..5).count(),
            1,
            "a range inside one part is one piece"
        );
        assert_eq!(d.pieces(9..12).count(), 0);
        let mut out = [0u8; 4];
        assert_eq!(d.copy_to(6, &mut out), 3, "only what the datagram holds");
        assert_eq!(out, [6, 7, 8, 0]);
    }
}
