#!/usr/bin/env python3
"""Gloo allreduce bus bandwidth: our backend (build/bin/collectives --op allreduce) against
torch.distributed.all_reduce on Gloo (bench/allreduce_peer.py, Debian's python3-torch), same
sizes, iterations and world, both under cxxlaunch in this run. Prints busbw per size and the
ratio (target, issue 4: >= 1.0x), and the largest size's busbw against one core's memcpy of that
many bytes in the same run, what the memory allows (target, issue 35: >= 0.4x). Ours registers
its buffers once (Backend::sharedBuffer): the ranks reduce each other's buffers in place.

usage: bench/allreduce_busbw.py [--nproc 2] [--min_bytes 1048576] [--max_bytes 67108864]
           [--build build]
"""
import argparse
import ctypes
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


def memcpy_gbs(size, repeat=20):
    """One core's memcpy (glibc's, through ctypes) of `size` bytes, best of `repeat`, in GB/s."""
    import time
    src, dst = ctypes.create_string_buffer(size), ctypes.create_string_buffer(size)
    ctypes.memmove(dst, src, size)  # fault both in first
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        ctypes.memmove(dst, src, size)
        best = min(best, time.perf_counter() - start)
    return size / best / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--min_bytes", type=int, default=1 << 20)
    p.add_argument("--max_bytes", type=int, default=64 << 20)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--repeat", type=int, default=3, help="runs of each, interleaved; medians")
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="the build folder whose collectives to measure (an older build: before)")
    a = p.parse_args()
    bin_dir = os.path.join(os.path.abspath(a.build), "bin")
    launch = [os.path.join(bin_dir, "cxxlaunch"), "run", f"--nproc_per_node={a.nproc}"]
    sizes = ["--min_bytes", str(a.min_bytes), "--max_bytes", str(a.max_bytes),
             "--iters", str(a.iters)]
    ours_runs, peer_runs, copy_runs = {}, {}, []
    for _ in range(a.repeat):  # interleaved, so that machine noise hits both alike
        ours_out = run(launch + [os.path.join(bin_dir, "collectives"), "--op",
                                 "allreduce", "--check"] + sizes)
        peer_out = run(launch + [a.python, os.path.join(ROOT, "bench/allreduce_peer.py")] + sizes)
        for m in re.finditer(r"allreduce\s+([0-9.]+)\s+[0-9.]+\s+[0-9.]+\s+([0-9.]+)\s+0",
                             ours_out):
            ours_runs.setdefault(int(float(m.group(1))), []).append(float(m.group(2)))
        copy_runs.append(memcpy_gbs(a.max_bytes))
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
    largest = max(ours)
    copy = statistics.median(copy_runs)
    print(f"one core's memcpy of {a.max_bytes} bytes: {copy:.2f} GB/s (median of {a.repeat}); "
          f"allreduce busbw at {largest} bytes / memcpy: {ours[largest] / copy:.2f} "
          f"(target >= 0.4: {'met' if ours[largest] / copy >= 0.4 else 'MISSED'})")


if __name__ == "__main__":
    main()
