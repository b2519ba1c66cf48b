#!/usr/bin/python3
"""The peer of apps/finetune in plain PyTorch: the same Llama (Hugging Face's math, as
transformers' modeling_llama computes it in eager mode: RMSNorm in fp32, rotary embeddings by
rotate_half, grouped-query attention, causal mask, softmax in fp32, SwiGLU MLP; HF's parameter
names, so that it loads the same safetensors folder), the same byte tokens of the same data file
cut into the same blocks (the last --eval_fraction held out), the same batch per process and
sequence length, AdamW with weight decay 0 and a constant lr, in PyTorch's own Python DDP on
Gloo, one thread per worker (finetune sets one too). Written without transformers and without
the safetensors package (Debian's python3-torch 1.13 only).

Prints finetune's line for each --print_every steps, "step n/N  loss L  lr X  T tokens/s", with
tokens/s counted as finetune counts them (tokens of every rank over the interval's wall time),
so that bench/finetune.py parses both alike.

usage: cxxlaunch run --nproc_per_node 2 --cpu /usr/bin/python3 bench/finetune_peer.py
           --model_dir DIR --data FILE --steps 20 --seq_len 256 --batch_size 2 --lr 1e-4
           [--eval_fraction 0.1] [--print_every 5] [--seed 1234] [--mixed_precision no|bf16]
           [--device cpu|cuda]

With --device cuda (the GPU check's peer, scripts/gpu-check.sh) it is the same program on one GPU
per worker: NCCL instead of Gloo, torch.autocast("cuda") for bf16, and AdamW(fused=True), what a
PyTorch user of the GPU would write.
"""
import argparse
import json
import math
import os
import struct
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    """{name: float32 tensor} of one safetensors file (F32, BF16 or F16, cast to float32)."""
    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            raw = bytearray(f.read(end - begin))
            dt = DTYPES[info["dtype"]]
            t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
            out[name] = t.reshape(info["shape"]).float()
    return out


def read_model_dir(model_dir):
    """The folder's weights: model.safetensors, or the shards its index names."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(read_safetensors(os.path.join(model_dir, name)))
    return weights


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.nq, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or h // self.nq
        bias = c["model_type"] == "qwen2" or bool(c.get("attention_bias", False))
        self.q_proj = nn.Linear(h, self.nq * self.hd, bias=bias)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.nq * self.hd, h, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nq, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.nq // self.nkv
        if rep > 1:  # HF's repeat_kv
            k = k[:, :, None].expand(b, self.nkv, rep, t, self.hd).reshape(b, self.nq, t, self.hd)
            v = v[:, :, None].expand(b, self.nkv, rep, t, self.hd).reshape(b, self.nq, t, self.hd)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd) + mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.nq * self.hd)
        return self.o_proj(out)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = Mlp(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, h, cos, sin, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = LlamaModel(c)
        self.tied = bool(c.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, input_ids):
        c, t, dev = self.c, input_ids.shape[1], input_ids.device
        hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        # HF's LlamaRotaryEmbedding and causal mask, made each forward as HF makes them.
        inv_freq = 1.0 / (c.get("rope_theta", 10000.0) **
                          (torch.arange(0, hd, 2, dtype=torch.int64, device=dev).float() / hd))
        freqs = torch.outer(torch.arange(t, dtype=torch.int64, device=dev).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((t, t), torch.finfo(torch.float32).min, device=dev).triu(1)[None, None]
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin, mask)
        h = self.model.norm(h)
        head = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return F.linear(h, head)


def causal_lm_loss(logits, ids):
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), ids[:, 1:].reshape(-1),
                           ignore_index=-100)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--eval_fraction", type=float, default=0.1)
    p.add_argument("--print_every", type=int, default=5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--mixed_precision", choices=["no", "bf16"], default="no",
                   help="bf16: PyTorch's own mixed precision on CPU (torch.autocast), as "
                        "finetune under cxxlaunch run --mixed_precision bf16")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = p.parse_args()
    autocast = lambda: torch.autocast(a.device, dtype=torch.bfloat16,
                                      enabled=a.mixed_precision == "bf16")
    gpu = a.device == "cuda"
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(1)  # one core per worker, as finetune
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(a.model_dir, "config.json")) as f:
        c = json.load(f)
    c.setdefault("num_key_value_heads", c["num_attention_heads"])
    c.setdefault("rms_norm_eps", 1e-6)
    c.setdefault("model_type", "llama")
    if c["vocab_size"] < 256 or os.path.exists(os.path.join(a.model_dir, "tokenizer.model")):
        raise SystemExit("finetune_peer: byte tokens only (vocab_size >= 256, no tokenizer.model)")

    # Byte tokens in blocks of seq_len; the last eval_fraction (at least one) held out.
    with open(a.data, "rb") as f:
        data = f.read()
    total = len(data) // a.seq_len
    held_out = max(1, math.ceil(total * a.eval_fraction))
    blocks = torch.tensor(list(data[:total * a.seq_len]), dtype=torch.long).view(total, a.seq_len)
    train = blocks[:total - held_out]

    torch.manual_seed(a.seed)
    loaded = time.perf_counter()
    if gpu:  # built on the GPU (PyTorch 2's device context): a CPU init of 1B weights is slow
        with torch.device("cuda"):
            model = LlamaForCausalLM(c)
        blocks = blocks.cuda()
        train = blocks[:total - held_out]
    else:
        model = LlamaForCausalLM(c)
    model.load_state_dict(read_model_dir(a.model_dir), strict=True)
    numel = sum(q.numel() for q in model.parameters())
    ddp = nn.parallel.DistributedDataParallel(model)
    if rank == 0:
        print(f"loaded {a.model_dir} ({numel} parameters) in "
              f"{time.perf_counter() - loaded:.3f} s; {len(train)} blocks of {a.seq_len} to train "
              f"on, world {world}, batch {a.batch_size} per process", flush=True)
    # The held-out blocks' mean per-token loss before training (finetune's first eval line):
    # each block once, rank r taking blocks r, r + W, ...
    with torch.no_grad():
        mine = blocks[total - held_out:][rank::world]
        sums = torch.zeros(2, dtype=torch.float64, device=blocks.device)
        for i in range(0, len(mine), a.batch_size):
            x = mine[i:i + a.batch_size]
            n = x.shape[0] * (x.shape[1] - 1)
            with autocast():
                loss = causal_lm_loss(model(x), x).item()
            sums += torch.tensor([loss * n, n], dtype=torch.float64, device=blocks.device)
        dist.all_reduce(sums)
    if rank == 0:
        loss = (sums[0] / sums[1]).item()
        print(f"eval loss {loss:.4f} perplexity {math.exp(loss):.3f}  (before training)",
              flush=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=a.lr, weight_decay=0.0,
                            **({"fused": True} if gpu else {}))
    sampler = torch.utils.data.distributed.DistributedSampler(
        train, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    step, epoch, since, losses = 0, 0, 0, []
    last = time.perf_counter()
    while step < a.steps:
        sampler.set_epoch(epoch)
        order = list(sampler)
        for i in range(0, len(order) - a.batch_size + 1, a.batch_size):
            x = train[order[i:i + a.batch_size]]
            with autocast():
                loss = causal_lm_loss(ddp(x), x)
            losses.append(loss.item())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            since += x.shape[0]
            if step % a.print_every == 0 or step == a.steps:
                now = time.perf_counter()
                tokens_per_s = since * a.seq_len * world / (now - last)
                if rank == 0:
                    print(f"step {step:4d}/{a.steps}  loss {sum(losses) / len(losses):.4f}  "
                          f"lr {a.lr:.2e}  {tokens_per_s:.0f} tokens/s  "
                          f"({a.batch_size} per process x {world})", flush=True)
                last, since, losses = now, 0, []
            if step >= a.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
