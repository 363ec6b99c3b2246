"""A small model trained on every rank, launched by torchrun: `zero` shards the optimizer's
work ZeRO-style (each rank's gradients scaled by 1/n, reduce-scattered; each rank updates
its shard of the parameters; the shards all-gathered), `ddp` trains the same model with
DistributedDataParallel. Both start from rank 0's parameters (broadcast) and take the same
SGD steps on the same data, so in the exact float mode (XAGG_FLOAT=exact: every sum the
switch makes is rounded once, whatever its order) their parameters must agree bit for bit.

Usage: zero_check.py BACKEND MODE STEPS
Prints `rank R: steps=S params=<sha256 of the parameters' bytes>`.
"""

import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import xagg.torch  # noqa: F401 - registers the backend

backend, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group(backend)
rank, n = dist.get_rank(), dist.get_world_size()

# Different initial parameters on each rank: the broadcast must make them rank 0's.
torch.manual_seed(100 + rank)
model = nn.Sequential(nn.Linear(24, 40), nn.Tanh(), nn.Linear(40, 6))
lr = 0.05


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 24, generator=g)
    return x, torch.randn(32, 6, generator=g)


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


params = list(model.parameters())
if mode == "ddp":
    net = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters
    for step in range(steps):
        model.zero_grad()
        x, y = batch(step)
        nn.functional.mse_loss(net(x), y).backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-lr)
else:
    with torch.no_grad():
        for p in params:
            dist.broadcast(p, 0)
    total = sum(p.numel() for p in params)
    shard = -(-total // n)
    for step in range(steps):
        model.zero_grad()
        x, y = batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            # Scaled by 1/n before the sum, as DDP's buckets are (exact for n a power of 2).
            grads = torch.zeros(shard * n)
            grads[:total] = flat([p.grad for p in params]) * (1.0 / n)
            mine = torch.empty(shard)
            dist.reduce_scatter(mine, list(grads.chunk(n)))
            whole = torch.zeros(shard * n)
            whole[:total] = flat(params)
            own = whole[rank * shard : (rank + 1) * shard].clone()
            own.add_(mine, alpha=-lr)
            parts = [torch.empty(shard) for _ in range(n)]
            dist.all_gather(parts, own)
            new = torch.cat(parts)[:total]
            at = 0
            for p in params:
                p.copy_(new[at : at + p.numel()].view(p.shape))
                at += p.numel()

digest = hashlib.sha256(flat([p.detach() for p in params]).numpy().tobytes()).hexdigest()
print(f"rank {rank}: steps={steps} params={digest}", flush=True)
dist.destroy_process_group()
