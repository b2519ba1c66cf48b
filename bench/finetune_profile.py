#!/usr/bin/python3
"""Where a fine-tuning step's time goes: the speed model of bench/finetune.py (hidden 512, 8
layers, 8 heads, intermediate 1408, vocab 2048; batch 2, sequence 256, one thread, AdamW) in
bench/finetune_peer.py's plain-PyTorch Llama, under torch.profiler.

Prints the step time, the share of the step's self time spent in matrix products (aten::mm,
addmm, bmm: LibTorch's MKL/oneDNN kernels, the same ones apps/finetune calls) and the
operators that take the most. That share bounds what any runtime around the same kernels can
gain: with every other operator free, a step could be at most 1/share faster.

usage: bench/finetune_profile.py [--steps 2]
"""
import argparse
import importlib.util
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm")


def load_peer():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "finetune_peer.py")
    spec = importlib.util.spec_from_file_location("finetune_peer", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    return peer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    peer = load_peer()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    c = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=8, vocab_size=2048, rms_norm_eps=1e-5,
             rope_theta=10000.0, model_type="llama", tie_word_embeddings=False)
    model = peer.LlamaForCausalLM(c)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    ids = torch.randint(0, c["vocab_size"], (2, 256))

    def step():
        peer.causal_lm_loss(model(ids), ids).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):  # warm-up
        step()
    begin = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = (time.perf_counter() - begin) / a.steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(a.steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMMS)
    share = gemm / total
    print(f"step {seconds * 1000:.0f} ms; matrix products {share:.1%} of the step's self time; "
          f"bound on any speed-up around the same kernels: {1 / share:.2f}x")
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
