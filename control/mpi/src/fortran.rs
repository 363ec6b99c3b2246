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

unsafe fn fortran_barrier(c: *const Fint, ierr: *mut Fint) {
    let _entry = crate::entry::enter("MPI_BARRIER (Fortran)");
    // Safety: the C entry point with the converted handle.
    set_ierr(ierr, unsafe { crate::MPI_Barrier(comm(c)) });
}

unsafe fn fortran_comm_free(c: *mut Fint, ierr: *mut Fint, name: &str) {
    guard(|| {
        crate::retire(crate::comm::key(comm(c)));
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

allreduce_spellings!(mpi_allreduce_ mpi_allreduce__ mpi_allreduce MPI_ALLREDUCE);
barrier_spellings!(mpi_barrier_ mpi_barrier__ mpi_barrier MPI_BARRIER);
comm_free_spellings!(mpi_comm_free_ mpi_comm_free__ mpi_comm_free MPI_COMM_FREE);
finalize_spellings!(mpi_finalize_ mpi_finalize__ mpi_finalize MPI_FINALIZE);
