//! Open MPI's C ABI (4.1, as Debian ships it): handles are pointers to objects whose
//! predefined instances are exported symbols (`ompi_mpi_comm_world`, `ompi_mpi_int`,
//! `ompi_mpi_op_sum`...). MPICH's integer handles differ entirely: not supported.
//!
//! Everything is found at run time with `dlsym` — the `PMPI_` entry points after this
//! library (`RTLD_NEXT`: Open MPI's), the predefined handles anywhere — so the library
//! builds without MPI's headers and does nothing in a process without Open MPI.

use std::{
    ffi::{c_char, c_int, c_void},
    sync::OnceLock,
};

use xagg_common::wire::{DType, Op};

pub type Comm = *mut c_void;
pub type Datatype = *mut c_void;
pub type MpiOp = *mut c_void;
pub type Request = *mut c_void;
pub type Fint = c_int;

/// `MPI_Status` of Open MPI.
#[repr(C)]
pub struct Status {
    pub source: c_int,
    pub tag: c_int,
    pub error: c_int,
    pub cancelled: c_int,
    pub ucount: usize,
}

pub const SUCCESS: c_int = 0;
pub const UNDEFINED: c_int = -32766;
/// `MPI_IN_PLACE` in C: Open MPI's `(void *) 1`, compared, never dereferenced.
#[expect(
    clippy::manual_dangling_ptr,
    reason = "the value is Open MPI's, not any pointer"
)]
pub const IN_PLACE: *const c_void = 1 as *const c_void;

type AllreduceFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, Datatype, MpiOp, Comm) -> c_int;
pub type IreduceScatterBlockFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    c_int,
    Datatype,
    MpiOp,
    Comm,
    *mut Request,
) -> c_int;
pub type IallgatherFn = unsafe extern "C" fn(
    *const c_void,
    c_int,
    Datatype,
    *mut c_void,
    c_int,
    Datatype,
    Comm,
    *mut Request,
) -> c_int;
pub type IbcastFn =
    unsafe extern "C" fn(*mut c_void, c_int, Datatype, c_int, Comm, *mut Request) -> c_int;
pub type IreduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    c_int,
    Datatype,
    MpiOp,
    c_int,
    Comm,
    *mut Request,
) -> c_int;
pub type ReduceScatterFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, *const c_int, Datatype, MpiOp, Comm) -> c_int;
pub type IreduceScatterFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    *const c_int,
    Datatype,
    MpiOp,
    Comm,
    *mut Request,
) -> c_int;
pub type ReduceScatterBlockFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, Datatype, MpiOp, Comm) -> c_int;
pub type ReduceFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, Datatype, MpiOp, c_int, Comm) -> c_int;
type IallreduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    c_int,
    Datatype,
    MpiOp,
    Comm,
    *mut Request,
) -> c_int;
pub type QueryFn = unsafe extern "C" fn(*mut c_void, *mut Status) -> c_int;
pub type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type CancelFn = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;

/// The `PMPI_` functions this library calls.
pub struct Pmpi {
    pub init: unsafe extern "C" fn(*mut c_int, *mut *mut *mut c_char) -> c_int,
    pub init_thread:
        unsafe extern "C" fn(*mut c_int, *mut *mut *mut c_char, c_int, *mut c_int) -> c_int,
    pub finalize: unsafe extern "C" fn() -> c_int,
    pub allreduce: AllreduceFn,
    pub iallreduce: IallreduceFn,
    pub barrier: unsafe extern "C" fn(Comm) -> c_int,
    pub bcast: unsafe extern "C" fn(*mut c_void, c_int, Datatype, c_int, Comm) -> c_int,
    pub allgather: unsafe extern "C" fn(
        *const c_void,
        c_int,
        Datatype,
        *mut c_void,
        c_int,
        Datatype,
        Comm,
    ) -> c_int,
    pub comm_dup: unsafe extern "C" fn(Comm, *mut Comm) -> c_int,
    pub comm_free: unsafe extern "C" fn(*mut Comm) -> c_int,
    pub comm_size: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    pub comm_rank: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    pub comm_test_inter: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    pub type_size: unsafe extern "C" fn(Datatype, *mut c_int) -> c_int,
    pub grequest_start:
        unsafe extern "C" fn(QueryFn, FreeFn, CancelFn, *mut c_void, *mut Request) -> c_int,
    pub grequest_complete: unsafe extern "C" fn(Request) -> c_int,
    pub status_set_elements: unsafe extern "C" fn(*mut Status, Datatype, c_int) -> c_int,
    pub status_set_cancelled: unsafe extern "C" fn(*mut Status, c_int) -> c_int,
    pub wait: unsafe extern "C" fn(*mut Request, *mut Status) -> c_int,
    pub test: unsafe extern "C" fn(*mut Request, *mut c_int, *mut Status) -> c_int,
    pub waitall: unsafe extern "C" fn(c_int, *mut Request, *mut Status) -> c_int,
    pub waitany: unsafe extern "C" fn(c_int, *mut Request, *mut c_int, *mut Status) -> c_int,
    pub waitsome:
        unsafe extern "C" fn(c_int, *mut Request, *mut c_int, *mut c_int, *mut Status) -> c_int,
    pub testall: unsafe extern "C" fn(c_int, *mut Request, *mut c_int, *mut Status) -> c_int,
    pub testany:
        unsafe extern "C" fn(c_int, *mut Request, *mut c_int, *mut c_int, *mut Status) -> c_int,
    pub testsome:
        unsafe extern "C" fn(c_int, *mut Request, *mut c_int, *mut c_int, *mut Status) -> c_int,
    pub request_free: unsafe extern "C" fn(*mut Request) -> c_int,
    pub request_get_status: unsafe extern "C" fn(Request, *mut c_int, *mut Status) -> c_int,
    pub abort: unsafe extern "C" fn(Comm, c_int) -> c_int,
    pub ireduce_scatter_block: IreduceScatterBlockFn,
    pub ireduce_scatter: IreduceScatterFn,
    pub iallgather: IallgatherFn,
    pub ibcast: IbcastFn,
    pub ireduce: IreduceFn,
    pub reduce_scatter: ReduceScatterFn,
    pub reduce_scatter_block: ReduceScatterBlockFn,
    pub reduce: ReduceFn,
    pub comm_f2c: unsafe extern "C" fn(Fint) -> Comm,
    pub type_f2c: unsafe extern "C" fn(Fint) -> Datatype,
    pub op_f2c: unsafe extern "C" fn(Fint) -> MpiOp,
    pub comm_get_name: unsafe extern "C" fn(Comm, *mut c_char, *mut c_int) -> c_int,
    pub type_get_name: unsafe extern "C" fn(Datatype, *mut c_char, *mut c_int) -> c_int,
    /// A datatype's construction (`ni`, `na`, `nd`, combiner) and its arguments.
    pub type_get_envelope:
        unsafe extern "C" fn(Datatype, *mut c_int, *mut c_int, *mut c_int, *mut c_int) -> c_int,
    pub type_get_contents: unsafe extern "C" fn(
        Datatype,
        c_int,
        c_int,
        c_int,
        *mut c_int,
        *mut isize,
        *mut Datatype,
    ) -> c_int,
    pub type_get_extent: unsafe extern "C" fn(Datatype, *mut isize, *mut isize) -> c_int,
    pub type_get_true_extent: unsafe extern "C" fn(Datatype, *mut isize, *mut isize) -> c_int,
    pub type_free: unsafe extern "C" fn(*mut Datatype) -> c_int,
    pub type_dup: unsafe extern "C" fn(Datatype, *mut Datatype) -> c_int,
    pub pack: unsafe extern "C" fn(
        *const c_void,
        c_int,
        Datatype,
        *mut c_void,
        c_int,
        *mut c_int,
        Comm,
    ) -> c_int,
    pub unpack: unsafe extern "C" fn(
        *const c_void,
        c_int,
        *mut c_int,
        *mut c_void,
        c_int,
        Datatype,
        Comm,
    ) -> c_int,
}

/// `MPI_COMBINER_NAMED`: a predefined datatype.
pub const COMBINER_NAMED: c_int = 0;
/// `MPI_COMBINER_DUP`, `_CONTIGUOUS` and `_RESIZED`: the constructors that keep their one
/// inner type's elements in order.
pub const COMBINER_DUP: c_int = 1;
pub const COMBINER_CONTIGUOUS: c_int = 2;
pub const COMBINER_RESIZED: c_int = 17;
/// `MPI_COMBINER_STRUCT` (and the MPI-1 `_INTEGER` form before it): its integers are the
/// count and each block's length, one datatype per block.
pub const COMBINER_STRUCT: [c_int; 2] = [10, 11];

/// The predefined handles this library compares against.
pub struct Handles {
    pub comm_world: Comm,
    pub byte: Datatype,
    pub int: Datatype,
    /// Fortran's `MPI_IN_PLACE`: the address of this common block.
    pub fortran_in_place: *const c_void,
    pub op_sum: MpiOp,
    pub op_min: MpiOp,
    types: Vec<(Datatype, DType)>,
    /// The pair types (`MPI_2INT`, ...): two of a type the switch takes, and that type.
    pairs: Vec<(Datatype, Datatype)>,
    ops: Vec<(MpiOp, Op)>,
    /// Every predefined op and its name, for messages (MPI cannot name an op).
    op_names: Vec<(MpiOp, &'static str)>,
}

// Safety: the handles are addresses of Open MPI's static objects, never written here.
unsafe impl Send for Handles {}
unsafe impl Sync for Handles {}

pub fn sym(handle: *mut c_void, name: &str) -> *mut c_void {
    let c = std::ffi::CString::new(name).expect("no NUL in a symbol name");
    // Safety: dlsym with a valid handle and a NUL-terminated name.
    unsafe { libc::dlsym(handle, c.as_ptr()) }
}

/// Open MPI's library when a module loaded it privately (mpi4py: Python loads extension
/// modules with RTLD_LOCAL, so its symbols are in no global scope).
fn libmpi() -> *mut c_void {
    for name in [c"libmpi.so.40", c"libmpi.so"] {
        // Safety: RTLD_NOLOAD only finds a library already loaded.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if !h.is_null() {
            return h;
        }
    }
    std::ptr::null_mut()
}

/// A symbol of Open MPI's, searched in `order`, then in Open MPI's library itself.
fn lookup_in(order: [*mut c_void; 2], name: &str) -> *mut c_void {
    for h in order {
        let p = sym(h, name);
        if !p.is_null() {
            return p;
        }
    }
    match libmpi() {
        h if h.is_null() => h,
        h => sym(h, name),
    }
}

/// A function: the next definition after this library's (Open MPI's `PMPI_`), else any.
fn lookup(name: &str) -> *mut c_void {
    lookup_in([libc::RTLD_NEXT, libc::RTLD_DEFAULT], name)
}

/// A predefined handle: the global scope's first definition, since a program that names
/// `MPI_INT` holds a copy of `ompi_mpi_int` (a copy relocation) which Open MPI then uses
/// too, not the one in Open MPI's library.
fn handle(name: &str) -> *mut c_void {
    lookup_in([libc::RTLD_DEFAULT, libc::RTLD_DEFAULT], name)
}

fn function<T: Copy>(name: &str) -> Option<T> {
    let p = lookup(name);
    if p.is_null() {
        return None;
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // Safety: `T` is the function pointer type of `name` in Open MPI's ABI.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn load() -> Option<Pmpi> {
    Some(Pmpi {
        init: function("PMPI_Init")?,
        init_thread: function("PMPI_Init_thread")?,
        finalize: function("PMPI_Finalize")?,
        allreduce: function("PMPI_Allreduce")?,
        iallreduce: function("PMPI_Iallreduce")?,
        barrier: function("PMPI_Barrier")?,
        bcast: function("PMPI_Bcast")?,
        allgather: function("PMPI_Allgather")?,
        comm_dup: function("PMPI_Comm_dup")?,
        comm_free: function("PMPI_Comm_free")?,
        comm_size: function("PMPI_Comm_size")?,
        comm_rank: function("PMPI_Comm_rank")?,
        comm_test_inter: function("PMPI_Comm_test_inter")?,
        type_size: function("PMPI_Type_size")?,
        grequest_start: function("PMPI_Grequest_start")?,
        grequest_complete: function("PMPI_Grequest_complete")?,
        status_set_elements: function("PMPI_Status_set_elements")?,
        status_set_cancelled: function("PMPI_Status_set_cancelled")?,
        wait: function("PMPI_Wait")?,
        test: function("PMPI_Test")?,
        waitall: function("PMPI_Waitall")?,
        waitany: function("PMPI_Waitany")?,
        waitsome: function("PMPI_Waitsome")?,
        testall: function("PMPI_Testall")?,
        testany: function("PMPI_Testany")?,
        testsome: function("PMPI_Testsome")?,
        request_free: function("PMPI_Request_free")?,
        request_get_status: function("PMPI_Request_get_status")?,
        abort: function("PMPI_Abort")?,
        ireduce_scatter_block: function("PMPI_Ireduce_scatter_block")?,
        ireduce_scatter: function("PMPI_Ireduce_scatter")?,
        iallgather: function("PMPI_Iallgather")?,
        ibcast: function("PMPI_Ibcast")?,
        ireduce: function("PMPI_Ireduce")?,
        reduce_scatter: function("PMPI_Reduce_scatter")?,
        reduce_scatter_block: function("PMPI_Reduce_scatter_block")?,
        reduce: function("PMPI_Reduce")?,
        comm_f2c: function("PMPI_Comm_f2c")?,
        type_f2c: function("PMPI_Type_f2c")?,
        op_f2c: function("PMPI_Op_f2c")?,
        comm_get_name: function("PMPI_Comm_get_name")?,
        type_get_name: function("PMPI_Type_get_name")?,
        type_get_envelope: function("PMPI_Type_get_envelope")?,
        type_get_contents: function("PMPI_Type_get_contents")?,
        type_get_extent: function("PMPI_Type_get_extent")?,
        type_get_true_extent: function("PMPI_Type_get_true_extent")?,
        type_free: function("PMPI_Type_free")?,
        type_dup: function("PMPI_Type_dup")?,
        pack: function("PMPI_Pack")?,
        unpack: function("PMPI_Unpack")?,
    })
}

/// Open MPI's `PMPI_` functions. Only reached from an exported MPI function, which the
/// program can only call with Open MPI loaded: a missing one is a broken installation.
pub fn pmpi() -> &'static Pmpi {
    static P: OnceLock<Pmpi> = OnceLock::new();
    P.get_or_init(|| {
        load().unwrap_or_else(|| {
            crate::say(
                "the MPI program runs without Open MPI's PMPI_ functions: this library serves Open MPI (4.1) only",
            );
            std::process::abort()
        })
    })
}

/// The predefined handles (resolved once).
pub fn handles() -> &'static Handles {
    static H: OnceLock<Handles> = OnceLock::new();
    H.get_or_init(|| {
        let d = handle;
        let mut types = Vec::new();
        for (names, t) in [
            // C types and their fixed-size names.
            (&["ompi_mpi_int", "ompi_mpi_int32_t"][..], DType::I32),
            (&["ompi_mpi_unsigned", "ompi_mpi_uint32_t"][..], DType::U32),
            (
                &[
                    "ompi_mpi_long",
                    "ompi_mpi_int64_t",
                    "ompi_mpi_long_long_int",
                ][..],
                DType::I64,
            ),
            (&["ompi_mpi_float"][..], DType::F32),
            (&["ompi_mpi_double"][..], DType::F64),
            // Fortran's: INTEGER and REAL are 4 bytes unless the program was compiled
            // otherwise, which `fortran_type` checks with the handle's size.
            (&["ompi_mpi_integer4"][..], DType::I32),
            (&["ompi_mpi_integer8"][..], DType::I64),
            (&["ompi_mpi_real4"][..], DType::F32),
            (&["ompi_mpi_real8", "ompi_mpi_dblprec"][..], DType::F64),
        ] {
            for n in names {
                let p = d(n);
                if !p.is_null() {
                    types.push((p, t));
                }
            }
        }
        // INTEGER and REAL: by their size.
        for n in ["ompi_mpi_integer", "ompi_mpi_real"] {
            let p = d(n);
            if p.is_null() {
                continue;
            }
            let mut size = 0;
            // Safety: a predefined datatype handle.
            unsafe { (pmpi().type_size)(p, &mut size) };
            let t = match (n, size) {
                ("ompi_mpi_integer", 4) => DType::I32,
                ("ompi_mpi_integer", 8) => DType::I64,
                ("ompi_mpi_real", 4) => DType::F32,
                ("ompi_mpi_real", 8) => DType::F64,
                _ => continue,
            };
            types.push((p, t));
        }
        let ops = [
            ("ompi_mpi_op_sum", Op::Sum),
            ("ompi_mpi_op_min", Op::Min),
            ("ompi_mpi_op_max", Op::Max),
            ("ompi_mpi_op_prod", Op::Prod),
            ("ompi_mpi_op_band", Op::And),
            ("ompi_mpi_op_bor", Op::Or),
            ("ompi_mpi_op_bxor", Op::Xor),
        ]
        .into_iter()
        .map(|(n, o)| (d(n), o))
        .filter(|(p, _)| !p.is_null())
        .collect();
        let op_names = [
            "sum", "min", "max", "prod", "land", "band", "lor", "bor", "lxor", "bxor", "maxloc",
            "minloc", "replace", "no_op",
        ]
        .into_iter()
        .zip([
            "MPI_SUM",
            "MPI_MIN",
            "MPI_MAX",
            "MPI_PROD",
            "MPI_LAND",
            "MPI_BAND",
            "MPI_LOR",
            "MPI_BOR",
            "MPI_LXOR",
            "MPI_BXOR",
            "MPI_MAXLOC",
            "MPI_MINLOC",
            "MPI_REPLACE",
            "MPI_NO_OP",
        ])
        .map(|(n, name)| (d(&format!("ompi_mpi_op_{n}")), name))
        .filter(|(p, _)| !p.is_null())
        .collect();
        let pairs = [
            ("ompi_mpi_2int", "ompi_mpi_int"),
            ("ompi_mpi_2integer", "ompi_mpi_integer"),
            ("ompi_mpi_2real", "ompi_mpi_real"),
            ("ompi_mpi_2dblprec", "ompi_mpi_dblprec"),
        ]
        .into_iter()
        .map(|(pair, one)| (d(pair), d(one)))
        .filter(|(p, o)| !p.is_null() && types.iter().any(|(t, _)| t == o))
        .collect();
        Handles {
            comm_world: d("ompi_mpi_comm_world"),
            byte: d("ompi_mpi_byte"),
            int: d("ompi_mpi_int"),
            fortran_in_place: d("mpi_fortran_in_place_"),
            op_sum: d("ompi_mpi_op_sum"),
            op_min: d("ompi_mpi_op_min"),
            types,
            pairs,
            ops,
            op_names,
        }
    })
}

impl Handles {
    /// The wire type of an MPI datatype the switch reduces.
    pub fn dtype(&self, t: Datatype) -> Option<DType> {
        self.types.iter().find(|(p, _)| *p == t).map(|(_, d)| *d)
    }

    /// The type a pair type (`MPI_2INT`) is two of, if the switch takes that type.
    pub fn pair(&self, t: Datatype) -> Option<Datatype> {
        self.pairs.iter().find(|(p, _)| *p == t).map(|(_, o)| *o)
    }

    /// The switch's op of a predefined MPI op (MPI has no mean).
    pub fn op(&self, o: MpiOp) -> Option<Op> {
        self.ops.iter().find(|(p, _)| *p == o).map(|(_, d)| *d)
    }

    /// An op's name: a predefined one's, else that it is the program's own.
    pub fn op_name(&self, o: MpiOp) -> &'static str {
        self.op_names
            .iter()
            .find(|(p, _)| *p == o)
            .map_or("an op of the program's own (MPI_Op_create)", |(_, n)| *n)
    }
}

/// A datatype's name: a predefined one's (`MPI_SHORT`), or one the program gave it
/// (`MPI_Type_set_name`); else that it is derived.
pub fn type_name(t: Datatype) -> String {
    // MPI_MAX_OBJECT_NAME is 64 in Open MPI.
    let mut buf = [0 as c_char; 256];
    let mut len: c_int = 0;
    // Safety: a buffer longer than any name Open MPI writes.
    let rc = unsafe { (pmpi().type_get_name)(t, buf.as_mut_ptr(), &mut len) };
    if rc == SUCCESS && len > 0 {
        // Safety: Open MPI wrote a NUL-terminated name.
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else {
        "a derived datatype".into()
    }
}
