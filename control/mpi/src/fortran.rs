//! The Fortran spellings. Open MPI's `mpif.h` and `use mpi` bindings call `PMPI_`
//! directly, so the C entry points never see a Fortran program's calls: these take their
//! place (`mpi_allreduce_` and the other manglings compilers use), with Fortran's integer
//! handles and its own `MPI_IN_PLACE` (the address of a common block). `use mpi_f08` binds
//! to other symbols and is not intercepted: its calls are Open MPI's.

use std::ffi::c_void;

use crate::{
    abi::{handles, pmpi, sym, Comm, Fint, IN_PLACE, SUCCESS},
    guard,
};

/// The next definition of a Fortran entry point (Open MPI's `libmpi_mpifh`), as a
/// function of type `F`.
fn next<F: Copy>(name: &str) -> F {
    let p = sym(libc::RTLD_NEXT, name);
    if p.is_null() {
        crate::say(&format!(
            "Open MPI's Fortran library has no {name}: this library serves Open MPI (4.1) only"
        ));
        std::process::abort();
    }
    // Safety: `F` is the type of Open MPI's entry point of that name.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

/// Writes a Fortran call's error argument.
fn set_ierr(ierr: *mut Fint, rc: Fint) {
    if !ierr.is_null() {
        // Safety: the program's error argument.
        unsafe { *ierr = rc };
    }
}

fn comm(f: *const Fint) -> Comm {
    // Safety: the program's handle, converted by Open MPI.
    unsafe { (pmpi().comm_f2c)(*f) }
}

unsafe fn fortran_allreduce(
    send: *const c_void,
    recv: *mut c_void,
    count: *const Fint,
    datatype: *const Fint,
    op: *const Fint,
    c: *const Fint,
    ierr: *mut Fint,
) {
    let _entry = crate::entry::enter("MPI_ALLREDUCE (Fortran)");
    let p = pmpi();
    let send = if send == handles().fortran_in_place {
        IN_PLACE
    } else {
        send
    };
    // Safety: the program's Fortran handles and count, converted to C's and passed to the
    // C entry point.
    let rc = unsafe {
        crate::MPI_Allreduce(
            send,
            recv,
            *count,
            (p.type_f2c)(*datatype),
            (p.op_f2c)(*op),
            comm(c),
        )
    };
    set_ierr(ierr, rc);
}

/// A Fortran send buffer as C's: `MPI_IN_PLACE` is Fortran's own.
fn send_of(send: *const c_void) -> *const c_void {
    if send == handles().fortran_in_place {
        IN_PLACE
    } else {
        send
    }
}

unsafe fn fortran_reduce_scatter_block(
    send: *const c_void,
    recv: *mut c_void,
    count: *const Fint,
    datatype: *const Fint,
    op: *const Fint,
    c: *const Fint,
    ierr: *mut Fint,
) {
    let _entry = crate::entry::enter("MPI_REDUCE_SCATTER_BLOCK (Fortran)");
    let p = pmpi();
    // Safety: the program's Fortran handles and count, converted to C's.
    let rc = unsafe {
        crate::MPI_Reduce_scatter_block(
            send_of(send),
            recv,
            *count,
            (p.type_f2c)(*datatype),
            (p.op_f2c)(*op),
            comm(c),
        )
    };
    set_ierr(ierr, rc);
}

/// `MPI_REDUCE_SCATTER`: `counts` one per rank (a Fortran INTEGER is C's int).
unsafe fn fortran_reduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    counts: *const Fint,
    datatype: *const Fint,
    op: *const Fint,
    c: *const Fint,
    ierr: *mut Fint,
) {
    let _entry = crate::entry::enter("MPI_REDUCE_SCATTER (Fortran)");
    let p = pmpi();
    // Safety: the program's Fortran handles and counts, converted to C's.
    let rc = unsafe {
        crate::MPI_Reduce_scatter(
            send_of(send),
            recv,
            counts,
            (p.type_f2c)(*datatype),
            (p.op_f2c)(*op),
            comm(c),
        )
    };
    set_ierr(ierr, rc);
}

#[allow(clippy::too_many_arguments)]
unsafe fn fortran_allgather(
    send: *const c_void,
    send_count: *const Fint,
    send_type: *const Fint,
    recv: *mut c_void,
    recv_count: *const Fint,
    recv_type: *const Fint,
    c: *const Fint,
    ierr: *mut Fint,
) {
    let _entry = crate::entry::enter("MPI_ALLGATHER (Fortran)");
    let p = pmpi();
    // Safety: the program's Fortran handles and counts, converted to C's.
    let rc = unsafe {
        crate::MPI_Allgather(
            send_of(send),
            *send_count,
            (p.type_f2c)(*send_type),
            recv,
            *recv_count,
            (p.type_f2c)(*recv_type),
            comm(c),
        )
    };
    set_ierr(ierr, rc);
}

unsafe fn fortran_bcast(
    buffer: *mut c_void,
    count: *const Fint,
    datatype: *const Fint,
    root: *const Fint,
    c: *const Fint,
    ierr: *mut Fint,
) {
    let _entry = crate::entry::enter("MPI_BCAST (Fortran)");
    let p = pmpi();
    // Safety: the program's Fortran handles and count, converted to C's.
    let rc = unsafe { crate::MPI_Bcast(buffer, *count, (p.type_f2c)(*datatype), *root, comm(c)) };
    set_ierr(ierr, rc);
}

#[allow(clippy::too_many_arguments)]
unsafe fn fortran_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: *const Fint,
    datatype: *const Fint,
    op: *const Fint,
    root: *const Fint,
    c: *const Fint,
    ierr: *mut Fint,
) {
    let _entry = crate::entry::enter("MPI_REDUCE (Fortran)");
    let p = pmpi();
    // Safety: the program's Fortran handles and count, converted to C's.
    let rc = unsafe {
        crate::MPI_Reduce(
            send_of(send),
            recv,
            *count,
            (p.type_f2c)(*datatype),
            (p.op_f2c)(*op),
            *root,
            comm(c),
        )
    };
    set_ierr(ierr, rc);
}

unsafe fn fortran_barrier(c: *const Fint, ierr: *mut Fint) {
    let _entry = crate::entry::enter("MPI_BARRIER (Fortran)");
    // Safety: the C entry point with the converted handle.
    set_ierr(ierr, unsafe { crate::MPI_Barrier(comm(c)) });
}

unsafe fn fortran_comm_free(c: *mut Fint, ierr: *mut Fint, name: &str) {
    guard(|| {
        crate::retire(crate::comm::key(comm(c)), "MPI_COMM_FREE (Fortran)");
        SUCCESS
    });
    let f: unsafe extern "C" fn(*mut Fint, *mut Fint) = next(name);
    // Safety: Open MPI's own Fortran entry point of this spelling.
    unsafe { f(c, ierr) };
}

unsafe fn fortran_finalize(ierr: *mut Fint, name: &str) {
    guard(|| {
        crate::finalize();
        SUCCESS
    });
    let f: unsafe extern "C" fn(*mut Fint) = next(name);
    // Safety: Open MPI's own Fortran entry point of this spelling.
    unsafe { f(ierr) };
}

macro_rules! allreduce_spellings {
    ($($name:ident)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            send: *const c_void,
            recv: *mut c_void,
            count: *const Fint,
            datatype: *const Fint,
            op: *const Fint,
            c: *const Fint,
            ierr: *mut Fint,
        ) {
            // Safety: the program's arguments.
            unsafe { fortran_allreduce(send, recv, count, datatype, op, c, ierr) }
        }
    )*};
}

macro_rules! barrier_spellings {
    ($($name:ident)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(c: *const Fint, ierr: *mut Fint) {
            // Safety: the program's arguments.
            unsafe { fortran_barrier(c, ierr) }
        }
    )*};
}

macro_rules! comm_free_spellings {
    ($($name:ident)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(c: *mut Fint, ierr: *mut Fint) {
            // Safety: the program's arguments; the next definition of the same name.
            unsafe { fortran_comm_free(c, ierr, stringify!($name)) }
        }
    )*};
}

macro_rules! finalize_spellings {
    ($($name:ident)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(ierr: *mut Fint) {
            // Safety: the program's argument; the next definition of the same name.
            unsafe { fortran_finalize(ierr, stringify!($name)) }
        }
    )*};
}

/// The spellings of a reduce-scatter's entry point (`$f` the block form's or the counts'):
/// the same arguments, a count or an array of them.
macro_rules! reduce_scatter_spellings {
    ($f:ident: $($name:ident)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            send: *const c_void,
            recv: *mut c_void,
            count: *const Fint,
            datatype: *const Fint,
            op: *const Fint,
            c: *const Fint,
            ierr: *mut Fint,
        ) {
            // Safety: the program's arguments.
            unsafe { $f(send, recv, count, datatype, op, c, ierr) }
        }
    )*};
}

macro_rules! allgather_spellings {
    ($($name:ident)*) => {$(
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            send: *const c_void,
            send_count: *const Fint,
            send_type: *const Fint,
            recv: *mut c_void,
            recv_count: *const Fint,
            recv_type: *const Fint,
            c: *const Fint,
            ierr: *mut Fint,
        ) {
            // Safety: the program's arguments.
            unsafe {
                fortran_allgather(send, send_count, send_type, recv, recv_count, recv_type, c, ierr)
            }
        }
    )*};
}

macro_rules! bcast_spellings {
    ($($name:ident)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            buffer: *mut c_void,
            count: *const Fint,
            datatype: *const Fint,
            root: *const Fint,
            c: *const Fint,
            ierr: *mut Fint,
        ) {
            // Safety: the program's arguments.
            unsafe { fortran_bcast(buffer, count, datatype, root, c, ierr) }
        }
    )*};
}

macro_rules! reduce_spellings {
    ($($name:ident)*) => {$(
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            send: *const c_void,
            recv: *mut c_void,
            count: *const Fint,
            datatype: *const Fint,
            op: *const Fint,
            root: *const Fint,
            c: *const Fint,
            ierr: *mut Fint,
        ) {
            // Safety: the program's arguments.
            unsafe { fortran_reduce(send, recv, count, datatype, op, root, c, ierr) }
        }
    )*};
}

allreduce_spellings!(mpi_allreduce_ mpi_allreduce__ mpi_allreduce MPI_ALLREDUCE);
reduce_scatter_spellings!(fortran_reduce_scatter_block:
    mpi_reduce_scatter_block_ mpi_reduce_scatter_block__ mpi_reduce_scatter_block
    MPI_REDUCE_SCATTER_BLOCK
);
reduce_scatter_spellings!(fortran_reduce_scatter:
    mpi_reduce_scatter_ mpi_reduce_scatter__ mpi_reduce_scatter MPI_REDUCE_SCATTER
);
allgather_spellings!(mpi_allgather_ mpi_allgather__ mpi_allgather MPI_ALLGATHER);
bcast_spellings!(mpi_bcast_ mpi_bcast__ mpi_bcast MPI_BCAST);
reduce_spellings!(mpi_reduce_ mpi_reduce__ mpi_reduce MPI_REDUCE);
barrier_spellings!(mpi_barrier_ mpi_barrier__ mpi_barrier MPI_BARRIER);
comm_free_spellings!(mpi_comm_free_ mpi_comm_free__ mpi_comm_free MPI_COMM_FREE);
finalize_spellings!(mpi_finalize_ mpi_finalize__ mpi_finalize MPI_FINALIZE);
