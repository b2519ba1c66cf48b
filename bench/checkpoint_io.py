#!/usr/bin/env python3
"""Checkpoint save and load throughput against the disk's own, in the same run: the example GPT
(101M parameters by default: a 1.2 GB checkpoint with AdamW's state) at world 2 saves one
checkpoint (`--save_every`) and a second job loads it (`resume`), in each layout: sharded under
ZeRO-3 (every rank writes its shard in parallel) and DDP (the ranks share the parameters), and
full under ZeRO-3 (gathered unit by unit, rank 0 writes everything). The disk's speed is dd's: a write of
the same size with fsync, and a read of it with the page cache dropped (as before each load),
measured before and after each save + load pair; each pair is compared with the mean of the two
(the machine's disk is shared and its speed drifts), and the table gives the medians over
--repeat repetitions.
Target (issue: checkpoints): at least 0.7 of the disk's sequential write and read speed.

usage: bench/checkpoint_io.py [--dir DIR (on the disk to measure; default /var/tmp)]
                              [--d_model 1024] [--layers 8] [--repeat 3]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def drop_caches():
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def dd(args):
    out = subprocess.run(["dd"] + args, capture_output=True, text=True, check=True).stderr
    m = re.search(r"(\d+) bytes .* copied, ([0-9.]+) s", out)
    return int(m.group(1)) / float(m.group(2)) / 1e9


def train(a, folder, strategy, layout):
    argv = [os.path.join(ROOT, "build/bin/cxxlaunch"), "run", "--nproc_per_node=2",
            "--checkpoint_dir", folder, os.path.join(ROOT, "build/bin/train"), "--model", "gpt",
            "--steps", "1", "--warmup", "0", "--batch_size", "1", "--seq_len", "32", "--vocab",
            "64", "--d_model", str(a.d_model), "--layers", str(a.layers), "--heads", "4",
            "--save_every", "1", "--print_every", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", CXXLAUNCH_STRATEGY=strategy,
               CXXLAUNCH_STATE_DICT_TYPE=layout)
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{strategy} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def rate(pattern, text):
    m = re.search(pattern + r".*\(([0-9.]+) GB in ([0-9.]+) s, ([0-9.]+) GB/s\)", text)
    return float(m.group(1)), float(m.group(3))


def disk_speed(work, size_gb):
    """dd's write (with fsync) and read (page cache dropped) of `size_gb`, in GB/s."""
    probe = os.path.join(work, "dd.bin")
    count = max(1, int(size_gb * 1e9 / (64 << 20)))
    write = dd(["if=/dev/zero", f"of={probe}", "bs=64M", f"count={count}", "conv=fsync"])
    drop_caches()
    read = dd([f"if={probe}", "of=/dev/null", "bs=64M"])
    os.remove(probe)
    return write, read


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--d_model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="cxxlaunch-ckpt-bench-", dir=a.dir)
    modes = [("zero3", "sharded"), ("ddp", "sharded"), ("zero3", "full")]
    ratios = {m: ([], []) for m in modes}  # each repetition's save and load against the disk's
    sizes, disks, dropped = {}, [], True
    try:
        for rep in range(a.repeat):
            for strategy, layout in modes:
                folder = os.path.join(work, f"{strategy}-{layout}-{rep}")
                before = disk_speed(work, 1.2)
                size, save = rate("saved", train(a, folder, strategy, layout))
                dropped = drop_caches()
                _, load = rate("resumed from", train(a, folder, strategy, layout))
                after = disk_speed(work, size)
                shutil.rmtree(folder, ignore_errors=True)
                write, read = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
                disks.append((write, read))
                sizes[(strategy, layout)] = size
                ratios[(strategy, layout)][0].append(save / write)
                ratios[(strategy, layout)][1].append(load / read)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = lambda v: sorted(v)[len(v) // 2]
    print(f"GPT d_model {a.d_model} x {a.layers} layers at world 2, checkpoints under {a.dir}, "
          f"{a.repeat} repetition(s); disk (dd, 64 MiB blocks, measured before and after each "
          f"save + load, medians): write with fsync {median([d[0] for d in disks]):.2f} GB/s, "
          f"read {median([d[1] for d in disks]):.2f} GB/s"
          f"{'' if dropped else ' (page cache NOT dropped: not root)'}")
    print(f"{'strategy':14s} {'GB':>6s} {'save x disk':>12s} {'load x disk':>12s}   "
          "(median; each repetition against its own dd)")
    for m in modes:
        saves, loads = ratios[m]
        print(f"{m[0] + ' ' + m[1]:14s} {sizes[m]:6.3f} {median(saves):12.2f} {median(loads):12.2f}"
              f"   save {' '.join(f'{r:.2f}' for r in saves)}; load "
              f"{' '.join(f'{r:.2f}' for r in loads)}")


if __name__ == "__main__":
    main()
