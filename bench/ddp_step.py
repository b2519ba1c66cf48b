#!/usr/bin/env python3
"""DDP step time: apps/examples/train (cxxlaunch runtime, C++) against PyTorch's Python DDP on
Gloo (bench/ddp_peer.py, Debian's python3-torch), same GPT, data shape, optimizer (AdamW; ours
is the runtime's FusedAdamW), world and batch, both launched by cxxlaunch in this run.
CXXLAUNCH_SHARED_MEMORY=off keeps our side on Gloo's TCP, as between hosts. Prints each mean
step time (first two steps excluded) and the ratio. Target (issue 4): ours >= 1.2x faster.

usage: bench/ddp_step.py [--nproc 2] [--steps 40] [--batch_size 8] [--repeat 3]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_ms(argv, env=None):
    out = subprocess.run(argv, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    m = re.search(r"mean step time ([0-9.]+) ms", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"{' '.join(argv)} failed:\n{out.stdout}\n{out.stderr}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seq_len", type=int, default=32)
    p.add_argument("--d_model", type=int, default=64)
    p.add_argument("--python", default="/usr/bin/python3")
    a = p.parse_args()
    launch = [os.path.join(ROOT, "build/bin/cxxlaunch"), "run", f"--nproc_per_node={a.nproc}"]
    model = ["--steps", str(a.steps), "--batch_size", str(a.batch_size), "--seq_len", str(a.seq_len),
             "--vocab", "64", "--d_model", str(a.d_model), "--layers", "2", "--heads", "4"]
    ours_cmd = launch + [os.path.join(ROOT, "build/bin/train"), "--model", "gpt",
                         "--schedule", "constant", "--warmup", "0",
                         "--print_every", str(a.steps)] + model
    peer_cmd = launch + [a.python, os.path.join(ROOT, "bench/ddp_peer.py")] + model
    ours, peer = [], []
    for _ in range(a.repeat):  # interleaved, so that machine noise hits both alike
        ours.append(step_ms(ours_cmd))
        peer.append(step_ms(peer_cmd))
    o, q = statistics.median(ours), statistics.median(peer)
    print(f"world {a.nproc}, GPT d_model {a.d_model} x 2 layers, batch {a.batch_size} x seq {a.seq_len} per "
          f"process, AdamW (ours: FusedAdamW), Gloo ({os.environ.get('CXXLAUNCH_SHARED_MEMORY', 'on')} "
          f"shared memory), median of {a.repeat}")
    print(f"cxxlaunch runtime (C++ DDP):  {o:8.2f} ms/step")
    print(f"PyTorch DDP (Python):         {q:8.2f} ms/step")
    print(f"speed-up: {q / o:.2f}x (target >= 1.2x: {'met' if q / o >= 1.2 else 'MISSED'})")


if __name__ == "__main__":
    main()
