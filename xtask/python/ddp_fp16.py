"""DDP with PyTorch's `fp16_compress_hook` (gradients allreduced as float16), timed through
the xagg backend and through Gloo in the same run: the same model twice, one DDP on the
default group (the xagg backend) and one on a Gloo group of the same ranks, their steps
alternated, each after a barrier. Run as `cargo xtask demo --workers 4 --ddp
xtask/python/ddp_fp16.py` (torchrun's arguments, BACKEND STEPS OUT, are not used). Rank 0
prints each way's median step time and the largest difference between the two models'
parameters after the steps (the fast float mode and Gloo round differently)."""
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS, WARM_UP = 12, 2

dist.init_process_group("xagg")
rank = dist.get_rank()
gloo = dist.new_group(backend="gloo")


def model():
    # 12.6M parameters (50 MiB of float32 gradients: two 25 MB buckets' worth of float16
    # at a time); Tanh keeps the gradients well inside float16's range.
    torch.manual_seed(0)
    layers = [m for _ in range(12) for m in (torch.nn.Linear(1024, 1024), torch.nn.Tanh())]
    return torch.nn.Sequential(*layers)


ways = {}
for name, group in [("xagg", None), ("gloo", gloo)]:
    m = DDP(model(), process_group=group, bucket_cap_mb=25)
    m.register_comm_hook(group, default_hooks.fp16_compress_hook)
    ways[name] = (m, torch.optim.SGD(m.parameters(), lr=1e-3))
times = {name: [] for name in ways}
torch.manual_seed(1)
x = torch.randn(4, 1024)
for step in range(STEPS):
    for name, (m, opt) in ways.items():
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
        times[name].append(time.perf_counter() - t0)
apart = max(
    (a - b).abs().max().item()
    for a, b in zip(ways["xagg"][0].parameters(), ways["gloo"][0].parameters())
)
if rank == 0:
    for name, t in times.items():
        print(f"{name}: median step {statistics.median(t[WARM_UP:]) * 1e3:.1f} ms over {STEPS - WARM_UP} steps", flush=True)
    print(f"largest parameter difference between the two after {STEPS} steps: {apart:.3g}", flush=True)
dist.barrier(group=gloo)
