#!/usr/bin/env python3
"""Launcher start-up: `cxxlaunch run --nproc_per_node=2 /bin/true` against torchrun's
`--standalone --nproc_per_node=2 --no_python /bin/true`, both measured in this run on this machine.

Prints the median wall time and the peak resident memory of each (the largest process of the
launcher's tree, as GNU time reports it), and the ratios. Targets (issue 52): >= 600x faster, at
most 10 ms and at most 10 MiB peak; the exit status is 1 when one is missed.

Debian's torchrun 1.13 cannot parse its own default `--redirects 0` under Python 3.11 (IntFlag
iteration no longer yields the zero member, so `Std.from_str("0")` returns None); the peer is
started through a two-line patch of that parser, nothing else changed.

usage: bench/launcher_startup.py [--cxxlaunch build/bin/cxxlaunch] [--runs 20] [--torch-runs 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TORCHRUN = """
import sys
import torch.distributed.elastic.multiprocessing.api as api
def from_str(cls, vm):
    if ":" in vm:
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    return cls(int(vm))
api.Std.from_str = classmethod(from_str)
from torch.distributed.run import main
sys.argv[0] = "torchrun"
main()
"""


def measure(argvs, runs):
    """Median wall seconds and max peak RSS (KiB) of each argv over `runs` runs, the argvs
    alternated run by run so that a machine whose speed drifts treats them alike."""
    # GNU time forks the measured program from its own small process: a child forked or spawned
    # from this Python process would count Python's pages from before its exec in its peak RSS.
    walls = [[] for _ in argvs]
    peaks = [0 for _ in argvs]
    with tempfile.NamedTemporaryFile() as rss, tempfile.TemporaryFile() as err:
        for _ in range(runs):
            for i, argv in enumerate(argvs):
                start = time.perf_counter()
                done = subprocess.run(["/usr/bin/time", "-o", rss.name, "-f", "%M"] + argv,
                                      stdout=subprocess.DEVNULL, stderr=err)
                walls[i].append(time.perf_counter() - start)
                if done.returncode != 0:
                    err.seek(0)
                    sys.exit(f"{argv[0]} failed:\n{err.read().decode()}")
                rss.seek(0)
                peaks[i] = max(peaks[i], int(rss.read().split()[-1]))
    return [(statistics.median(w), p) for w, p in zip(walls, peaks)]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cxxlaunch", default=os.path.join(root, "build/bin/cxxlaunch"))
    parser.add_argument("--python", default="/usr/bin/python3", help="Python with torch")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--torch-runs", type=int, default=3)
    args = parser.parse_args()

    floor = None
    launch = [args.cxxlaunch, "run", "--nproc_per_node=2", "/bin/true"]
    with tempfile.TemporaryDirectory() as tmp:
        spawner = os.path.join(tmp, "bare_spawner")
        cc = shutil.which("cc")
        if cc is not None and subprocess.run(
                [cc, "-O2", "-o", spawner, os.path.join(root, "bench/bare_spawner.c")]).returncode == 0:
            ours, floor = measure([launch, [spawner, "2", "/bin/true"]], args.runs)
        else:
            [ours] = measure([launch], args.runs)
    [peer] = measure([[args.python, "-c", TORCHRUN, "--standalone", "--nproc_per_node=2",
                       "--no_python", "/bin/true"]], args.torch_runs)
    print(f"{'launcher':<12}{'median wall':>14}{'peak RSS':>12}")
    rows = [("cxxlaunch", ours), ("torchrun", peer)] + ([("floor", floor)] if floor else [])
    for name, (wall, peak) in rows:
        print(f"{name:<12}{wall * 1000:>11.1f} ms{peak / 1024:>8.1f} MiB")
    if floor:
        print(f"floor: spawning the two workers alone takes {floor[0] * 1000:.1f} ms here, so no "
              f"launcher can be more than {peer[0] / floor[0]:.0f}x faster than torchrun on this "
              f"machine; cxxlaunch's own cost is {(ours[0] - floor[0]) * 1000:.1f} ms")
    speedup = peer[0] / ours[0]
    met = {"speed": speedup >= 600, "time": ours[0] <= 0.010, "memory": ours[1] <= 10 * 1024}
    print(f"speed-up: {speedup:.0f}x (target >= 600x: {'met' if met['speed'] else 'MISSED'}); "
          f"cxxlaunch {ours[0] * 1000:.1f} ms (target <= 10 ms: {'met' if met['time'] else 'MISSED'})")
    print(f"memory: {peer[1] / ours[1]:.1f}x less; cxxlaunch peak {ours[1] / 1024:.1f} MiB "
          f"(target <= 10 MiB: {'met' if met['memory'] else 'MISSED'})")
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
