//! BPF_PROG_RUN tables: a row is a description, an input frame, the expected action, the
//! counter it must bump, and where they matter what the output frame and the slots must
//! hold after it. [`run_table`] runs rows in order: each builds on the slot state the rows
//! before it left.

use xagg_common::{
    slot::{ShadowCopy, ShadowState, SlotImage},
    wire::{self, Header, Kind, PAYLOAD_OFFSET},
    Counter,
};
use xagg_lab::testrun::{ipv4_checksum, Run, Switch};

/// A row's description, input frame, expected action and the one counter it must bump.
pub struct Case {
    pub what: &'static str,
    pub frame: Vec<u8>,
    pub action: u32,
    pub counter: Counter,
}

/// Runs a case: its action, and exactly its counter bumped (every other unchanged).
pub fn check(sw: &mut Switch, c: &Case) -> Run {
    let before = sw.counters();
    let r = sw.run(&c.frame);
    assert_eq!(r.action, c.action, "{}: action", c.what);
    let after = sw.counters();
    for (i, k) in Counter::ALL.iter().enumerate() {
        let want = if *k == c.counter { 1 } else { 0 };
        assert_eq!(
            after[i] - before[i],
            want,
            "{}: counter {}",
            c.what,
            k.name()
        );
    }
    r
}

/// A row: its [`Case`] (description, input frame, action, counter) and what the output
/// frame and the slots must hold after it.
pub struct Row {
    pub case: Case,
    pub out: Vec<Out>,
    pub after: Vec<After>,
}

pub fn row(what: &'static str, frame: Vec<u8>, action: u32, counter: Counter) -> Row {
    Row {
        case: Case {
            what,
            frame,
            action,
            counter,
        },
        out: Vec::new(),
        after: Vec::new(),
    }
}

impl Row {
    pub fn out(mut self, out: impl IntoIterator<Item = Out>) -> Self {
        self.out.extend(out);
        self
    }

    pub fn after(mut self, after: impl IntoIterator<Item = After>) -> Self {
        self.after.extend(after);
        self
    }
}

/// What a row's output frame must hold.
pub enum Out {
    /// The input frame, untouched.
    Untouched,
    /// These bytes at this offset, and what they are.
    Bytes(usize, Vec<u8>, &'static str),
    /// A collective header of this kind.
    Kind(Kind),
    /// A collective header of this round: job, message, segment, slot, count.
    Round(u32, u32, u32, u16, u16),
    /// A collective header naming this job, and whose id it is.
    Job(u32, &'static str),
    /// A collective header from this member index.
    Member(u8),
    /// A status query or reply relaying for this member (1 + its index; 0 for none).
    Relay(u8),
    /// A status reply marked (1) or not (0) as the answer of the level above.
    Above(u8),
    /// A status reply reporting this state.
    Status(ShadowState),
    /// A collective header with these flags set.
    Flags(u8),
    /// A valid IPv4 header checksum.
    Ipv4Checksum,
    /// This metadata in front of the frame (`xagg_fanout`'s mark).
    Meta(Vec<u8>),
    /// This length.
    Len(usize),
}

/// The payload: `bytes` from [`PAYLOAD_OFFSET`].
pub fn payload(bytes: Vec<u8>) -> Out {
    Out::Bytes(PAYLOAD_OFFSET, bytes, "the payload")
}

pub fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The metadata in front of a multi-buffer result the switch passes to the kernel, marking
/// it as its own for `xagg_fanout` (BPF_PROG_RUN hands it back with the frame): the mark
/// and the job.
pub fn own_result(job: u32) -> Vec<u8> {
    [xagg_common::OWN_RESULT.to_ne_bytes(), job.to_ne_bytes()].concat()
}

impl Out {
    fn check(&self, what: &str, input: &[u8], r: &Run) {
        let header = || {
            Header::from_bytes(&r.out[PAYLOAD_OFFSET - wire::HEADER_LEN..])
                .unwrap_or_else(|| panic!("{what}: no collective header out"))
        };
        match self {
            Out::Untouched => assert_eq!(r.out, input, "{what}: the frame untouched"),
            Out::Bytes(at, want, why) => assert_eq!(
                r.out.get(*at..at + want.len()),
                Some(&want[..]),
                "{what}: {why}"
            ),
            Out::Kind(kind) => assert_eq!(header().kind, *kind as u8, "{what}: the kind"),
            Out::Round(job, message, segment, slot, count) => {
                let h = header();
                assert_eq!(
                    (h.job(), h.message(), h.segment(), h.slot(), h.count()),
                    (*job, *message, *segment, *slot, *count),
                    "{what}: job, message, segment, slot, count"
                );
            }
            Out::Job(job, why) => assert_eq!(header().job(), *job, "{what}: the job, {why}"),
            Out::Member(m) => assert_eq!(header().member, *m, "{what}: the member index"),
            Out::Relay(relay) => assert_eq!(header().relay, *relay, "{what}: the relay"),
            Out::Above(above) => assert_eq!(header().above, *above, "{what}: above"),
            Out::Status(state) => {
                assert_eq!(header().status, *state as u8, "{what}: the status")
            }
            Out::Flags(flags) => assert_eq!(
                header().flags & flags,
                *flags,
                "{what}: flags {flags:#04x} set"
            ),
            Out::Ipv4Checksum => assert_eq!(
                ipv4_checksum(&r.out[14..34]),
                0,
                "{what}: valid IPv4 checksum"
            ),
            Out::Meta(meta) => assert_eq!(&r.meta, meta, "{what}: the metadata"),
            Out::Len(len) => assert_eq!(r.out.len(), *len, "{what}: the length"),
        }
    }
}

/// What a slot must hold after a row.
pub enum After {
    /// Shadow copy `shadow` of slot `slot`: its state, its round's segment, the members
    /// seen and the count.
    Copy {
        slot: u32,
        shadow: usize,
        state: ShadowState,
        segment: u32,
        seen: u64,
        count: u32,
    },
    /// Shadow copy `shadow` of slot `slot` in this state.
    State(u32, usize, ShadowState),
    /// Shadow copy `shadow` of slot `slot` with these members seen.
    Seen(u32, usize, u64),
    /// The slot as the row found it.
    Unchanged(u32),
    /// Word `word` of shadow copy `shadow` of slot `slot` (its value, what it is).
    Word(u32, usize, usize, u64, &'static str),
}

pub fn copy(
    slot: u32,
    shadow: usize,
    state: ShadowState,
    segment: u32,
    seen: u64,
    count: usize,
) -> After {
    After::Copy {
        slot,
        shadow,
        state,
        segment,
        seen,
        count: count as u32,
    }
}

/// A shadow copy's fields in front of its data.
fn copy_fields(c: &ShadowCopy) -> (u32, u32, u64, u32, u32, i32, u32, u8, u8) {
    (
        c.message, c.segment, c.seen, c.state, c.count, c.exponent, c.flags, c.op, c.dtype,
    )
}

impl After {
    fn slot(&self) -> u32 {
        match self {
            After::Copy { slot, .. }
            | After::State(slot, ..)
            | After::Seen(slot, ..)
            | After::Unchanged(slot)
            | After::Word(slot, ..) => *slot,
        }
    }

    /// Checks the slot, `before` the row and `now`.
    fn check(&self, what: &str, before: &SlotImage, now: &SlotImage) {
        match *self {
            After::Copy {
                slot,
                shadow,
                state,
                segment,
                seen,
                count,
            } => {
                let c = &now.shadow[shadow];
                assert_eq!(
                    (ShadowState::from_u32(c.state), c.segment, c.seen, c.count),
                    (Some(state), segment, seen, count),
                    "{what}: slot {slot}, shadow copy {shadow}: state, segment, seen, count"
                );
            }
            After::State(slot, shadow, state) => assert_eq!(
                ShadowState::from_u32(now.shadow[shadow].state),
                Some(state),
                "{what}: slot {slot}, shadow copy {shadow}: state"
            ),
            After::Seen(slot, shadow, seen) => assert_eq!(
                now.shadow[shadow].seen, seen,
                "{what}: slot {slot}, shadow copy {shadow}: members seen"
            ),
            After::Unchanged(slot) => {
                for (i, (b, n)) in before.shadow.iter().zip(&now.shadow).enumerate() {
                    assert_eq!(
                        copy_fields(n),
                        copy_fields(b),
                        "{what}: changed slot {slot}, shadow copy {i}"
                    );
                    assert!(
                        n.data == b.data,
                        "{what}: changed slot {slot}, shadow copy {i}'s data"
                    );
                }
            }
            After::Word(slot, shadow, word, value, why) => assert_eq!(
                now.shadow[shadow].data[word], value,
                "{what}: slot {slot}, shadow copy {shadow}: {why}"
            ),
        }
    }
}

/// Runs the rows in order: each row's action and counter ([`check`]), then its output
/// frame and its slots. A failure names the row.
pub fn run_table(sw: &mut Switch, rows: &[Row]) {
    for row in rows {
        let what = row.case.what;
        let before: Vec<SlotImage> = row.after.iter().map(|a| sw.slot(a.slot())).collect();
        let r = check(sw, &row.case);
        for out in &row.out {
            out.check(what, &row.case.frame, &r);
        }
        for (after, before) in row.after.iter().zip(&before) {
            after.check(what, before, &sw.slot(after.slot()));
        }
    }
}
