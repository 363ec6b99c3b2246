"""DDP training, as a user's script would do it, on the backend named by argv (nothing of
xagg imported: the installed package registers "xagg" at its first use):
`ddp_check.py BACKEND STEPS OUT [compare|slow|hook|late0|late1|die|raise]`, launched by torchrun (one process per lab
namespace). A small model trained STEPS steps; rank 0 saves the final parameters to OUT and
prints whether every rank's are identical. `compare` checks each bucket's allreduce through
the backend against Gloo's of the same gradients (a comm hook running both); `slow` sleeps
between steps (a run to disturb); `hook` sends the gradients through the switch by
xagg's DDP communication hook, the backend staying what it is; `late0` and `late1` pin the
buckets (`static_graph`) and start each rank's backward pass 20 ms per rank late, in rank
order or reversed, so that contributions meet in another order; `die` and `raise` end the
last rank at step 2 (`os._exit`, an uncaught exception), and the others say what their
backward raised and when, then exit. On the xagg backend it also checks that an allreduce's
future is not complete when the call returns, and is after it is waited for."""
import faulthandler
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


# A crash (a rank once died of SIGABRT at exit, "terminate called without an active
# exception", after every check had passed) prints every Python thread's stack.
faulthandler.enable()
backend, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else ""
dist.init_process_group(backend)
rank, size = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
# Layers of 1M weights: more than DDP's first bucket holds, so each step has several.
# Tanh, not ReLU: the final parameters are compared with Gloo's, and a ReLU whose input
# lies within a rounding difference of zero (of 2M inputs over the run, one is within
# 1e-7) switches on one side only and moves its unit's gradient by a whole value — a
# difference of 1e-5 from an ulp, seen once in a few runs. Tanh keeps the parameters a
# smooth function of the sums' rounding.
model = torch.nn.Sequential(
    torch.nn.Linear(64, 1024),
    torch.nn.Tanh(),
    torch.nn.Linear(1024, 1024),
    torch.nn.Tanh(),
    torch.nn.Linear(1024, 1024),
    torch.nn.Tanh(),
    torch.nn.Linear(1024, 10),
)
late = mode in ("late0", "late1")
if late:
    # A hang (DDP's reducer waited forever on a work the backend handed it from C++, with
    # static_graph) ends the run with every thread's stack instead.
    faulthandler.dump_traceback_later(90, exit=True)
ddp = DDP(model, bucket_cap_mb=1, static_graph=late)
stats = {"buckets": 0, "exact": 0, "worst": 0.0}

if mode == "compare":
    gloo = dist.new_group(backend="gloo")

    def compare_hook(state, bucket):
        buf = bucket.buffer()
        copy = buf.clone()
        top = copy.abs().max().reshape(1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=gloo)
        work = dist.all_reduce(buf, async_op=True)  # the default group: the backend under test
        dist.all_reduce(copy, group=gloo)
        work.wait()
        # docs/types.md's bound with the largest magnitude over all ranks, plus Gloo's own
        # rounding (n - 1 additions of float32).
        m = float(top.item())
        k = math.floor(math.log2(m)) + 1 - 24 if m > 0 else -149
        bound = (1.5 * size + 2) * 2.0**k + size * (size + 1) * m * 2.0**-24
        err = float((buf - copy).abs().max().item())
        stats["buckets"] += 1
        stats["exact"] += int(torch.equal(buf, copy))
        stats["worst"] = max(stats["worst"], err / bound if bound > 0 else 0.0)
        fut = torch.futures.Future()
        fut.set_result(buf.div_(size))
        return fut

    ddp.register_comm_hook(None, compare_hook)

    # Exactly representable values (multiples of 1/4 far inside float32's mantissa) come
    # out bit for bit as Gloo's.
    a = torch.arange(100_000, dtype=torch.float32) * 0.25 * (rank + 1)
    b = a.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    print(f"rank {rank}: exactly_representable_equal={torch.equal(a, b)}", flush=True)

if mode == "hook":
    # Gloo stays the backend; the gradients go through the switch by the hook.
    import xagg.torch

    ddp.register_comm_hook(xagg.torch.HookState(), xagg.torch.allreduce_hook)

opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1000 + rank)
start = time.monotonic()
for step in range(steps):
    if mode in ("die", "raise") and rank == size - 1 and step == 2:
        if mode == "die":
            os._exit(3)
        raise RuntimeError("the program failed on purpose")
    x = torch.randn(32, 64, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    if late:
        time.sleep(0.02 * (rank if mode == "late0" else size - 1 - rank))
    try:
        loss.backward()
    except RuntimeError as e:
        if mode not in ("die", "raise"):
            raise
        print(f"rank {rank}: backward raised after {time.monotonic() - start:.1f} s: {e}", flush=True)
        sys.exit(0)
    opt.step()
    if mode == "slow":
        time.sleep(0.05)

flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.empty_like(flat) for _ in range(size)]
dist.all_gather(gathered, flat)
identical = all(torch.equal(gathered[0], t) for t in gathered)
if rank == 0:
    torch.save(flat, out)
print(f"rank {rank}: steps={steps} identical={identical} buckets={stats['buckets']} exact={stats['exact']} worst={stats['worst']:.3f}", flush=True)

if backend == "xagg":
    # A strided view: reduced as a contiguous copy (Gloo 1.13 itself gets it wrong).
    strided = (torch.arange(2000, dtype=torch.float32) * (rank + 1))[::2]
    dist.all_reduce(strided)
    want = torch.arange(2000, dtype=torch.float32)[::2] * (size * (size + 1) // 2)
    print(f"rank {rank}: noncontiguous_ok={torch.equal(strided, want)}", flush=True)
    big = torch.ones(4 << 20)
    work = dist.all_reduce(big, async_op=True)
    pending = not work.is_completed()
    work.wait()
    print(f"rank {rank}: pending_after_submit={pending} done_after_wait={work.is_completed()} result_ok={bool((big == size).all())}", flush=True)
    # The one-tensor forms ZeRO and FSDP call, and a reduce to the last rank (through the
    # switch, behind hosts, or by Gloo after the switch failed).
    m = 3000
    mine = torch.arange(size * m, dtype=torch.float32) + rank
    block = torch.empty(m)
    dist.reduce_scatter_tensor(block, mine)
    summed = torch.arange(size * m, dtype=torch.float32) * size + size * (size - 1) // 2
    ok = torch.equal(block, summed[rank * m : (rank + 1) * m])
    whole = torch.empty(size * m)
    dist.all_gather_into_tensor(whole, torch.full((m,), float(rank)))
    ok = ok and torch.equal(whole, torch.arange(size).repeat_interleave(m).float())
    dist.reduce(mine, dst=size - 1)
    ok = ok and torch.equal(mine, summed if rank == size - 1 else torch.arange(size * m, dtype=torch.float32) + rank)
    print(f"rank {rank}: tensor_forms_ok={ok}", flush=True)

dist.destroy_process_group()
