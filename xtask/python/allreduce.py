"""PyTorch's baseline and xagg's backend in `cargo xtask bench`: dist.all_reduce (int32 sum)
of each size, timed like the MPI baseline (a barrier, then the call, the run's time the
slowest rank's), verified after the clock stops; then the same calls back to back.
Usage: allreduce.py BACKEND SEED BYTES:ITERATIONS...; one process per rank (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Rank 0 prints one JSON object per size."""
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


def member(r, n):
    g = torch.Generator().manual_seed(seed * 1000 + r)
    return torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32)


def tx_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        return int(f.read())


for nbytes, iterations in points:
    n = nbytes // 4
    data = member(rank, n)
    buf = torch.empty_like(data)
    times = []
    first = None
    dist.barrier(group=control)
    tx0 = tx_bytes()
    for it in range(iterations):
        buf.copy_(data)
        dist.barrier(group=control)
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t0)
        if it == 0:
            first = buf.clone()
    dist.barrier(group=control)
    tx = float(tx_bytes() - tx0)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=control)
    # Back to back, as the switch's own workers time theirs (no barrier between calls,
    # each call from the end of the rank's previous one, its slowest rank's time): what
    # the backend's time over the switch path alone compares like with like.
    b2b = []
    dist.barrier(group=control)
    last = time.perf_counter()
    for it in range(iterations):
        dist.all_reduce(buf)
        now = time.perf_counter()
        b2b.append(now - last)
        last = now
    b2b = torch.tensor(b2b, dtype=torch.float64)
    dist.all_reduce(b2b, op=dist.ReduceOp.MAX, group=control)
    want = sum(member(r, n).to(torch.int64) for r in range(size))
    want = ((want + 2**31) % 2**32 - 2**31).to(torch.int32)
    ok = torch.tensor([int(torch.equal(first, want))])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=control)
    total_tx = torch.tensor([tx], dtype=torch.float64)
    dist.all_reduce(total_tx, group=control)
    if rank == 0:
        print(
            json.dumps(
                {
                    "bytes": nbytes,
                    "seconds": slowest.tolist(),
                    "back_to_back": b2b.tolist(),
                    "verified": bool(ok.item()),
                    "tx_bytes_per_rank": total_tx.item() / size,
                }
            ),
            flush=True,
        )
dist.destroy_process_group()
