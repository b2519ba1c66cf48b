#!/usr/bin/env python3
"""DDP scaling on one host: apps/examples/train's 4.2M-parameter MLP (--model mlp --hidden 2048,
LibTorch's AdamW) at world 1 and world 2, and PyTorch's Python DDP on Gloo (bench/ddp_peer.py,
Debian's python3-torch) on the same MLP, batch and optimizer at world 2; all started by
`cxxlaunch run`, one thread per process, interleaved. Prints the median mean step time of each
(first two steps excluded), world 2 / world 1 (target, issue 35: <= 1.1, i.e. 90% scaling) and
PyTorch / ours at world 2 (target: >= 1.8).

The limit: two world-1 trainers run side by side, each its own job with no communication at all.
They share the memory bus and the caches as world 2's ranks do, so world 2 cannot step faster than
their mean; the script prints that limit / world 1 (what the machine costs a second process) and
world 2 / the limit (what the all-reduce and the ranks' waits for each other cost).

usage: bench/ddp_scaling.py [--steps 40] [--batch_size 32] [--hidden 2048] [--repeat 3]
           [--build build]   (another build folder: the same figures for an older build)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from ddp_step import step_ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def side_by_side_ms(argv, count=2):
    """The mean of the mean step times of `count` copies of `argv` started together."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1")) for _ in range(count)]
    times = []
    try:
        for proc in procs:
            out, err = proc.communicate()
            m = re.search(r"mean step time ([0-9.]+) ms", out)
            if proc.returncode != 0 or not m:
                sys.exit(f"{' '.join(argv)} failed:\n{out}\n{err}")
            times.append(float(m.group(1)))
    finally:  # a failed copy leaves none of the others running
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return statistics.mean(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--python", default="/usr/bin/python3")
    a = p.parse_args()
    bin_dir = os.path.join(os.path.abspath(a.build), "bin")

    def launch(nproc):
        return [os.path.join(bin_dir, "cxxlaunch"), "run", f"--nproc_per_node={nproc}"]

    model = ["--steps", str(a.steps), "--batch_size", str(a.batch_size), "--model", "mlp",
             "--hidden", str(a.hidden)]
    ours = [os.path.join(bin_dir, "train"), "--optimizer", "torch_adamw", "--schedule",
            "constant", "--warmup", "0", "--print_every", str(a.steps)] + model
    peer = [a.python, os.path.join(ROOT, "bench/ddp_peer.py")] + model
    runs = {"world1": [], "world2": [], "peer2": [], "limit": []}
    for _ in range(a.repeat):  # interleaved, so that machine noise hits all alike
        runs["world1"].append(step_ms(launch(1) + ours))
        runs["world2"].append(step_ms(launch(2) + ours))
        runs["peer2"].append(step_ms(launch(2) + peer))
        runs["limit"].append(side_by_side_ms(launch(1) + ours))
    med = {k: statistics.median(v) for k, v in runs.items()}
    scaling = med["world2"] / med["world1"]
    speedup = med["peer2"] / med["world2"]
    print(f"MLP 32-{a.hidden}-{a.hidden}-8, batch {a.batch_size} per process, LibTorch AdamW, "
          f"Gloo, {a.build}, median of {a.repeat} (runs: {runs})")
    print(f"cxxlaunch world 1:     {med['world1']:8.2f} ms/step")
    print(f"cxxlaunch world 2:     {med['world2']:8.2f} ms/step")
    print(f"PyTorch DDP world 2:   {med['peer2']:8.2f} ms/step")
    print(f"two world 1 side by side (the limit): {med['limit']:8.2f} ms/step")
    print(f"world 2 / world 1: {scaling:.3f} (target <= 1.1: {'met' if scaling <= 1.1 else 'MISSED'})")
    print(f"the limit / world 1: {med['limit'] / med['world1']:.3f} (the machine's cost of a second "
          f"process); world 2 / the limit: {med['world2'] / med['limit']:.3f} (the all-reduce's and "
          f"the waits' cost)")
    print(f"PyTorch / ours at world 2: {speedup:.2f}x (target >= 1.8: "
          f"{'met' if speedup >= 1.8 else 'MISSED'})")


if __name__ == "__main__":
    main()
