"""The peer of `collectives --op allreduce`: torch.distributed.all_reduce on Gloo over the same
sizes and iterations, timed the same way; rank 0 prints "bytes busbw_GB/s" lines."""
import argparse
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--min_bytes", type=int, default=1 << 20)
p.add_argument("--max_bytes", type=int, default=64 << 20)
p.add_argument("--iters", type=int, default=10)
p.add_argument("--warmup", type=int, default=3)
a = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
n, rank = dist.get_world_size(), dist.get_rank()
size = a.min_bytes
while size <= a.max_bytes:
    t = torch.ones(size // 4)
    for _ in range(a.warmup):
        dist.all_reduce(t)
    dist.barrier()
    busy = 0.0
    for _ in range(a.iters):
        start = time.perf_counter()
        dist.all_reduce(t)
        busy += time.perf_counter() - start
    seconds = busy / a.iters
    if rank == 0:
        print(f"{size} {size / seconds / 1e9 * 2 * (n - 1) / n:.4f}", flush=True)
    size *= 4
dist.destroy_process_group()
