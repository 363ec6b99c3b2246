"""PyTorch's baseline and xagg's backend in `cargo xtask bench`: dist.all_reduce (int32 sum)
of each size, timed like the MPI baseline (a barrier, then the call, the run's time the
slowest rank's), verified after the clock stops; then the same calls back to back.
With BENCH_COLLECTIVE in the environment (all_gather, broadcast, reduce, reduce_scatter),
every call is that collective over the same BYTES instead (an all-gather's and a
reduce-scatter's message is all the blocks; root 0), as the MPI baseline does. Torch
1.13's Gloo has no reduce-scatter: with Gloo it is what a program does instead, the whole
buffer allreduced and its block kept (the xagg backend's own stand-in).
With BENCH_DTYPE (float32, float64, float16, bfloat16; default int32) the elements are
that type: small integers (|x| <= 16), whose sums are exact in every type and every order,
so that every backend's result is checked bit for bit; BYTES stays the message's size.
Gloo 1.13 has no bfloat16 allreduce: with Gloo it is made in float32 and rounded back.
Usage: allreduce.py BACKEND SEED BYTES:ITERATIONS...; one process per rank (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Rank 0 prints one JSON object per size."""
import os
import json
import sys
import time

import torch
import torch.distributed as dist


backend, seed = sys.argv[1], int(sys.argv[2])
points = [tuple(int(x) for x in p.split(":")) for p in sys.argv[3:]]
dist.init_process_group(backend)
rank, size = dist.get_rank(), dist.get_world_size()
control = dist.new_group(backend="gloo")


dtype = os.environ.get("BENCH_DTYPE", "int32")
if dtype not in ("int32", "float32", "float64", "float16", "bfloat16"):
    sys.exit(f"BENCH_DTYPE={dtype}: this script times int32, float32, float64, float16 or bfloat16")
dtype = getattr(torch, dtype)


def member(r, n):
    g = torch.Generator().manual_seed(seed * 1000 + r)
    if dtype == torch.int32:
        return torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    # bfloat16's 8 significant bits hold any sum of up to 15 of these exactly.
    return torch.randint(-16, 17, (n,), generator=g, dtype=torch.int64).to(dtype)


def link_bytes(way):
    with open(f"/sys/class/net/eth0/statistics/{way}_bytes") as f:
        return int(f.read())


collective = os.environ.get("BENCH_COLLECTIVE", "allreduce")
if collective not in ("allreduce", "all_gather", "broadcast", "reduce", "reduce_scatter"):
    sys.exit(f"BENCH_COLLECTIVE={collective}: this script times allreduce, all_gather, broadcast, reduce or reduce_scatter")


def call(data, buf):
    """One timed call; `buf` holds what the caller gets (at every rank: the others'
    `reduce` outputs are not checked)."""
    if collective == "all_gather":
        b = buf.numel() // size
        dist.all_gather(list(buf.split(b)), data[rank * b : (rank + 1) * b])
    elif collective == "broadcast":
        dist.broadcast(buf, 0)
    elif collective == "reduce":
        dist.reduce(buf, 0)
    elif collective == "reduce_scatter":
        b = buf.numel() // size
        if backend == "gloo":
            whole = data.clone()
            dist.all_reduce(whole)
            buf[rank * b : (rank + 1) * b].copy_(whole[rank * b : (rank + 1) * b])
        else:
            dist.reduce_scatter(buf[rank * b : (rank + 1) * b], list(data.split(b)))
    elif backend == "gloo" and dtype == torch.bfloat16:
        # Gloo 1.13 has no bfloat16 sum: what a program does instead (as the xagg
        # backend's own fallback), the sum made in float32 and rounded back.
        wide = buf.float()
        dist.all_reduce(wide)
        buf.copy_(wide)
    else:
        dist.all_reduce(buf)


def start(data, buf):
    """The buffer before a call: a broadcast's other ranks start from zeros."""
    if collective == "broadcast" and rank != 0:
        buf.zero_()
    else:
        buf.copy_(data)


def wanted(n):
    if collective == "all_gather":
        b = n // size
        return torch.cat([member(r, n)[r * b : (r + 1) * b] for r in range(size)])
    if collective == "broadcast":
        return member(0, n)
    want = sum(member(r, n).to(torch.int64) for r in range(size))
    want = ((want + 2**31) % 2**32 - 2**31).to(dtype)
    if collective == "reduce_scatter":
        # Each rank's block of the sum; the rest of its buffer is its own input.
        b = n // size
        mine = member(rank, n).clone()
        mine[rank * b : (rank + 1) * b] = want[rank * b : (rank + 1) * b]
        return mine
    return want


for nbytes, iterations in points:
    n = nbytes // torch.tensor([], dtype=dtype).element_size()
    data = member(rank, n)
    buf = torch.empty_like(data)
    times = []
    first = None
    dist.barrier(group=control)
    tx0, rx0 = link_bytes("tx"), link_bytes("rx")
    for it in range(iterations):
        start(data, buf)
        dist.barrier(group=control)
        t0 = time.perf_counter()
        call(data, buf)
        times.append(time.perf_counter() - t0)
        if it == 0:
            first = buf.clone()
    dist.barrier(group=control)
    tx, rx = float(link_bytes("tx") - tx0), float(link_bytes("rx") - rx0)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=control)
    # Back to back, as the switch's own workers time theirs (no barrier between calls,
    # each call from the end of the rank's previous one, its slowest rank's time): what
    # the backend's time over the switch path alone compares like with like.
    b2b = []
    dist.barrier(group=control)
    last = time.perf_counter()
    for it in range(iterations):
        call(data, buf)
        now = time.perf_counter()
        b2b.append(now - last)
        last = now
    b2b = torch.tensor(b2b, dtype=torch.float64)
    dist.all_reduce(b2b, op=dist.ReduceOp.MAX, group=control)
    # A reduce's result is only the root's.
    checked = collective != "reduce" or rank == 0
    ok = torch.tensor([int(not checked or torch.equal(first, wanted(n)))])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=control)
    total = torch.tensor([tx, rx], dtype=torch.float64)
    dist.all_reduce(total, group=control)
    if rank == 0:
        print(
            json.dumps(
                {
                    "bytes": nbytes,
                    "seconds": slowest.tolist(),
                    "back_to_back": b2b.tolist(),
                    "verified": bool(ok.item()),
                    "tx_bytes_per_rank": total[0].item() / size,
                    "rx_bytes_per_rank": total[1].item() / size,
                }
            ),
            flush=True,
        )
dist.destroy_process_group()
