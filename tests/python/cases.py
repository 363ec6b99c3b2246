"""The cases of the PyTorch backend's table (docs/python.md), one per run, as a user's
script would meet them, launched by torchrun (one process per lab namespace):
`cases.py CASE [GO]`. Every run first makes one all_reduce (the group joins the switch),
then:
- `late`: rank 0 starts its all_reduce 3 s after the others;
- `nan`: rank 1 puts a NaN into element 5 of a float sum;
- `cut GO`: rank 0 waits for the file GO (the test cuts its results off first), then every
  rank makes an all_reduce;
- `sizes`: all_reduce of 4 KiB and of 64 KiB (the route by size).
Each rank prints `rank R: CASE ok=True|False` (and for `late`, how long rank 1 waited)."""
import math
import os
import sys
import time

import torch
import torch.distributed as dist

case = sys.argv[1]
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
    dist.all_reduce(x)
    ok = ok and torch.equal(x, expected(1024, 2))
elif case == "sizes":
    for n, k in [(1024, 3), (16384, 4)]:
        x = ints(n, k)
        dist.all_reduce(x)
        ok = ok and torch.equal(x, expected(n, k))
else:
    ok = False
print(f"rank {rank}: {case} ok={ok}", flush=True)
dist.destroy_process_group()
