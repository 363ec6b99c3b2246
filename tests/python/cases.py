"""The cases of the PyTorch backend's table (docs/python.md), one per run, as a user's
script would meet them, launched by torchrun (one process per lab namespace):
`cases.py CASE [GO]`. Every run first makes one all_reduce (the group joins the switch),
then:
- `late`: rank 0 starts its all_reduce 3 s after the others;
- `nocontrib GO`: every rank waits for the file GO (the test makes the switch drop every
  contribution first), then three all_reduces, each checked;
- `nan`: rank 1 puts a NaN into element 5 of a float sum;
- `cut GO`: rank 0 waits for the file GO (the test cuts its results off first), then every
  rank makes an all_reduce, a reduce_scatter, an all_gather and a broadcast from rank 1
  (each of many segments: rank 0 finishes each from its peers);
- `sizes`: all_reduce of 4 KiB, 1 MiB and 4 MiB of int32, then 1 MiB and 4 MiB of float16 (the
  route by size and type); then a
  reduce_scatter_tensor, two all_gather_into_tensor (the second in place, each rank's
  input in another rank's block), a reduce to rank 1 and broadcasts of 4 KiB and 64 KiB
  from rank 1;
- `callback`: a future's callback that makes (and waits for) another all_reduce; then
  calls waited for at once, behind three in flight and with none in flight (finished on
  the caller's thread: counted); then, the group destroyed, the default group made again
  and an all_reduce on it (`again ok=...`);
- `powersgd`: DDP with PowerSGD's hook (its callbacks wait for all_reduces), 4 steps;
- `unwaited`: a last all_reduce, async and never waited for, that fails on every rank
  (rank 0 starts it 6 s late, past the test's XAGG_TIMEOUT_S of 2: the others give up on
  it, rank 0's finds them gone): `destroy_process_group` raises the failure (printed here);
  with `exit` after the case, the program exits without it, and the failure is said at
  exit;
- `timeout`: the group made with a timeout of 5 s; rank 0 starts an all_reduce 12 s after
  the others, which fail at the group's timeout (before: XAGG_TIMEOUT_S's 30 minutes);
- `dies`: the last rank exits at once, without leaving; the others' next all_reduce
  fails, naming it gone (its responder refuses connections), at the give-up time;
- `types`: a bf16 sum (through the switch: Gloo 1.13 cannot), an f32 AVG, and an int16 AVG
  (passed to Gloo, which makes it as a sum then a floored division); then what Gloo 1.13
  refuses, passed to it (an int16 sum that wraps, a bool max, an int16 reduce_scatter, a
  broadcast of 7 bools), an int16 and a bool all_gather (through the switch as words),
  reduce-scatters of mis-sized inputs (which raise) and an f32 product (not an op of the
  switch's); a reduce and a broadcast whose root is not a rank and an all-gather into an
  output of the wrong size (which raise), then an async all_reduce's `result()`, a
  `monitored_barrier` (which torch 1.13 refuses a backend not named Gloo) and an
  `all_reduce_coalesced` (passed to Gloo, counted).
Each rank prints `rank R: CASE ok=True|False` (and for `late`, how long rank 1 waited)."""
import datetime
import faulthandler
import math
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

# A bound: a case that hangs ends with every thread's traceback instead.
faulthandler.dump_traceback_later(120, exit=True)
case = sys.argv[1]
if case == "timeout":
    # The group's own timeout, not XAGG_TIMEOUT_S, bounds a call's wait for a slow rank.
    dist.init_process_group("xagg", timeout=datetime.timedelta(seconds=5))
else:
    dist.init_process_group("xagg")
rank, size = dist.get_rank(), dist.get_world_size()


def expected(n, k):
    return torch.arange(n, dtype=torch.int32) * size + k * size + size * (size - 1) // 2


def ints(n, k):
    return torch.arange(n, dtype=torch.int32) + rank + k


first = ints(1024, 0)
dist.all_reduce(first)
ok = torch.equal(first, expected(1024, 0))
if case == "late":
    if rank == 0:
        time.sleep(3)
    t = time.time()
    x = ints(1024, 1)
    dist.all_reduce(x)
    ok = ok and torch.equal(x, expected(1024, 1))
    if rank == 1:
        print(f"rank 1 waited {time.time() - t:.1f} s", flush=True)
elif case == "nocontrib":
    # The switch stops taking contributions (the test drops every one there) once the first
    # all_reduce is in: every rank finds no rank holds the next round, and the calls are
    # Gloo's from then on, on every rank alike. (Every rank waits: a contribution taken
    # before the drops began would start a round without the others', which is the calls
    # differing, not the switch failing.)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
    for k in range(3):
        x = ints(1024, 10 + k)
        dist.all_reduce(x)
        ok = ok and torch.equal(x, expected(1024, 10 + k))
elif case == "nan":
    f = torch.arange(1024, dtype=torch.float32) * 0.5 + rank
    if rank == 1:
        f[5] = math.nan
    dist.all_reduce(f)
    want = torch.arange(1024, dtype=torch.float32) * 0.5 * size + size * (size - 1) / 2
    ok = ok and bool(torch.isnan(f[5])) and torch.equal(torch.cat([f[:5], f[6:]]), torch.cat([want[:5], want[6:]]))
elif case == "cut":
    if rank == 0:
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.01)
    x = ints(1024, 2)
    t = time.time()
    dist.all_reduce(x)
    if rank == 0:
        # How long the switch's silence stalled the call: the give-up time, not twice.
        print(f"rank 0 recovered in {time.time() - t:.2f} s", flush=True)
    ok = ok and torch.equal(x, expected(1024, 2))
    # The flat collectives, 128 KiB a block: more than one segment per rank's block.
    m = 1 << 15
    block = torch.empty(m, dtype=torch.int32)
    dist.reduce_scatter(block, list(ints(size * m, 7).chunk(size)))
    ok = ok and torch.equal(block, expected(size * m, 7)[rank * m : (rank + 1) * m])
    parts = [torch.empty(m, dtype=torch.int32) for _ in range(size)]
    dist.all_gather(parts, torch.arange(m, dtype=torch.int32) * (rank + 1))
    ok = ok and all(torch.equal(p, torch.arange(m, dtype=torch.int32) * (r + 1)) for r, p in enumerate(parts))
    b = ints(size * m, 8) if rank == 1 else torch.zeros(size * m, dtype=torch.int32)
    dist.broadcast(b, src=1)
    ok = ok and torch.equal(b, torch.arange(size * m, dtype=torch.int32) + 9)
elif case == "sizes":
    for n, k in [(1024, 3), (1 << 18, 5), (1 << 20, 4)]:
        x = ints(n, k)
        dist.all_reduce(x)
        ok = ok and torch.equal(x, expected(n, k))
    # The route takes the element type: float16 sums of 1 MiB and 4 MiB (at 2 or 3 ranks
    # as int32's: the first through the switch, the second by Gloo).
    for n in (1 << 19, 1 << 21):
        small = lambda r: (torch.arange(n, dtype=torch.int32) + r + 2) % 16 - 8
        h = small(rank).to(torch.float16)
        dist.all_reduce(h)
        ok = ok and torch.equal(h, sum(small(r) for r in range(size)).to(torch.float16))
    # What ZeRO and FSDP call, and a reduce: served by the backend though torch 1.13's
    # process group has them in C++ only (Gloo 1.13 has neither of the first two).
    m = 1 << 14
    block = torch.empty(m, dtype=torch.int32)
    dist.reduce_scatter_tensor(block, ints(size * m, 6))
    ok = ok and torch.equal(block, expected(size * m, 6)[rank * m : (rank + 1) * m])
    whole = torch.empty(size * m, dtype=torch.int32)
    dist.all_gather_into_tensor(whole, torch.arange(m, dtype=torch.int32) * (rank + 1))
    ok = ok and all(torch.equal(p, torch.arange(m, dtype=torch.int32) * (r + 1)) for r, p in enumerate(whole.chunk(size)))
    # In place, each rank's input in the next rank's block of the output (1 MiB blocks:
    # the others' blocks come in while its own is still being sent).
    big, k = 1 << 18, (rank + 1) % size
    whole = torch.zeros(size * big, dtype=torch.int32)
    whole[k * big : (k + 1) * big] = torch.arange(big, dtype=torch.int32) * (rank + 1)
    dist.all_gather_into_tensor(whole, whole[k * big : (k + 1) * big])
    ok = ok and all(torch.equal(p, torch.arange(big, dtype=torch.int32) * (r + 1)) for r, p in enumerate(whole.chunk(size)))
    r = ints(4 * m, 7)
    dist.reduce(r, dst=1)
    ok = ok and torch.equal(r, expected(4 * m, 7) if rank == 1 else ints(4 * m, 7))
    # Broadcasts from rank 1 of 4 KiB and 64 KiB: by the default route the first through
    # the switch, the second by Gloo.
    for n in (1 << 10, 1 << 14):
        want = torch.arange(n, dtype=torch.int32) + 1 + 8
        b = want.clone() if rank == 1 else torch.zeros(n, dtype=torch.int32)
        dist.broadcast(b, src=1)
        ok = ok and torch.equal(b, want)
elif case == "callback":
    x = ints(1024, 5)

    def then(f):
        # Another all_reduce, waited for inside the callback.
        y = ints(1024, 6)
        dist.all_reduce(y)
        return torch.equal(f.value()[0], expected(1024, 5)) and torch.equal(y, expected(1024, 6))

    ok = ok and dist.all_reduce(x, async_op=True).get_future().then(then).wait()
    # Calls waited for at once are finished on the caller's thread when none is in flight,
    # and behind the calls in flight otherwise, in the calls' order.
    engine = dist.distributed_c10d._get_default_group()._engine
    here = engine.finished_here
    # The completion thread held back for half a second: the three are still in flight
    # when the fourth starts, whatever the scheduler does.
    engine.turn.acquire()
    threading.Timer(0.5, engine.turn.release).start()
    xs = [ints(1 << 16, k) for k in range(3)]
    works = [dist.all_reduce(a, async_op=True) for a in xs]
    y = ints(1024, 9)
    dist.all_reduce(y)
    # Finished behind them, in order: their results are in when it returns.
    ok = ok and engine.finished_here == here and torch.equal(y, expected(1024, 9))
    ok = ok and all(torch.equal(a, expected(1 << 16, k)) for k, a in enumerate(xs))
    for w in works:
        w.wait()
    for k in range(4):
        z = ints(1024, k)
        dist.all_reduce(z)
        ok = ok and torch.equal(z, expected(1024, k))
    # The outputs one tensor's blocks: gathered straight into it.
    parts = list(torch.empty(size * 256, dtype=torch.int32).chunk(size))
    dist.all_gather(parts, torch.arange(256, dtype=torch.int32) * (rank + 1))
    ok = ok and all(torch.equal(p, torch.arange(256, dtype=torch.int32) * (r + 1)) for r, p in enumerate(parts))
    b = ints(512, 3) if rank == 1 else torch.zeros(512, dtype=torch.int32)
    dist.broadcast(b, src=1)
    ok = ok and torch.equal(b, torch.arange(512, dtype=torch.int32) + 4)
    # Exactly those six on the caller's thread.
    ok = ok and engine.finished_here == here + 6
elif case == "powersgd":
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = torch.nn.parallel.DistributedDataParallel(net)
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
    model.register_comm_hook(state, powerSGD.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        torch.manual_seed(100 + 10 * step + rank)
        loss = model(torch.randn(16, 64)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    # The replicas stayed equal: every rank's parameters are the largest and the smallest.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    ok = ok and torch.equal(hi, flat) and torch.equal(lo, flat)
elif case == "unwaited":
    if rank == 0:
        time.sleep(6)
    dist.all_reduce(ints(1024, 7), async_op=True)
elif case == "timeout":
    # Rank 0 comes 12 s late to an all_reduce: the others give up at the group's 5 s.
    if rank == 0:
        time.sleep(12)
    t = time.time()
    try:
        dist.all_reduce(ints(1024, 8))
        ok = False
    except Exception as e:  # noqa: BLE001 - the failure is the case (rank 0's too: the
        # others gave up on the call)
        print(f"rank {rank}: failed after {time.time() - t:.1f} s: {e}", flush=True)
    print(f"rank {rank}: {case} ok={ok}", flush=True)
    # Leaving would wait for the others at the group's last barrier.
    os._exit(0)
elif case == "dies":
    if rank == size - 1:
        # Gone without a word: no leave, no destroy_process_group.
        print(f"rank {rank}: {case} ok={ok}", flush=True)
        os._exit(0)
    t = time.time()
    try:
        dist.all_reduce(ints(1024, 1))
        ok = False
    except Exception as e:  # noqa: BLE001 - the failure is the case
        print(f"rank {rank}: failed after {time.time() - t:.1f} s: {e}", flush=True)
        ok = ok and "whose process is gone" in str(e)
    print(f"rank {rank}: {case} ok={ok}", flush=True)
    # Leaving would wait for the dead rank at the group's last barrier.
    os._exit(0)
elif case == "types":
    b = torch.arange(64, dtype=torch.bfloat16) + rank
    dist.all_reduce(b)
    ok = ok and torch.equal(b, torch.arange(64, dtype=torch.bfloat16) * size + size * (size - 1) // 2)
    f = torch.arange(64, dtype=torch.float32) + rank
    dist.all_reduce(f, op=dist.ReduceOp.AVG)
    ok = ok and torch.equal(f, torch.arange(64, dtype=torch.float32) + (size - 1) / 2)
    h = torch.arange(64, dtype=torch.int16) + rank
    dist.all_reduce(h, op=dist.ReduceOp.AVG)
    ok = ok and torch.equal(h, torch.arange(64, dtype=torch.int16) + (size - 1) // 2)
    # What Gloo 1.13 refuses ("Invalid scalar type"), passed to it: an int16 sum that wraps,
    # a bool max, an int16 reduce-scatter, all-gather and a bool broadcast; and a product
    # of floats, which it takes.
    w = torch.full((64,), 30000, dtype=torch.int16) + rank
    dist.all_reduce(w)
    ok = ok and torch.equal(w, (torch.full((64,), 30000 * size + size * (size - 1) // 2, dtype=torch.int32)).to(torch.int16))
    flags = torch.arange(64) % size == rank
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    ok = ok and bool(flags.all())
    block = torch.empty(8, dtype=torch.int16)
    dist.reduce_scatter(block, list((torch.arange(8 * size, dtype=torch.int16) + rank).chunk(size)))
    ok = ok and torch.equal(block, (torch.arange(8 * size, dtype=torch.int16) * size + size * (size - 1) // 2)[rank * 8 : (rank + 1) * 8])
    # Gathers move bytes: an int16 and a bool all-gather through the switch as words; a
    # broadcast of 7 bools (an odd number of bytes) passed to Gloo, as bytes.
    parts = [torch.empty(5, dtype=torch.int16) for _ in range(size)]
    dist.all_gather(parts, torch.arange(5, dtype=torch.int16) - 1000 * rank)
    ok = ok and all(torch.equal(p, torch.arange(5, dtype=torch.int16) - 1000 * r) for r, p in enumerate(parts))
    marks = [torch.empty(8, dtype=torch.bool) for _ in range(size)]
    dist.all_gather(marks, torch.arange(8) % (rank + 2) == 0)
    ok = ok and all(torch.equal(p, torch.arange(8) % (r + 2) == 0) for r, p in enumerate(marks))
    said = torch.arange(7) % 2 == 0 if rank == 1 else torch.zeros(7, dtype=torch.bool)
    dist.broadcast(said, src=1)
    ok = ok and torch.equal(said, torch.arange(7) % 2 == 0)
    # Several tensors in one all_gather: Gloo's, as they are (which refuses these).
    try:
        dist.distributed_c10d._get_default_group().allgather([[torch.empty(2)], [torch.empty(2)]], [torch.ones(2), torch.ones(2)])
        ok = False
    except RuntimeError as e:
        ok = ok and "ProcessGroupGloo" in str(e)
    # A reduce-scatter whose input is not the ranks' blocks raises, as on torch's other
    # backends: no rank reduces the wrong elements.
    for call in (
        lambda: dist.reduce_scatter_tensor(torch.empty(250), torch.ones(250 * size + 2)),
        lambda: dist.reduce_scatter(torch.empty(4), [torch.ones(4)] * (size + 1)),
    ):
        try:
            call()
            ok = False
        except RuntimeError as e:
            ok = ok and "reduce_scatter" in str(e)
    g = torch.full((16,), 2.0) if rank == 0 else torch.ones(16)
    dist.all_reduce(g, op=dist.ReduceOp.PRODUCT)
    ok = ok and torch.equal(g, torch.full((16,), 2.0))
    # A root that is not a rank, an all-gather's output of the wrong size: each raises,
    # saying so, and the group goes on.
    for call, says in (
        (lambda: dist.reduce(torch.zeros(10), dst=size + 3), "is not a rank of this group"),
        (lambda: dist.broadcast(torch.zeros(10), src=-1), "is not a rank of this group"),
        (lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)), "the output must hold"),
    ):
        try:
            call()
            ok = False
        except RuntimeError as e:
            ok = ok and says in str(e)
    # An async call's result(), as Gloo's work gives it.
    v = ints(64, 2)
    ok = ok and torch.equal(dist.all_reduce(v, async_op=True).result()[0], expected(64, 2))
    # torch 1.13 makes monitored_barrier only for Gloo groups: an xagg group's by its Gloo.
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    # Several tensors in one call, passed to Gloo (and counted so).
    pair = [ints(64, 3), ints(32, 4)]
    dist.all_reduce_coalesced(pair)
    ok = ok and torch.equal(pair[0], expected(64, 3)) and torch.equal(pair[1], expected(32, 4))
else:
    ok = False
print(f"rank {rank}: {case} ok={ok}", flush=True)
if sys.argv[2:] == ["exit"]:
    sys.exit(0)
try:
    dist.destroy_process_group()
except Exception as e:  # noqa: BLE001 - printed for the test to read
    print(f"rank {rank}: destroy_process_group raised {type(e).__name__}: {e}", flush=True)
    if case != "unwaited":
        raise
if case == "callback":
    # The default group made again in the same process: its lines name the rank alone.
    # (A store of its own: torch 1.13's barrier at init counts on the first store's key.)
    store = f"tcp://{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 100}"
    dist.init_process_group("xagg", init_method=store, rank=rank, world_size=size)
    again = ints(64, 3)
    dist.all_reduce(again)
    print(f"rank {rank}: again ok={torch.equal(again, expected(64, 3))}", flush=True)
    dist.destroy_process_group()
