#!/usr/bin/env python3
"""Sharded strategies against DDP in the same run: apps/examples/train (GPT) under cxxlaunch run,
world 2 by default, each mode's mean step time (first two steps excluded), its ratio to DDP's,
the model-state bytes the runtime reports (memoryReport) and each rank's peak resident memory
(/usr/bin/time's maximum RSS). Modes run interleaved, --repeat times; medians are printed.
Targets (issue 9): ZeRO-1/2 <= 1.1x DDP's step time, ZeRO-3 / FULL_SHARD <= 1.3x; ZeRO-3's
model state <= 1/N + 5% of DDP's.

usage: bench/sharding.py [--nproc 2] [--d_model 1024] [--layers 8] [--steps 4] [--repeat 1]
           [--modes ddp,zero1,...] [--build build]
  (the default GPT has ~101M parameters; --d_model 64 --layers 2 --steps 40 --batch_size 8 for a
  small, latency-bound one)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["ddp", "zero1", "zero2", "zero3", "fsdp_shard_grad_op", "fsdp_full_shard"]
UNIT = {"KiB": 1 << 10, "MiB": 1 << 20}


def run_mode(a, mode):
    bin_dir = os.path.join(os.path.abspath(a.build), "bin")
    argv = [os.path.join(bin_dir, "cxxlaunch"), "run", f"--nproc_per_node={a.nproc}",
            "/usr/bin/time", "-f", "peak_rss_kib %M", os.path.join(bin_dir, "train"),
            "--model", "gpt", "--steps", str(a.steps), "--batch_size", str(a.batch_size),
            "--seq_len", str(a.seq_len), "--vocab", "64", "--d_model", str(a.d_model),
            "--layers", str(a.layers), "--heads", "4", "--schedule", "constant", "--warmup", "0",
            "--print_every", str(a.steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", CXXLAUNCH_STRATEGY=mode,
               CXXLAUNCH_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP="Block")
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    step = re.search(r"mean step time ([0-9.]+) ms", out.stdout)
    total = re.search(r"total ([0-9.]+) (KiB|MiB)", out.stdout)
    params = re.search(r"training gpt \(([0-9]+) parameters\)", out.stdout)
    rss = [int(k) * 1024 for k in re.findall(r"peak_rss_kib ([0-9]+)", out.stdout + out.stderr)]
    if out.returncode != 0 or not step or not total or len(rss) != a.nproc:
        sys.exit(f"{mode} failed:\n{out.stdout}\n{out.stderr}")
    return float(step.group(1)), float(total.group(1)) * UNIT[total.group(2)], max(rss), \
        int(params.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--d_model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=1)
    p.add_argument("--seq_len", type=int, default=32)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="the build folder to measure (an older build: before)")
    a = p.parse_args()
    modes = a.modes.split(",")
    if "ddp" not in modes:
        modes.insert(0, "ddp")
    results = {m: [] for m in modes}
    for _ in range(a.repeat):  # interleaved, so that machine noise hits every mode alike
        for m in modes:
            results[m].append(run_mode(a, m))
    med = {m: [statistics.median(r[i] for r in results[m]) for i in range(4)] for m in modes}
    ddp_ms, ddp_state = med["ddp"][0], med["ddp"][1]
    print(f"GPT d_model {a.d_model} x {a.layers} layers ({med['ddp'][3] / 1e6:.1f}M parameters), "
          f"batch {a.batch_size} x seq {a.seq_len} per process, AdamW, world {a.nproc}, Gloo "
          f"({os.environ.get('CXXLAUNCH_SHARED_MEMORY', 'on')} shared memory), median of {a.repeat}")
    print(f"{'mode':20s} {'ms/step':>9s} {'x DDP':>6s} {'state MiB':>10s} {'x DDP':>6s} {'peak RSS MiB':>13s}")
    for m in modes:
        ms, state, rss, _ = med[m]
        print(f"{m:20s} {ms:9.1f} {ms / ddp_ms:6.2f} {state / 2**20:10.1f} {state / ddp_state:6.3f} "
              f"{rss / 2**20:13.1f}")


if __name__ == "__main__":
    main()
