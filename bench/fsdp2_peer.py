"""The peer of the GPU check's ZeRO-3 benchmark (scripts/gpu-check.sh): apps/examples/train.cc's
GPT (bench/ddp_peer.py's copy of it) under PyTorch's own FSDP2, world 1 on one GPU: every block
and the root through fully_shard, bf16 parameters and gradient reduction (cxxlaunch's
mixed_precision: bf16), torch.optim.AdamW(fused=True). Prints the trainer's "done: N steps, mean
step time X ms" with the GPU's peak allocated memory as "GPU peak Y MiB".

With --autocast the forward also runs under torch.autocast(bf16), as accelerate runs an FSDP
model with mixed_precision bf16 and as cxxlaunch does: softmax, layer norm and the loss then
compute in fp32 and keep fp32 activations. Without it everything computes in bf16 (FSDP2 alone).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ddp_peer import Gpt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--d_model", type=int, default=2048)
    p.add_argument("--layers", type=int, default=18)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--autocast", action="store_true", help="forward under torch.autocast(bf16)")
    a = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    torch.manual_seed(1234)
    model = Gpt(a.vocab, a.seq_len, a.d_model, a.layers, a.heads).cuda()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, fused=True)
    untimed = 2
    start = None
    for step in range(1, a.steps + 1):
        data = torch.randint(a.vocab, (a.batch_size, a.seq_len), device="cuda")
        x, y = data[:, :-1], data[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.autocast):
            loss = F.cross_entropy(model(x).float().reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == untimed:
            torch.cuda.synchronize()
            start = time.perf_counter()
    torch.cuda.synchronize()
    mean_ms = (time.perf_counter() - start) / (a.steps - untimed) * 1000
    peak = torch.cuda.max_memory_allocated() / 2**20
    print(f"done: {a.steps} steps, mean step time {mean_ms:.3f} ms; GPU peak {peak:.1f} MiB",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
