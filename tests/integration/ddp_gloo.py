# A stock PyTorch DDP script, unchanged from what torchrun runs: env:// rendezvous, Gloo,
# DistributedDataParallel on a small model, a few SGD steps on each rank's own data. Every rank
# ends with the same parameters (DDP averaged the gradients), which it checks against rank 0's.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group(backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                    torch.nn.Linear(32, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
for step in range(5):
    x = torch.randn(8, 16, generator=data)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
reference = flat.clone()
dist.broadcast(reference, src=0)
assert torch.equal(flat, reference), "parameters differ across ranks"
print(f"rank {rank}/{world} ddp ok: loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
