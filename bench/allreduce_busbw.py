#!/usr/bin/env python3
"""Gloo allreduce bus bandwidth: our backend (build/bin/collectives --op allreduce) against
torch.distributed.all_reduce on Gloo (bench/allreduce_peer.py, Debian's python3-torch), same
sizes, iterations and world, both under cxxlaunch in this run. Prints busbw per size and the
ratio. Target (issue 4): >= 1.0x.

usage: bench/allreduce_busbw.py [--nproc 2] [--min_bytes 1048576] [--max_bytes 67108864]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(argv):
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--min_bytes", type=int, default=1 << 20)
    p.add_argument("--max_bytes", type=int, default=64 << 20)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved; medians")
    a = p.parse_args()
    launch = [os.path.join(ROOT, "build/bin/cxxlaunch"), "run", f"--nproc_per_node={a.nproc}"]
    sizes = ["--min_bytes", str(a.min_bytes), "--max_bytes", str(a.max_bytes),
             "--iters", str(a.iters)]
    ours_runs, peer_runs = {}, {}
    for _ in range(a.repeat):  # interleaved, so that machine noise hits both alike
        ours_out = run(launch + [os.path.join(ROOT, "build/bin/collectives"), "--op",
                                 "allreduce", "--check"] + sizes)
        peer_out = run(launch + [a.python, os.path.join(ROOT, "bench/allreduce_peer.py")] + sizes)
        for m in re.finditer(r"allreduce\s+([0-9.]+)\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+0",
                             ours_out):
            ours_runs.setdefault(int(float(m.group(1))), []).append(float(m.group(2)))
        for m in re.finditer(r"\]: (\d+) ([0-9.]+)", peer_out):
            peer_runs.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    ours = {size: statistics.median(v) for size, v in ours_runs.items()}
    peer = {size: statistics.median(v) for size, v in peer_runs.items()}
    print(f"allreduce float32 on Gloo, {a.nproc} processes, {a.iters} iterations, "
          f"median of {a.repeat} runs each")
    print(f"{'bytes':>12} {'ours GB/s':>10} {'torch GB/s':>11} {'ratio':>7}")
    ratios = []
    for size in sorted(peer):
        if size in ours:
            ratios.append(ours[size] / peer[size])
            print(f"{size:>12} {ours[size]:>10.3f} {peer[size]:>11.3f} {ratios[-1]:>7.2f}")
    if not ratios:
        sys.exit("no common sizes measured")
    low = min(ratios)
    print(f"lowest ratio {low:.2f} (target >= 1.0 at every size: {'met' if low >= 1.0 else 'MISSED'})")


if __name__ == "__main__":
    main()
