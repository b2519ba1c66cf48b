# A stock PyTorch distributed script, unchanged from what torchrun runs: env:// rendezvous,
# Gloo backend, one all_reduce whose result is known in closed form.
import os

import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
expected = world * (world + 1) / 2
assert torch.all(t == expected), t
print(f"rank {rank}/{world} all_reduce ok: {t[0].item():g}", flush=True)
dist.destroy_process_group()
