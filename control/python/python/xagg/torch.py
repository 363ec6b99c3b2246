"""A ``torch.distributed`` backend named ``"xagg"`` (PyTorch 1.13), and a DDP communication
hook for programs that keep Gloo.

A DDP script changes only its backend name::

    dist.init_process_group("xagg", ...)   # was "gloo"

(the installed package registers the backend at the first call naming it, through its
start-up hook `_xagg_autoload`; ``import xagg.torch`` registers it explicitly).

The launcher's world is the job: rank 0 draws the job's key and secret and puts them in the
c10d store; every rank joins through the daemon's listener (``XAGG_DAEMON``), the first
with the credential (``XAGG_CREDENTIAL``). ``allreduce`` of contiguous CPU tensors of
int32, int64, float16, float32 and float64 goes through the switch (a strided one as a
contiguous copy) (sum, min, max, avg;
product and bitwise ops of integers); every other collective, and every other tensor, goes
to an inner Gloo group made from the same store.

Each allreduce returns at once; a completion thread waits for the switch (the GIL released)
and hands the result to the future: nothing is asked of Gloo. Futures are completed, and
their callbacks run, on threads of their own (a pool that grows while callbacks block), so
a callback may start and wait for another allreduce, as PowerSGD's DDP hook does. A call
its caller waits for at once (torch.distributed's functions without ``async_op``) made
while no other is in flight is finished on the caller's thread instead: the two hand-offs
between threads took most of a small call's time. If the switch stops
answering, the result is taken from the ranks that hold it (every rank runs a small
responder); what no rank holds is found so by every rank for the same call, and Gloo makes
that allreduce, and every later one, from the kept input on every rank (through a private
Gloo group, in the calls' order). A result flagged by the switch (NaN or infinity in a
float sum) is made by Gloo too, on every rank alike. A slow rank is no failure: the call
waits while the switch says whom it waits for, up to the group's timeout, and then fails
naming them. The replicas never diverge. An internal error makes the next call of the
backend raise.
"""

import atexit
import concurrent.futures
import os
import queue
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceOptions, BroadcastOptions, ReduceOp, ReduceOptions, _create_work_from_future

from . import Job, Route, XaggError, new_key, segment_bytes

__all__ = ["ProcessGroupXagg", "HookState", "allreduce_hook"]

_DTYPES = {torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64}
_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
# The switch's names of the types it reduces, as its route by size takes them.
_WIRE_NAMES = {
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
}

# Votes of the agreement on joining (the minimum wins).
_FAILED, _OK = 0, 2

# How a call was made: the summary's columns, per entry point.
_WAYS = ["switch", "recovered from peers", "routed by size", "flagged and redone", "fallback", "passed"]
SWITCH, RECOVERED, ROUTED, FLAGGED, FALLBACK, PASSED = range(6)
# The entry points of the collectives besides allreduce.
_OTHERS = ("reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor", "broadcast", "reduce")


def _caller():
    """The torch.distributed function a call reached the backend from (None: another
    caller, such as DDP's reducer, from C++), and whether that function waits for the call
    at once (called without async_op, it waits as soon as the backend returns the call):
    asked by the backend's methods, the caller two frames up."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.endswith("distributed_c10d.py"):
        if "async_op" in f.f_code.co_varnames:
            return f.f_code.co_name, f.f_locals.get("async_op") is False
        f = f.f_back
    return None, False


def _allreduce_entry(caller, at_once):
    """The program's entry point of an allreduce: `all_reduce` or `all_reduce async`
    (torch.distributed's, with async_op), else DDP's reducer (its buckets, from C++) or
    another caller of the process group."""
    if caller != "all_reduce":
        return "DDP bucket (ProcessGroup.allreduce)"
    return "all_reduce" if at_once else "all_reduce async"


# The switch's op of each ReduceOp (by its enum: comparing ReduceOp objects is slow).
_OP_NAMES = {
    ReduceOp.RedOpType.SUM: "sum",
    ReduceOp.RedOpType.MIN: "min",
    ReduceOp.RedOpType.MAX: "max",
    ReduceOp.RedOpType.AVG: "avg",
    ReduceOp.RedOpType.PRODUCT: "prod",
    ReduceOp.RedOpType.BAND: "and",
    ReduceOp.RedOpType.BOR: "or",
    ReduceOp.RedOpType.BXOR: "xor",
}


def _op_name(op, dtype):
    """The switch's op for a ReduceOp (or its enum) over a dtype, or None when it does not
    take it."""
    v = _OP_NAMES.get(getattr(op, "op", op))
    if v is None or (dtype in _FLOATS and v not in ("sum", "min", "max", "avg")):
        return None
    return v


# What Gloo 1.13 refuses to reduce or move ("Invalid scalar type"), and the type it is
# reduced in instead: results the same as the type's own wrapping arithmetic, rounded
# once for bf16.
_GLOO_WIDER = {torch.bfloat16: torch.float32, torch.int16: torch.int32, torch.bool: torch.int32}


def _op_label(op):
    """A ReduceOp's name (torch 1.13 prints the object's address)."""
    for name in ("SUM", "MIN", "MAX", "AVG", "PRODUCT", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if hasattr(ReduceOp, name) and op == getattr(ReduceOp, name):
            return name
    return str(op)


def _gloo_allreduce(group, tensor, op, size):
    """An allreduce through Gloo made as the switch makes it, where Gloo 1.13 cannot: bf16
    is reduced in float32 and rounded back, int16 and bool in int32 and cut back (the
    int16 sum, product and bitwise ops wrap as int16's own; a bool is true where nonzero);
    AVG is a sum, then divided (integers from an exact int64 sum, floored, as the switch
    does)."""
    wide = tensor
    if op == ReduceOp.AVG and not tensor.is_floating_point():
        wide = tensor.long()
    elif tensor.dtype in _GLOO_WIDER:
        wide = tensor.to(_GLOO_WIDER[tensor.dtype])
    o = AllreduceOptions()
    o.reduceOp = ReduceOp.SUM if op == ReduceOp.AVG else op
    group.allreduce([wide], o).wait()
    if op == ReduceOp.AVG:
        if wide.is_floating_point():
            wide.div_(size)
        else:
            wide = torch.div(wide, size, rounding_mode="floor")
    if wide is not tensor:
        # int32 to int16 keeps the low 16 bits: the wrapped result.
        tensor.copy_(wide)


def _words(t):
    """`t` (contiguous, CPU) as an array the switch takes and its type's name for the
    binding: its own for the switch's types (bf16 as 2-byte integers); another type — in
    an all-gather or broadcast, which only move bytes — as 2-byte words (named bf16) or
    8-byte ones. None where no such view exists (an odd number of bytes, an odd offset)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bf16"
    if t.dtype in _DTYPES:
        return t.numpy(), None
    try:
        if t.element_size() % 8 == 0:
            return t.view(torch.int64).numpy(), None
        if t.element_size() <= 2:
            return t.view(torch.int16).numpy(), "bf16"
    except RuntimeError:
        pass
    return None


# Why a gather of a type the switch does not reduce goes to Gloo (an odd number of bytes,
# an odd offset): Gloo then moves the bytes.
_AS_WORDS = "the switch moves a type it does not reduce as 2-byte words (an even number of bytes at an even offset)"


def _gloo_moves_bytes(why, tensors):
    """Whether a gather passed on for `why` is made over its tensors' bytes: CPU tensors of
    a type Gloo 1.13 refuses (as they are, it would raise)."""
    return _AS_WORDS in why and all(t.dtype in _GLOO_WIDER and t.device.type == "cpu" for t in tensors)


def _joined(parts):
    """One flat view of `parts` where they lie one after another in one tensor's memory (a
    tensor's `split` or `chunk`), else None: a call over the list then needs no copy into
    or out of one buffer."""
    first = parts[0]
    pos, size = first.data_ptr(), first.element_size()
    for p in parts:
        if not p.is_contiguous() or p.dtype != first.dtype or p.data_ptr() != pos:
            return None
        pos += p.numel() * size
    try:
        # Checked against the first's storage: one tensor's memory, or an error.
        return first.detach().as_strided((sum(p.numel() for p in parts),), (1,))
    except RuntimeError:
        return None


def _overlap(a, b):
    """Whether two contiguous tensors share memory."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _check_root(entry, root, size):
    """Raises, as Gloo does, for a root that is not a rank of the group: before anything is
    started, so the group stays usable."""
    if not 0 <= root < size:
        raise RuntimeError(f"{entry}: root {root} is not a rank of this group of {size} (0 to {size - 1})")


def _movable(t):
    """`t` (contiguous) as Gloo 1.13 moves it: its bytes, for the types it refuses."""
    return t.view(torch.uint8) if t.dtype in _GLOO_WIDER else t


def _unserved(tensors, op):
    """Why the switch does not make an allreduce of `tensors` with `op` (None: it does)."""
    if len(tensors) != 1:
        return "several tensors in one call"
    t = tensors[0]
    if t.dtype not in _DTYPES:
        return f"{t.dtype} is not a type the switch reduces"
    if _op_name(op, t.dtype) is None:
        return f"{_op_label(op)} over {t.dtype} is not an op the switch makes"
    return None


def _say(msg):
    sys.stderr.write(f"xagg: {msg}\n")
    sys.stderr.flush()


def _verbose():
    return os.environ.get("XAGG_VERBOSE", "0") not in ("", "0")


class _Engine:
    """The switch side of a group: its job, the completion thread, and a private Gloo
    group that carries the agreements and the fallbacks, in the order of the calls."""

    def __init__(self, store, rank, size, timeout, group=None):
        self.rank, self.size = rank, size
        # How its lines name this rank: `rank 0` in the first group, and in a group made
        # later (`dist.new_group`) the group too, whose rank 0 may be any process.
        self.who = f"rank {rank}" if group is None else f"{group}, rank {rank}"
        self.closed = False
        self.private = dist.ProcessGroupGloo(dist.PrefixStore("xagg/private", store), rank, size, timeout)
        self.failed = None
        # Why the group never joined the switch (none when it did).
        self.unjoined = None
        self.error = None
        # Whether a call raised the error: one nobody raised is raised by
        # destroy_process_group, or said at exit.
        self.error_raised = False
        self.served = self.recovered = self.flagged = self.fallbacks = self.routed = 0
        # Calls that failed in flight (their error raised to the program, or said at exit),
        # and the first one's error.
        self.failures = 0
        self.first_error = None
        # Calls per entry point, by way (_WAYS); those passed to Gloo, by reason.
        self.table = {}
        self.passed = {}
        self.said = set()
        self.table_lock = threading.Lock()
        self.pending = set()
        # Held while a call is started: calls reach the switch and the completions in one
        # order. `turn`: held by whoever finishes a call (the completion thread, or the
        # caller of a call it waits for at once), so calls finish in that order too.
        self.order = threading.Lock()
        self.turn = threading.Lock()
        # Calls finished on their caller's thread (`_start`).
        self.finished_here = 0
        # Tensors of finished calls (an allreduce's kept input, a reduce's result at the
        # root, a gather's staging), by shape and type (DDP's buckets repeat theirs): fresh
        # memory would cost a page fault per 4 KiB on every call (16 MiB: 7 ms here).
        self.spares = {}
        self.spares_lock = threading.Lock()
        self.job = None
        self.route = None
        self.floats_to_gloo = False
        # Whether the job runs on a ring of hosts, where every collective is made as an
        # allreduce: all-gather and broadcast then move 4-byte words.
        self.ring = False
        try:
            if rank == 0:
                key, secret = new_key()
                store.set("xagg/key", key)
                store.set("xagg/secret", secret)
                store.set("xagg/route", os.environ.get("XAGG_ROUTE", ""))
                store.set("xagg/float", os.environ.get("XAGG_FLOAT", ""))
            # How float sums travel (fast unless XAGG_FLOAT=exact): rank 0's, alike everywhere.
            float_mode = store.get("xagg/float").decode()
            # Which calls go to the switch by size: rank 0's XAGG_ROUTE, alike everywhere
            # (a float allreduce's by its float mode too).
            exact = float_mode.strip() == "exact"
            self.route = Route(store.get("xagg/route").decode(), size, "exact" if exact else "fast")
            key = store.get("xagg/key").decode()
            secret = store.get("xagg/secret").decode()
            daemon = os.environ.get("XAGG_DAEMON")
            # Every rank's daemon: ranks naming one daemon are one host's, reduced there
            # first (each host sets XAGG_DAEMON to its own; one daemon for all: no levels).
            # Said by every rank, set or not, so none waits for another's.
            store.set(f"xagg/daemon/{rank}", daemon or "")
            daemons = [store.get(f"xagg/daemon/{r}").decode() for r in range(size)]
            # The segment every rank's path carries (its interface's MTU, its daemon's
            # ports'): the job takes the smallest. Said by every rank, 0 where unknown.
            mine, segment_why = 0, None
            if daemon is not None:
                try:
                    mine = segment_bytes(daemon)
                except XaggError as e:
                    segment_why = str(e)
            store.set(f"xagg/segment/{rank}", str(mine))
            segments = [int(store.get(f"xagg/segment/{r}").decode()) for r in range(size)]
            # Raised only once every rank has said its daemon and segment: none waits.
            if daemon is None:
                raise XaggError("XAGG_DAEMON is not set: give the switch daemon's network listener, e.g. 10.77.0.1:47900")
            unset = [r for r, d in enumerate(daemons) if not d]
            if unset:
                raise XaggError(f"ranks {unset} have no XAGG_DAEMON")
            if segment_why is not None:
                raise XaggError(segment_why)
            unknown = [r for r, b in enumerate(segments) if b == 0]
            if unknown:
                raise XaggError(f"ranks {unknown} could not learn the segment their path carries")
            # The credential, the slots and the timeouts from the environment, as
            # `xagg.from_env` reads them.
            # `none`: float sums go to Gloo (the worker's own mode is then moot).
            self.floats_to_gloo = float_mode.strip() == "none"
            if self.floats_to_gloo:
                float_mode = ""
            self.job = Job.from_env(
                daemon=daemon,
                rank=rank,
                size=size,
                key=key,
                secret=secret,
                daemons=daemons,
                segment=min(segments),
                float=float_mode,
                # The group's timeout (init_process_group's `timeout`, 30 minutes by
                # default) bounds a call's wait for slow ranks, as Gloo's does, unless
                # XAGG_TIMEOUT_S says otherwise.
                collective_timeout=timeout.total_seconds(),
            )
            # Each rank's responder, where the others recover results if the switch stops
            # answering.
            store.set(f"xagg/peer/{rank}", self.job.serve_peers())
            why = None
        except (XaggError, ValueError) as e:
            why = str(e)
        if why is not None:
            store.set(f"xagg/peer/{rank}", "")
        # Each rank's own reason, so rank 0 names the rank that failed and why (its own
        # may only say that another could not: "ranks [1] could not learn ...").
        store.set(f"xagg/why/{rank}", why or "")
        # Every rank joined, or none uses the switch.
        if self._agree(_OK if why is None else _FAILED) != _OK:
            self._leave()
            whys = [store.get(f"xagg/why/{r}").decode() for r in range(size)]
            own = [(r, w) for r, w in enumerate(whys) if w and not w.startswith("ranks [")]
            if own:
                self.failed = f"rank {own[0][0]}: {own[0][1]}"
            else:
                self.failed = why or "another rank could not join the job"
            # No call of this group was the switch's to make: each is passed to Gloo,
            # as the MPI library passes a communicator's calls to Open MPI.
            self.unjoined = f"the group is served by Gloo: {self.failed}"
            if rank == 0 or _verbose():
                _say(f"{self.who}: collectives go to Gloo: {self.failed}")
        else:
            self.job.set_peers([store.get(f"xagg/peer/{r}").decode() for r in range(size)])
            # On a ring of hosts the collectives other than allreduce are made as
            # allreduces: the same answer on every rank.
            store.set(f"xagg/path/{rank}", self.job.path)
            self.ring = "ring" in {store.get(f"xagg/path/{r}").decode() for r in range(size)}
            if _verbose():
                how = {
                    "ring": "joined a ring of hosts (no switch aggregates this job)",
                    "tree": "joined through its host, which joined the switch (a tree)",
                }
                _say(f"{self.who}: {how.get(self.job.path, 'joined the switch')}")
        self.queue = queue.Queue()
        # Where futures are completed and their callbacks run: never the completion
        # thread, which a callback waiting for another allreduce would otherwise block.
        self.deliver = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="xagg-callbacks")
        self.thread = threading.Thread(target=self._run, name="xagg-completions", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    def _leave(self):
        """Leaves the job, if this rank joined one (the daemon removes it when all have)."""
        if self.job is not None:
            try:
                self.job.leave()
            except XaggError:
                pass
            self.job = None

    def _agree(self, vote):
        v = torch.tensor([vote], dtype=torch.int32)
        o = AllreduceOptions()
        o.reduceOp = ReduceOp.MIN
        self.private.allreduce([v], o).wait()
        return int(v.item())

    def pass_on(self, entry, why):
        """Counts a call handed to Gloo unchanged for `why`; says so once per entry point
        and reason."""
        self.count(entry, PASSED)
        with self.table_lock:
            first = (entry, why) not in self.said
            self.said.add((entry, why))
            self.passed[why] = self.passed.get(why, 0) + 1
        if first:
            _say(f"{self.who}: {entry} goes to Gloo: {why} (said once; the summary counts them)")

    def gloo_made(self, entry, allreduce=False):
        """Counts a call Gloo made because the switch failed: passed, when the group never
        joined it; else a fallback (and, for an allreduce, in the summary's headline)."""
        if self.unjoined is not None:
            with self.table_lock:
                self.passed[self.unjoined] = self.passed.get(self.unjoined, 0) + 1
            self.count(entry, PASSED)
        else:
            if allreduce:
                self.fallbacks += 1
            self.count(entry, FALLBACK)

    def count(self, entry, way):
        with self.table_lock:
            self.table.setdefault(entry, [0] * len(_WAYS))[way] += 1

    def check(self):
        if self.error is not None:
            self.error_raised = True
            raise XaggError(f"the xagg backend failed earlier: {self.error}")

    def allreduce(self, tensor, op, target=None, entry="hook", at_once=False):
        """Starts an allreduce of `tensor` in place (then copied into `target`, if given),
        made through the program's `entry`; returns (future, work). `at_once`: the caller
        waits for it as soon as it is returned (`_start`)."""
        self.check()
        fut = torch.futures.Future()
        saved = self.spare(tensor.shape, tensor.dtype)
        saved.copy_(tensor)
        with self.order:
            work = _Work(fut, self)
            self._start(work, (self._submit(tensor, op), tensor, saved, op, fut, work, target, entry), at_once)
        return fut, work

    def spare(self, shape, dtype):
        """A contiguous tensor of `shape` and `dtype` from the spares, or a new one."""
        with self.spares_lock:
            t = self.spares.pop((shape, dtype), None)
        return torch.empty(shape, dtype=dtype) if t is None else t

    def give_back(self, t):
        """Keeps a tensor no call uses any more for a later call of its shape and type."""
        with self.spares_lock:
            if len(self.spares) < 16:
                self.spares[(t.shape, t.dtype)] = t

    def _submit(self, tensor, op):
        """The switch's request of an allreduce of `tensor` (None once the switch failed)."""
        req = None
        if self.failed is None:
            try:
                if tensor.dtype == torch.bfloat16:
                    # NumPy has no bfloat16: its bits as int16, reduced as bf16.
                    data, dtype = tensor.detach().view(torch.int16).numpy(), "bf16"
                else:
                    data, dtype = tensor.detach().numpy(), None
                req = self.job.submit(data, _op_name(op, tensor.dtype), dtype=dtype)
            except (XaggError, ValueError, TypeError) as e:
                req, why = None, str(e)
                if self.failed is None:
                    self.failed = why
                    self.job.leave_soon()
        return req

    def _start(self, work, item, at_once):
        """Hands a started call (`item`; under `order`) to the completion thread — or, when
        its caller waits for it at once and no call is in flight, to its caller's wait
        (`_Work.wait`), which finishes it on the caller's thread: no hand-off to the
        completion thread and back, which took most of a small call's time."""
        if at_once and not self.pending:
            # The completion thread may still be leaving the last call it finished.
            self.turn.acquire()
            self.finished_here += 1
            work.keep(item)
        else:
            self.queue.put(item)
        self.pending.add(work)

    def finish_here(self, item):
        """Finishes a call its caller waits for (`_start`), on the caller's thread."""
        try:
            if item[0] is _COLLECTIVE:
                self._run_collective(item, here=True)
            else:
                self._run_allreduce(item, here=True)
        finally:
            self.turn.release()

    def collective(self, kind, output, input, op, root, fallback, finish, entry, at_once=False):
        """Starts `kind` (a collective other than allreduce) through the switch, its result
        in the contiguous CPU tensor `output` (from `input`, where it differs); once done,
        `finish()` hands the result to the caller's tensors. Made by Gloo instead
        (`fallback()`, on every rank, in the calls' order) when the switch failed at this
        call or an earlier one, or flagged its result. Returns (future, work); `at_once` as
        for `allreduce`."""
        self.check()
        fut = torch.futures.Future()
        with self.order:
            work = _Work(fut, self)
            req = self._submit_collective(kind, output, input, op, root)
            self._start(work, (_COLLECTIVE, req, fallback, finish, fut, work, entry), at_once)
        return fut, work

    def _submit_collective(self, kind, output, input, op, root):
        """The switch's request of a collective (None once the switch failed)."""
        req = None
        if self.failed is None:
            try:
                out, dtype = _words(output)
                req = self.job.submit_collective(
                    kind,
                    out,
                    input=None if input is None else _words(input)[0],
                    op=_op_name(op, output.dtype) or "sum",
                    root=root,
                    dtype=dtype,
                )
            except (XaggError, ValueError, TypeError) as e:
                if self.failed is None:
                    self.failed = str(e)
                    self.job.leave_soon()
        return req

    def _complete(self, fut, failure, result, here):
        """Completes a call's future: on a delivery thread, where its callbacks run, unless
        `here` (a call its caller waits for, which has no callbacks)."""
        if here:
            _complete(fut, failure, result)
            return
        try:
            self.deliver.submit(_complete, fut, failure, result)
        except RuntimeError:
            # At exit the interpreter stops its thread pools before the program's atexit
            # calls, this one's close among them, which finishes the calls in flight:
            # completed here, its callbacks with it.
            _complete(fut, failure, result)

    def _failed_call(self, e):
        """Records a call that failed in flight: raised at the next call, counted in the
        summary, the first one's reason said there."""
        self.error = f"{type(e).__name__}: {e}"
        with self.table_lock:
            self.failures += 1
            if self.first_error is None:
                self.first_error = self.error

    def _outcome(self, req):
        """Waits for a call's request and says how it ended: None for the switch's result,
        else its kind (or None with no request: the switch failed earlier). Raises for slow
        ranks past the group's timeout or peers that could not be reached (no rank moves on
        alone); an abandoned call makes the group Gloo's from then on."""
        kind, why = None, None
        if req is not None:
            if self.failed is not None:
                # Made by Gloo anyway: no need to wait for the switch.
                req.cancel()
            try:
                req.wait()
            except XaggError:
                kind, why = req.status()
        if kind in ("timeout", "failed") and self.failed is None:
            raise XaggError(why)
        if kind == "abandoned" and self.failed is None:
            self.failed = why
            # Its slots are of no use to this group any more.
            self.job.leave_soon()
            if self.rank == 0 or _verbose():
                _say(f"{self.who}: the switch failed, collectives go to Gloo from now on: {why}")
        return kind

    def _run_collective(self, item, here=False):
        _, req, fallback, finish, fut, work, entry = item
        failure = None
        try:
            kind = self._outcome(req)
            # Counted in the table, by entry; the summary's headline counts allreduces.
            if self.failed is None and kind is None:
                self.count(entry, RECOVERED if req.recovered else SWITCH)
            else:
                fallback()
                if self.failed is None:
                    self.count(entry, FLAGGED)
                else:
                    self.gloo_made(entry)
            result = finish()
        except BaseException as e:  # noqa: BLE001 - recorded, raised at the next call
            self._failed_call(e)
            failure, result = e, None
        finally:
            # Out of flight before its caller can wake: a call it makes next may be
            # finished on its own thread.
            self.pending.discard(work)
            self._complete(fut, failure, result, here)

    def _run(self):
        while True:
            item = self.queue.get()
            if item is None:
                return
            with self.turn:
                if item[0] is _COLLECTIVE:
                    self._run_collective(item)
                else:
                    self._run_allreduce(item)

    def _run_allreduce(self, item, here=False):
        """Finishes an allreduce: the switch's result, or Gloo's from the kept input."""
        req, tensor, saved, op, fut, work, target, entry = item
        failure = None
        try:
            kind = self._outcome(req)
            if self.failed is None and kind is None:
                self.served += 1
                if req.recovered:
                    self.recovered += 1
                self.count(entry, RECOVERED if req.recovered else SWITCH)
            else:
                # Every rank makes this call with Gloo, from the kept input: the
                # switch's result is flagged in every copy (NaN or infinity), or the
                # switch failed at this call or an earlier one (every rank finds it at
                # the same call; later requests are cancelled or ignored).
                tensor.copy_(saved)
                _gloo_allreduce(self.private, tensor, op, self.size)
                if self.failed is None:
                    self.flagged += 1
                    self.count(entry, FLAGGED)
                else:
                    self.gloo_made(entry, allreduce=True)
        except BaseException as e:  # noqa: BLE001 - recorded, raised at the next call
            self._failed_call(e)
            failure = e
        finally:
            self.give_back(saved)
            if target is not None:
                target.copy_(tensor)
                tensor = target
            self.pending.discard(work)
            self._complete(fut, failure, tensor, here)

    def close(self):
        """Stops the completion thread (after the calls in flight) and leaves the job; once
        (at ``destroy_process_group`` or at exit, whichever comes first). Returns the failure
        no call of the program raised, if any."""
        if self.closed:
            return None
        self.closed = True
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        self.deliver.shutdown(wait=True)
        # A program ending on an exception it did not catch (the interpreter sets
        # `sys.last_value` before the exit handlers run) waits for nobody: its peers find
        # its process gone about a second into their calls, instead of waiting the
        # barrier's 60 s with it.
        failing = getattr(sys, "last_value", None) is not None
        if self.job is not None and self.failed is None and not failing:
            # A rank still finishing a call from its peers may need this one's results:
            # nobody leaves before everybody is done (bounded: a rank that died does not
            # hold the others for the group's whole timeout).
            try:
                self.private.barrier().wait(timedelta(seconds=60))
            except RuntimeError:
                pass
        self._leave()
        unraised = None
        if self.error is not None and not self.error_raised:
            # The program never waited for the call that failed (its last, say): said here,
            # on every rank it failed on, rather than lost.
            unraised = f"{self.who}: an allreduce failed and no call of the program raised it: {self.error}"
            _say(unraised)
            self.error_raised = True
        if self.rank == 0 or _verbose():
            # The headline counts allreduces; the other collectives the switch made, in a
            # clause of their own (a ZeRO step makes no allreduce at all).
            others = sum(c[SWITCH] + c[RECOVERED] for e, c in self.table.items() if e in _OTHERS)
            # Only when some did: a failed call is in no way's count.
            n = self.failures
            failed = f"; {n} call{'s' if n > 1 else ''} failed (raised to the program, or said at exit)" if n else ""
            # A ring's calls are the library's but no switch's.
            where = "round a ring of hosts" if self.ring else "through the switch"
            why = " (no switch aggregated them)" if self.ring else ""
            _say(
                f"{self.who}: {self.served} allreduces {where}{why}, {self.fallbacks} made by Gloo after the switch failed, "
                f"{self.flagged} flagged results (NaN, infinity, or values too far apart for the exact lanes) made again by Gloo, {self.recovered} finished from peers; "
                f"of every collective, {self.routed} routed to Gloo by size (XAGG_ROUTE); "
                f"{others} other collectives {where} (reduce-scatters, all-gathers, broadcasts, reduces: their lines below){failed}"
            )
            if n:
                _say(f"{self.who}: the first call that failed: {self.first_error}")
            for entry, counts in sorted(self.table.items()):
                ways = ", ".join(f"{n} {w}" for n, w in zip(counts, _WAYS))
                _say(f"{self.who}: {entry}: {ways}")
            for why, n in sorted(self.passed.items()):
                _say(f"{self.who}: passed to Gloo: {n} ({why})")
        return unraised


# Marks a queued collective other than allreduce.
_COLLECTIVE = object()


def _complete(fut, failure, tensor):
    """Completes a call's future, running its callbacks (on a delivery thread): with
    [tensor], or the list of tensors a collective returns."""
    if failure is not None:
        fut.set_exception(failure)
    else:
        fut.set_result(tensor if isinstance(tensor, list) else [tensor])


def _for_caller(work, entry, at_once=False):
    """`work` as the caller can keep it. torch.distributed's functions hand the Python
    object to the program, which holds it (or wait for it at once, `at_once`). Other callers are C++ (DDP's reducer): they keep
    only the C++ half of a Python subclass of Work, whose Python methods are gone once the
    Python object is collected — a later `wait` from C++ (the reducer's, for the map of
    used parameters with `static_graph`) then waits on a completion the base class never
    sees, forever. Those get a C++ work that waits on the same future."""
    if at_once or entry in ("all_reduce", "all_reduce async"):
        return work
    # A Python exception in a future that C++ waits on crashed the process (SIGSEGV in
    # DDP's backward, torch 1.13, once a peer had died); raised in a `then` callback, it
    # reaches C++ as an error of its own, which DDP raises as a RuntimeError quoting ours.
    return _create_work_from_future(work.get_future().then(_value))


def _value(fut):
    """A future's value, its exception raised (see `_for_caller`)."""
    return fut.value()


class _Work(dist.Work):
    """A call in flight: its future completes from the completion thread, or from this
    `wait` when its caller waits for it at once (`_Engine._start`)."""

    def __init__(self, fut, engine):
        super().__init__()
        self._fut = fut
        self._engine = engine
        self._kept = None

    def keep(self, item):
        """Keeps the call for this work's `wait` to finish (the engine's turn held)."""
        self._kept = item

    def wait(self, timeout=None):
        if self._kept is not None:
            item, self._kept = self._kept, None
            self._engine.finish_here(item)
        try:
            self._fut.wait()
        except BaseException:
            self._engine.error_raised = True
            raise
        self._engine.check()
        return True

    def is_completed(self):
        return self._fut.done()

    def result(self):
        """The call's tensors (as Gloo's work gives them), once it is done."""
        self.wait()
        return self._fut.value()

    def is_success(self):
        return self._fut.done() and self._engine.error is None

    def get_future(self):
        return self._fut


class ProcessGroupXagg(dist.ProcessGroup):
    """The ``"xagg"`` backend: allreduce through the switch, the rest through Gloo."""

    # Groups made since the default group (which is 0).
    _made = 0

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        if not dist.is_initialized():
            # The default group, made by init_process_group (again after
            # destroy_process_group): later groups are numbered from it.
            ProcessGroupXagg._made = 0
        k = ProcessGroupXagg._made
        ProcessGroupXagg._made += 1
        group = None
        if k > 0:
            world = dist.get_rank() if dist.is_initialized() else rank
            group = f"group {k} ({size} ranks; this is global rank {world})"
        self._engine = _Engine(store, rank, size, timeout, group)

    def getBackendName(self):
        return "xagg"

    def allreduce(self, tensors, opts=None):
        self._engine.check()
        if opts is None:
            opts = AllreduceOptions()
        elif isinstance(opts, ReduceOp):
            o = AllreduceOptions()
            o.reduceOp = opts
            opts = o
        t = tensors[0] if len(tensors) == 1 else None
        caller, at_once = _caller()
        entry = _allreduce_entry(caller, at_once)
        why = _unserved(tensors, opts.reduceOp)
        if why is not None:
            # Decided by the call alone, the same on every rank.
            self._engine.pass_on(entry, why)
            return self._by_gloo(tensors, opts, entry)
        if self._engine.floats_to_gloo and t.is_floating_point() and opts.reduceOp in (ReduceOp.SUM, ReduceOp.AVG):
            # Rank 0's XAGG_FLOAT=none: the same on every rank.
            self._engine.pass_on(entry, "float sums go to Gloo (rank 0's XAGG_FLOAT=none)")
            return self._by_gloo(tensors, opts, entry)
        if self._routed("allreduce", t.numel() * t.element_size(), entry, t.dtype):
            return self._by_gloo(tensors, opts, entry)
        if t.device.type != "cpu":
            # Through host memory: a CPU copy reduced, the result copied back.
            _, work = self._engine.allreduce(t.cpu().contiguous(), opts.reduceOp, target=t, entry=entry, at_once=at_once)
            return _for_caller(work, entry)
        if not t.is_contiguous():
            # A strided view: reduced as a contiguous copy, copied back (Gloo 1.13 would
            # reduce the view's storage as if it were contiguous: wrong results).
            _, work = self._engine.allreduce(t.contiguous(), opts.reduceOp, target=t, entry=entry, at_once=at_once)
            return _for_caller(work, entry)
        _, work = self._engine.allreduce(t, opts.reduceOp, entry=entry, at_once=at_once)
        return _for_caller(work, entry)

    def _routed(self, kind, nbytes, entry, dtype=None):
        """Whether a `kind` call moving `nbytes` (the whole message) of `dtype` (where the
        route depends on it: an allreduce's) is faster through Gloo at this size
        (XAGG_ROUTE, rank 0's, or the bench's figures): decided by the call alone, alike on
        every rank; counted when it goes to Gloo."""
        route = self._engine.route
        if route is None or route.takes(nbytes, kind, _WIRE_NAMES.get(dtype)):
            return False
        self._engine.routed += 1
        self._engine.count(entry, ROUTED)
        return True

    def _served(self, tensors, moved=None):
        """Why the switch does not make a collective over `tensors` (None: it does);
        `moved`: the bytes an all-gather or broadcast moves."""
        if self._engine.failed is not None:
            return None
        if moved is not None and self._engine.ring and moved % 4:
            return f"on a ring of hosts it moves 4-byte words, and {moved} bytes are not a whole number of them"
        for t in tensors:
            if t.device.type != "cpu":
                return "a tensor not in host memory"
            # A gather moves bytes: any type with a view of words (`_words`).
            if t.dtype in _DTYPES:
                continue
            if moved is None:
                return f"{t.dtype} is not a type the switch moves"
            if _words(t) is None:
                # One reason per type, whatever the size: said once, counted together.
                return f"{t.dtype}: {_AS_WORDS}"
        return None

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """Reduce-scatter through the switch: each rank sends its n blocks and gets its own
        block reduced (Gloo 1.13 has none: a fallback is an allreduce, then the block)."""
        self._engine.check()
        _, at_once = _caller()
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        out, ins = output_tensors[0], input_tensors[0]
        why = None
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            why = "several tensors in one call"
        else:
            # As torch's other backends answer these: a reduce-scatter of such blocks has
            # no one result, and a fallback would reduce the wrong elements.
            if len(ins) != self.size():
                raise RuntimeError(
                    f"reduce_scatter: {len(ins)} input blocks on a group of {self.size()} ranks: give one per rank"
                )
            if any(t.shape != out.shape or t.dtype != out.dtype for t in ins):
                raise RuntimeError(
                    f"reduce_scatter: every input block must have the output's shape and type "
                    f"({tuple(out.shape)}, {out.dtype}); got {[(tuple(t.shape), t.dtype) for t in ins]}"
                )
            why = self._reduces(op, [out, *ins])
        whole = _joined(ins)
        if whole is None:
            whole = torch.cat([t.reshape(-1) for t in ins])
        return self._reduce_scatter(whole, out, op, "reduce_scatter", why, at_once)

    def _reduce_scatter_base(self, output, input, opts=None):
        """`reduce_scatter_tensor` (and `_reduce_scatter_base`): the n blocks flat in one
        input tensor, this rank's reduced block into `output`. Gloo 1.13 has none."""
        self._engine.check()
        _, at_once = _caller()
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        if input.numel() != self.size() * output.numel() or input.dtype != output.dtype:
            # As torch's other backends answer it (a fallback would reduce the wrong elements).
            raise RuntimeError(
                f"reduce_scatter_tensor: the input must hold the group's {self.size()} ranks' blocks of "
                f"the output's size and type: input {input.numel()} x {input.dtype}, output "
                f"{output.numel()} x {output.dtype}"
            )
        why = self._reduces(op, [output, input])
        return self._reduce_scatter(input.contiguous().reshape(-1), output, op, "reduce_scatter_tensor", why, at_once)

    def _reduces(self, op, tensors):
        """Why the switch does not reduce `tensors` with `op` (None: it does)."""
        if tensors[0].dtype not in _DTYPES:
            return f"{tensors[0].dtype} is not a type the switch reduces"
        if _op_name(op, tensors[0].dtype) is None:
            return f"{_op_label(op)} over {tensors[0].dtype} is not an op the switch makes"
        return self._served(tensors)

    def _reduce_scatter(self, whole, out, op, entry, why, at_once):
        """`whole` (flat, n blocks; left as it is) reduce-scattered into `out`, through the
        switch unless `why`; `at_once`: its caller waits for it at once."""
        n = self.size()
        # The result straight into `out` where it can be (no copy after).
        direct = out.is_contiguous() and not _overlap(out, whole)
        block = out.detach().view(-1) if direct else self._engine.spare((out.numel(),), out.dtype)

        def fallback(group=None):
            # Gloo 1.13 has no reduce-scatter: the whole buffer reduced, this rank's block kept.
            reduced = whole.clone()
            _gloo_allreduce(group or self._engine.private, reduced, op, n)
            block.copy_(reduced[self.rank() * out.numel() : (self.rank() + 1) * out.numel()])

        def finish():
            if not direct:
                out.copy_(block.view(out.shape))
                self._engine.give_back(block)
            return [out]

        if why is not None:
            return self._passed(entry, why, fallback, finish)
        if self._routed("reduce_scatter", whole.numel() * whole.element_size(), entry):
            return self._by_gloo_now(fallback, finish, entry)
        _, work = self._engine.collective("reduce_scatter", block, whole, op, 0, fallback, finish, entry, at_once)
        return _for_caller(work, entry, at_once)

    def allgather(self, output_tensors, input_tensors, opts=None):
        """All-gather through the switch: each rank sends its tensor once and gets every
        rank's."""
        self._engine.check()
        _, at_once = _caller()
        entry = "all_gather"
        n = self.size()
        why, mine, outs = None, None, []
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            why = "several tensors in one call"
        elif len(output_tensors[0]) != n:
            why = f"an output list of {len(output_tensors[0])} tensors on a group of {n} ranks"
        else:
            mine, outs = input_tensors[0], output_tensors[0]
            if any(t.numel() != mine.numel() or t.dtype != mine.dtype for t in outs):
                why = "outputs of another size or type than the input"
            else:
                why = self._served([mine, *outs], moved=n * mine.numel() * mine.element_size())
        if why is not None and (mine is None or not _gloo_moves_bytes(why, [mine, *outs])):
            self._engine.pass_on(entry, why)
            return self._gloo.allgather(output_tensors, input_tensors, opts) if opts is not None else self._gloo.allgather(output_tensors, input_tensors)
        # The blocks straight into the outputs where they are one tensor's (no copy after).
        whole = _joined(outs)
        direct = whole is not None and mine.is_contiguous() and not _overlap(whole, mine)
        if not direct:
            whole = self._engine.spare((n * mine.numel(),), mine.dtype)

        def finish():
            if not direct:
                for t, part in zip(outs, whole.chunk(n)):
                    t.copy_(part.view(t.shape))
                self._engine.give_back(whole)
            return outs

        return self._all_gather(mine, whole, finish, entry, why, at_once)

    def _allgather_base(self, output, input, opts=None):
        """`all_gather_into_tensor` (and `_all_gather_base`): every rank's tensor, in rank
        order, into one output tensor. Gloo 1.13 has none: passed on, it is Gloo's list
        all-gather into the output's blocks."""
        self._engine.check()
        _, at_once = _caller()
        entry = "all_gather_into_tensor"
        if output.numel() != self.size() * input.numel() or output.dtype != input.dtype:
            # As torch's other backends answer it (Gloo 1.13 would say it has no such call).
            raise RuntimeError(
                f"all_gather_into_tensor: the output must hold the group's {self.size()} ranks' inputs of "
                f"the input's size and type: output {output.numel()} x {output.dtype}, input "
                f"{input.numel()} x {input.dtype}"
            )
        why = self._served([output, input], moved=output.numel() * output.element_size())
        whole = output.view(-1) if output.is_contiguous() else torch.empty(output.numel(), dtype=output.dtype)

        def finish():
            if not output.is_contiguous():
                output.copy_(whole.view(output.shape))
            return [output]

        return self._all_gather(input, whole, finish, entry, why, at_once)

    def _all_gather(self, mine, whole, finish, entry, why, at_once):
        """Every rank's `mine` into `whole` (flat, rank order), through the switch unless
        `why` (then by Gloo's list all-gather, over the bytes of a type it refuses);
        `at_once`: its caller waits for it at once."""
        n = self.size()
        own = mine.contiguous().reshape(-1)
        if _overlap(own, whole):
            # In place (the input a block of the output): the others' blocks would land
            # on it before it is sent, or while it may be sent again.
            own = own.clone()

        def fallback(group=None):
            parts = [_movable(p) for p in whole.chunk(n)]
            (group or self._engine.private).allgather([parts], [_movable(own)]).wait()

        if why is not None:
            return self._passed(entry, why, fallback, finish)
        if self._routed("all_gather", whole.numel() * whole.element_size(), entry):
            return self._by_gloo_now(fallback, finish, entry)
        _, work = self._engine.collective("all_gather", whole, own, ReduceOp.SUM, 0, fallback, finish, entry, at_once)
        return _for_caller(work, entry, at_once)

    def reduce(self, tensors, opts=None):
        """Reduce through the switch: every rank sends its tensor once, only the root gets
        the result (the others' tensors stay as they were)."""
        self._engine.check()
        _, at_once = _caller()
        entry = "reduce"
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        root = opts.rootRank if opts is not None else 0
        _check_root(entry, root, self.size())
        if len(tensors) != 1:
            self._engine.pass_on(entry, "several tensors in one call")
            return self._gloo.reduce(tensors, opts)
        t = tensors[0]
        why = self._reduces(op, [t])
        buf = t if t.is_contiguous() else t.contiguous()
        # The root's result apart from its data, which a fallback after a failure in the
        # middle still needs whole; the others get none (in place).
        result = self._engine.spare(buf.shape, buf.dtype) if self.rank() == root else buf

        def fallback(group=None):
            g = group or self._engine.private
            reduced = buf.clone()
            if buf.dtype in _GLOO_WIDER or op == ReduceOp.AVG:
                # What Gloo 1.13 refuses, made as the switch makes it: reduced everywhere.
                _gloo_allreduce(g, reduced, op, self.size())
            else:
                o = ReduceOptions()
                o.reduceOp = op
                o.rootRank = root
                g.reduce([reduced], o).wait()
            if result is not buf:
                result.copy_(reduced)

        def finish():
            if result is not buf:
                t.copy_(result)
                self._engine.give_back(result)
            return [t]

        if why is not None:
            return self._passed(entry, why, fallback, finish)
        if self._routed("reduce", buf.numel() * buf.element_size(), entry):
            return self._by_gloo_now(fallback, finish, entry)
        given = buf if result is not buf else None
        _, work = self._engine.collective("reduce", result, given, op, root, fallback, finish, entry, at_once)
        return _for_caller(work, entry, at_once)

    def broadcast(self, tensors, opts=None):
        """Broadcast through the switch: the root sends its tensor once, the others get it."""
        self._engine.check()
        _, at_once = _caller()
        entry = "broadcast"
        root = opts.rootRank if opts is not None else 0
        _check_root(entry, root, self.size())
        why = None
        if len(tensors) != 1:
            why = "several tensors in one call"
        else:
            why = self._served(tensors, moved=tensors[0].numel() * tensors[0].element_size())
        if why is not None and not _gloo_moves_bytes(why, tensors):
            self._engine.pass_on(entry, why)
            return self._gloo.broadcast(tensors, opts) if opts is not None else self._gloo.broadcast(tensors)
        t = tensors[0]
        buf = t if t.is_contiguous() else t.contiguous()

        def fallback(group=None):
            o = BroadcastOptions()
            o.rootRank = root
            (group or self._engine.private).broadcast([_movable(buf)], o).wait()

        def finish():
            if buf is not t:
                t.copy_(buf)
            return [t]

        if why is not None:
            # A type Gloo 1.13 refuses: its bytes broadcast.
            return self._passed(entry, why, fallback, finish)
        if self._routed("broadcast", buf.numel() * buf.element_size(), entry):
            return self._by_gloo_now(fallback, finish, entry)
        _, work = self._engine.collective("broadcast", buf, None, ReduceOp.SUM, root, fallback, finish, entry, at_once)
        return _for_caller(work, entry, at_once)

    def _passed(self, entry, why, fallback, finish):
        """A call passed to Gloo, made at once by `fallback` on the inner group, on the
        caller's thread like every call passed to Gloo: the way the switch's calls fall
        back, which serves what Gloo 1.13 lacks (reduce-scatter, all-gather into one
        tensor) or refuses (int16, bool, bf16: reduced wider, gathered as bytes)."""
        self._engine.pass_on(entry, why)
        return self._by_gloo_now(fallback, finish, entry)

    def _by_gloo_now(self, fallback, finish, entry):
        """A call made at once by `fallback` on the inner Gloo group, finished by `finish`."""
        fallback(self._gloo)
        fut = torch.futures.Future()
        fut.set_result(finish())
        return _for_caller(_Work(fut, self._engine), entry)

    def _by_gloo(self, tensors, opts, entry):
        """The allreduce by the inner Gloo group; bf16, int16, bool and AVG, which Gloo
        1.13 refuses, made as the switch makes them (`_gloo_allreduce`), at once."""
        t = tensors[0] if len(tensors) == 1 else None
        if t is None or (t.dtype not in _GLOO_WIDER and opts.reduceOp != ReduceOp.AVG):
            return self._gloo.allreduce(tensors, opts)
        _gloo_allreduce(self._gloo, t, opts.reduceOp, self.size())
        fut = torch.futures.Future()
        fut.set_result(tensors)
        return _for_caller(_Work(fut, self._engine), entry)


def _delegate(name, entry=None, why=None):
    """The process group's method `name`, made by the inner Gloo group; a collective
    (`entry`, torch.distributed's name of it) counted as passed to Gloo for `why`."""

    def call(self, *args, **kwargs):
        self._engine.check()
        if entry is not None:
            self._engine.pass_on(entry, why)
        return getattr(self._gloo, name)(*args, **kwargs)

    call.__name__ = name
    return call


_NOT_MADE = "not a collective the switch makes"
for _name, _entry, _why in [
    ("allgather_coalesced", "all_gather_coalesced", "several tensors in one call"),
    ("allreduce_coalesced", "all_reduce_coalesced", "several tensors in one call"),
    ("alltoall", "all_to_all", _NOT_MADE),
    ("alltoall_base", "all_to_all_single", _NOT_MADE),
    ("barrier", "barrier", _NOT_MADE),
    ("gather", "gather", _NOT_MADE),
    ("scatter", "scatter", _NOT_MADE),
    # Point to point: no collective to count.
    ("recv", None, None),
    ("recv_anysource", None, None),
    ("send", None, None),
]:
    setattr(ProcessGroupXagg, _name, _delegate(_name, _entry, _why))


def _create(store, rank, size, timeout):
    return ProcessGroupXagg(store, rank, size, timeout)


dist.Backend.register_backend("xagg", _create)


def _closing(destroy):
    """``destroy_process_group``, closing the engines of the groups it destroys first (their
    summaries said, their jobs left) and raising, once they are destroyed, a failure no call
    of the program raised (its last allreduce, never waited for)."""

    def destroy_process_group(group=None):
        c10d = dist.distributed_c10d
        if group is None or group == c10d.GroupMember.WORLD:
            groups = list(c10d._pg_map.keys())
        else:
            groups = [group]
        unraised = [g._engine.close() for g in groups if isinstance(g, ProcessGroupXagg)]
        destroy(group)
        unraised = [u for u in unraised if u is not None]
        if unraised:
            raise XaggError("; ".join(unraised))

    destroy_process_group.__wrapped__ = destroy
    destroy_process_group.__doc__ = destroy.__doc__
    return destroy_process_group


if not hasattr(dist.destroy_process_group, "__wrapped__"):
    dist.destroy_process_group = _closing(dist.destroy_process_group)
    dist.distributed_c10d.destroy_process_group = dist.destroy_process_group


def _monitored(barrier):
    """``monitored_barrier``, which torch 1.13 makes only on a group whose backend is
    Gloo: an xagg group's is made by its Gloo group, where its other calls the switch
    does not make go."""

    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        c10d = dist.distributed_c10d
        pg = c10d._get_default_group() if group is None else group
        if not isinstance(pg, ProcessGroupXagg) or c10d._rank_not_in_group(group):
            return barrier(group, timeout, wait_all_ranks)
        pg._engine.check()
        pg._engine.pass_on("monitored_barrier", _NOT_MADE)
        return pg._gloo.monitored_barrier(
            c10d.default_pg_timeout if timeout is None else timeout, wait_all_ranks=wait_all_ranks
        )

    monitored_barrier.__wrapped__ = barrier
    monitored_barrier.__doc__ = barrier.__doc__
    return monitored_barrier


if not hasattr(dist.monitored_barrier, "__wrapped__"):
    dist.monitored_barrier = _monitored(dist.monitored_barrier)
    dist.distributed_c10d.monitored_barrier = dist.monitored_barrier


class HookState:
    """The state of :func:`allreduce_hook`: a job over the default group's ranks (or
    ``process_group``'s, which must be the default group's world)."""

    def __init__(self, process_group=None):
        from torch.distributed import distributed_c10d as c10d

        store = c10d._get_default_store()
        self.rank = dist.get_rank(process_group)
        self.size = dist.get_world_size(process_group)
        self.engine = _Engine(dist.PrefixStore("xagg/hook", store), self.rank, self.size, timedelta(seconds=30))


def allreduce_hook(state, bucket):
    """A DDP communication hook (``model.register_comm_hook(HookState(), allreduce_hook)``):
    each bucket's gradients summed through the switch and divided by the world size."""
    tensor = bucket.buffer()
    fut, _work = state.engine.allreduce(tensor, ReduceOp.SUM, entry="DDP comm hook (xagg.torch.allreduce_hook)")
    engine = state.engine

    def done(f):
        engine.check()
        return f.value()[0].div_(state.size)

    return fut.then(done)
