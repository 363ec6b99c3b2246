//! A datatype as the switch takes it: by its type signature (so many elements of one
//! type it takes), whatever handle each rank passes. MPI lets the ranks of a collective
//! pass different datatypes with the same signature (the root's `MPI_Type_vector` of a
//! matrix column, the others' `MPI_INT`s): every rank must decide alike whether the
//! switch serves the call, so the decision is the signature's. A datatype whose elements
//! lie back to back is served in place, as its element type; any other is packed into a
//! buffer of its elements first (`PMPI_Pack`) and its result unpacked at completion.

use std::ffi::{c_int, c_void};

use xagg_common::wire::DType;

use crate::abi::{
    handles, pmpi, Comm, Datatype, COMBINER_CONTIGUOUS, COMBINER_DUP, COMBINER_NAMED,
    COMBINER_RESIZED, COMBINER_STRUCT, SUCCESS,
};

/// Why a datatype is not served (the same on every rank: a signature's).
pub const NOT_SERVED: &str =
    "a datatype the switch does not take (it takes MPI_INT, MPI_UNSIGNED, MPI_LONG, \
     MPI_LONG_LONG, MPI_INT32_T, MPI_UINT32_T, MPI_INT64_T, MPI_FLOAT, MPI_DOUBLE and \
     Fortran's INTEGER, REAL and DOUBLE PRECISION of 4 and 8 bytes, and datatypes built \
     of one of them)";

/// How deep a derived datatype's construction is followed.
const MAX_DEPTH: usize = 16;

/// A datatype's signature and layout.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// The predefined type of its elements, and the switch's.
    pub element: Datatype,
    pub dtype: DType,
    /// Elements per item of the datatype.
    pub per: c_int,
    /// Whether `n` items are `n * per` elements back to back (else: packed).
    pub contiguous: bool,
}

/// The layout of `t`, or why the switch does not take it.
pub fn of(t: Datatype) -> Result<Layout, &'static str> {
    let h = handles();
    if let Some(dtype) = h.dtype(t) {
        return Ok(Layout {
            element: t,
            dtype,
            per: 1,
            contiguous: true,
        });
    }
    if let Some(one) = h.pair(t) {
        let dtype = h.dtype(one).expect("a pair of a type the switch takes");
        return Ok(Layout {
            element: one,
            dtype,
            per: 2,
            contiguous: true,
        });
    }
    let element = element_of(t, 0).ok_or(NOT_SERVED)?;
    let dtype = h.dtype(element).expect("an element type the switch takes");
    let (size, dense) = extent(t);
    let one = dtype.size() as c_int;
    if size % one != 0 {
        return Err(NOT_SERVED);
    }
    Ok(Layout {
        element,
        dtype,
        per: size / one,
        // No gaps is not enough: an indexed type may hold its elements back to back in
        // another order. Only constructors that keep them in order are used in place.
        contiguous: dense && in_order(t, 0),
    })
}

/// Whether `t`'s elements lie in memory in the order of its type signature, as far as
/// its constructors show it: a predefined type, a pair, and a duplicate, a contiguous
/// run (of a type without gaps) or a resizing of one (the caller checks the whole for
/// gaps). Anything else is packed, which is always right.
fn in_order(t: Datatype, depth: usize) -> bool {
    let h = handles();
    if h.dtype(t).is_some() || h.pair(t).is_some() {
        return true;
    }
    if depth >= MAX_DEPTH {
        return false;
    }
    let Some((combiner, _, types)) = constructor(t) else {
        return false;
    };
    let ordered = [COMBINER_DUP, COMBINER_CONTIGUOUS, COMBINER_RESIZED].contains(&combiner)
        && types.len() == 1
        && in_order(types[0], depth + 1)
        && (combiner != COMBINER_CONTIGUOUS || extent(types[0]).1);
    types.into_iter().for_each(free_if_derived);
    ordered
}

/// How `t` was built: its combiner, its integer arguments and the datatypes it names (to
/// be freed with [`free_if_derived`]); none for a predefined type, or one built of no
/// datatype.
fn constructor(t: Datatype) -> Option<(c_int, Vec<c_int>, Vec<Datatype>)> {
    let p = pmpi();
    let (mut ni, mut na, mut nd, mut combiner) = (0, 0, 0, 0);
    // Safety: a datatype handle, the program's or one its construction names.
    unsafe { (p.type_get_envelope)(t, &mut ni, &mut na, &mut nd, &mut combiner) };
    if combiner == COMBINER_NAMED || nd <= 0 {
        return None;
    }
    let mut ints = vec![0 as c_int; ni.max(0) as usize];
    let mut addrs = vec![0isize; na.max(0) as usize];
    let mut types: Vec<Datatype> = vec![std::ptr::null_mut(); nd as usize];
    // Safety: arrays of the sizes the envelope gave.
    let rc = unsafe {
        (p.type_get_contents)(
            t,
            ni,
            na,
            nd,
            ints.as_mut_ptr(),
            addrs.as_mut_ptr(),
            types.as_mut_ptr(),
        )
    };
    (rc == SUCCESS).then_some((combiner, ints, types))
}

/// `t`'s size in bytes, and whether items of it repeated lie back to back with no gaps.
fn extent(t: Datatype) -> (c_int, bool) {
    let p = pmpi();
    let (mut size, mut lb, mut extent, mut true_lb, mut true_extent) = (0, 0, 0, 0, 0);
    // Safety: a datatype handle.
    unsafe {
        (p.type_size)(t, &mut size);
        (p.type_get_extent)(t, &mut lb, &mut extent);
        (p.type_get_true_extent)(t, &mut true_lb, &mut true_extent);
    }
    let bytes = size as isize;
    let dense = lb == 0 && true_lb == 0 && extent == bytes && true_extent == bytes;
    (size, dense)
}

/// The one predefined type, one the switch takes, that every element of `t` is; none
/// if its elements are of several types or of one it does not take.
fn element_of(t: Datatype, depth: usize) -> Option<Datatype> {
    let h = handles();
    if h.dtype(t).is_some() {
        return Some(t);
    }
    if let Some(one) = h.pair(t) {
        return Some(one);
    }
    if depth >= MAX_DEPTH {
        return None;
    }
    // A predefined type the switch does not take, or one built of no datatype: none.
    let (combiner, ints, types) = constructor(t)?;
    // A struct's blocks of no elements add nothing to its signature.
    let used = |i: usize| !COMBINER_STRUCT.contains(&combiner) || ints.get(1 + i) != Some(&0);
    let mut found: Option<(Datatype, DType)> = None;
    let mut alike = true;
    for (i, &inner) in types.iter().enumerate() {
        if alike && used(i) {
            match element_of(inner, depth + 1) {
                Some(e) => {
                    let d = h.dtype(e).expect("an element type the switch takes");
                    match found {
                        None => found = Some((e, d)),
                        Some((_, seen)) if seen == d => {}
                        Some(_) => alike = false,
                    }
                }
                None => alike = false,
            }
        }
        free_if_derived(inner);
    }
    found.filter(|_| alike).map(|(e, _)| e)
}

/// Frees a handle `MPI_Type_get_contents` returned, unless it is a predefined one (which
/// must not be freed).
fn free_if_derived(t: Datatype) {
    let p = pmpi();
    let (mut ni, mut na, mut nd, mut combiner) = (0, 0, 0, 0);
    // Safety: a handle the contents call returned.
    unsafe {
        (p.type_get_envelope)(t, &mut ni, &mut na, &mut nd, &mut combiner);
        if combiner != COMBINER_NAMED {
            let mut t = t;
            (p.type_free)(&mut t);
        }
    }
}

/// A call's buffers packed into its elements' order, and where its result goes back.
pub struct Staged {
    /// The packed input (none in place, or where the rank gives no input).
    pub input: Option<Vec<u8>>,
    /// Where the switch writes the result (in place: the packed input).
    pub output: Vec<u8>,
    /// Items of the program's datatype to unpack from `output` into its buffer at
    /// completion (none where this rank gets no result). The datatype is a duplicate of
    /// the program's, freed here: MPI lets a program free its own before the call
    /// completes.
    pub unpack: Option<(*mut c_void, c_int, Datatype)>,
    pub comm: Comm,
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some((_, _, mut t)) = self.unpack.take() {
            // Safety: our duplicate, freed once.
            unsafe { (pmpi().type_free)(&mut t) };
        }
    }
}

/// Packs `items` of `t` at `from`, in `elements` elements of `dtype`.
///
/// # Safety
/// `from` holds `items` of `t`, as MPI's contract on the call's buffer says.
pub unsafe fn pack(
    from: *const c_void,
    items: c_int,
    t: Datatype,
    bytes: usize,
    comm: Comm,
) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    let mut position = 0;
    // Safety: `out` holds `bytes`, the packed size of `items` of `t` (their elements).
    unsafe {
        (pmpi().pack)(
            from,
            items,
            t,
            out.as_mut_ptr().cast(),
            bytes as c_int,
            &mut position,
            comm,
        )
    };
    out
}

impl Staged {
    /// Unpacks the result into the program's buffer (at a call's completion).
    pub fn finish(&mut self) {
        if let Some((to, items, t)) = self.unpack.take() {
            let mut position = 0;
            // Safety: the program's buffer holds `items` of `t` (MPI's contract), and
            // `output` their packed elements.
            unsafe {
                (pmpi().unpack)(
                    self.output.as_ptr().cast(),
                    self.output.len() as c_int,
                    &mut position,
                    to,
                    items,
                    t,
                    self.comm,
                )
            };
            let mut t = t;
            // Safety: our duplicate, freed once.
            unsafe { (pmpi().type_free)(&mut t) };
        }
    }
}

/// A call's arguments as the switch takes them: counts in elements of `element`, the
/// buffers the program's own or, for a datatype that is not contiguous, packed ones.
pub struct Normal {
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: c_int,
    pub element: Datatype,
    pub counts: Option<Vec<c_int>>,
    pub stage: Option<Staged>,
}

/// What a collective's ranks pass: its kind, buffers and counts as [`crate::call::Args`]
/// says (`count` the block's for a reduce-scatter and an all-gather), the send side's
/// own count and datatype where it has them (an all-gather's), the root and the
/// communicator.
pub struct Given {
    pub kind: crate::call::Kind,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: c_int,
    pub datatype: Datatype,
    pub send_side: Option<(c_int, Datatype)>,
    pub counts: Option<Vec<c_int>>,
    pub root: c_int,
    pub comm: Comm,
}

/// The call in elements of one type the switch takes, or why it is not served: the
/// same answer on every rank whatever datatypes each passes, as long as their
/// signatures agree (which MPI requires).
pub fn normalize(g: Given) -> Result<Normal, &'static str> {
    use crate::{abi::IN_PLACE, call::Kind};
    let recv_layout = of(g.datatype)?;
    let (send_items, send_type) = g.send_side.unwrap_or((g.count, g.datatype));
    let send_layout = if send_type == g.datatype {
        recv_layout
    } else {
        of(send_type)?
    };
    let in_place = g.send == IN_PLACE;
    if !in_place
        && g.kind != Kind::Bcast
        && (send_layout.dtype != recv_layout.dtype
            || send_items as i64 * send_layout.per as i64
                != g.count as i64 * recv_layout.per as i64)
    {
        return Err("a send count or type other than the receive's");
    }
    let per = recv_layout.per as i64;
    let scaled = |c: c_int| -> Result<c_int, &'static str> {
        c_int::try_from(c as i64 * per).map_err(|_| "more elements than an int counts")
    };
    let count = scaled(g.count)?;
    let counts = match &g.counts {
        Some(c) => Some(
            c.iter()
                .map(|&c| scaled(c))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    let mut normal = Normal {
        send: g.send,
        recv: g.recv,
        count,
        element: recv_layout.element,
        counts,
        stage: None,
    };
    let pack_send = !in_place && g.kind != Kind::Bcast && !send_layout.contiguous;
    if recv_layout.contiguous && !pack_send {
        return Ok(normal);
    }
    // Only a packed call needs this rank and the communicator's size.
    let (mut rank, mut n) = (0, 0);
    // Safety: the program's communicator.
    unsafe {
        (pmpi().comm_rank)(g.comm, &mut rank);
        (pmpi().comm_size)(g.comm, &mut n);
    }
    let total = match &g.counts {
        Some(c) => c.iter().sum::<c_int>(),
        None => g.count * n,
    };
    let own = match &g.counts {
        Some(c) => c.get(rank as usize).copied().unwrap_or(0),
        None => g.count,
    };
    // Items of the receive datatype: kept in place, and this rank's result (none where
    // it gets none).
    let at_root = rank == g.root;
    let (in_place_items, out_items) = match g.kind {
        Kind::Allreduce => (g.count, Some(g.count)),
        Kind::ReduceScatter => (total, Some(own)),
        Kind::Allgather => (g.count * n, Some(g.count * n)),
        Kind::Bcast => (g.count, (!at_root).then_some(g.count)),
        Kind::Reduce => (g.count, at_root.then_some(g.count)),
    };
    let esize = recv_layout.dtype.size();
    let bytes = |items: c_int| items.max(0) as usize * recv_layout.per as usize * esize;
    let mut stage = Staged {
        input: None,
        output: Vec::new(),
        unpack: None,
        comm: g.comm,
    };
    if pack_send {
        // A reduce-scatter's input is every rank's block; an all-gather's, its own.
        let items = match g.kind {
            Kind::ReduceScatter => total,
            _ => send_items,
        };
        // Safety: MPI's contract: the send buffer holds these items of its datatype.
        let input = unsafe {
            pack(
                g.send,
                items,
                send_type,
                items.max(0) as usize * send_layout.per as usize * esize,
                g.comm,
            )
        };
        normal.send = stage.input.insert(input).as_ptr().cast();
    }
    if recv_layout.contiguous {
        // Only the send side packed: the result goes to the program's buffer as it is.
        normal.stage = Some(stage);
        return Ok(normal);
    }
    // The root's data of a broadcast is its buffer: packed as an in-place input is.
    let holds_input = in_place || (g.kind == Kind::Bcast && at_root);
    stage.output = if holds_input {
        // Safety: MPI's contract: the receive buffer holds these items.
        unsafe {
            pack(
                g.recv,
                in_place_items,
                g.datatype,
                bytes(in_place_items),
                g.comm,
            )
        }
    } else {
        vec![0u8; bytes(out_items.unwrap_or(g.count).max(g.count))]
    };
    normal.recv = stage.output.as_mut_ptr().cast();
    stage.unpack = out_items.map(|items| {
        let mut own: Datatype = std::ptr::null_mut();
        // Safety: the program's datatype, committed (MPI's contract for a call).
        unsafe { (pmpi().type_dup)(g.datatype, &mut own) };
        (g.recv, items, own)
    });
    normal.stage = Some(stage);
    Ok(normal)
}
