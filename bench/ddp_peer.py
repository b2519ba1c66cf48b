"""The peer of apps/examples/train.cc: the same GPT (or MLP), data, optimizer and schedule in
PyTorch's own Python DDP on Gloo. Prints the same "done: N steps, mean step time X ms" line.
Run under any launcher that sets torchrun's environment (bench/ddp_step.py uses cxxlaunch run).
"""
import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, causal):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        scores = scores.masked_fill(causal, float("-inf"))
        h = x + self.proj((scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, t, d))
        return h + self.down(F.gelu(self.up(self.ln2(h))))


class Gpt(nn.Module):
    def __init__(self, vocab, seq_len, d, layers, heads):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d), nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=idx.device).triu(1)
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, causal)
        return self.head(self.ln(x))


class Mlp(nn.Module):
    """train.cc's `mlp`: in -> hidden -> hidden -> out with GELU."""

    def __init__(self, d_in, hidden, d_out):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(d_in, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gpt", choices=["gpt", "mlp"])
    p.add_argument("--hidden", type=int, default=256, help="mlp width")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    mlp_in, mlp_out = 32, 8  # train.cc's
    model = nn.parallel.DistributedDataParallel(
        Mlp(mlp_in, a.hidden, mlp_out) if a.model == "mlp" else
        Gpt(a.vocab, a.seq_len, a.d_model, a.layers, a.heads))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(rank)
    untimed = 2
    start = None
    for step in range(1, a.steps + 1):
        if a.model == "mlp":
            x = torch.randn(a.batch_size, mlp_in, generator=gen)
            loss = F.mse_loss(model(x), torch.randn(a.batch_size, mlp_out, generator=gen))
        else:
            seeds = torch.randint(a.vocab, (a.batch_size, 2), generator=gen)
            seq = [seeds[:, 0], seeds[:, 1]]
            for _ in range(a.seq_len - 1):
                seq.append((seq[-1] + seq[-2]) % a.vocab)
            data = torch.stack(seq, 1)
            x, y = data[:, :-1], data[:, 1:]
            loss = F.cross_entropy(model(x).reshape(-1, a.vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == untimed:
            start = time.perf_counter()
    mean_ms = (time.perf_counter() - start) / (a.steps - untimed) * 1000
    if rank == 0:
        print(f"done: {a.steps} steps, mean step time {mean_ms:.3f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
