#!/usr/bin/env python3
"""Checkpoint save and load throughput against the disk's own, in the same run: the example GPT
(101M parameters by default: a 1.2 GB checkpoint with AdamW's state) at world 2 saves one
checkpoint (`--save_every`) and a second job loads it (`resume`), in each layout: sharded under
ZeRO-3 (every rank writes its shard in parallel) and DDP (the ranks share the parameters), and
full under ZeRO-3 (gathered unit by unit, rank 0 writes everything); and the peer, PyTorch's own
Python DDP saving and loading the same model and AdamW state as accelerate does under DDP
(bench/checkpoint_peer.py: rank 0 writes everything, every rank reads everything), on the
same disk in the same run, its save set against the full layout's and its load against DDP's.
The disk's speed is dd's, the fastest of 4 MiB and 64 MiB blocks, through the page cache and
past it (oflag=direct, iflag=direct, as the checkpoints are written and read), measured next
to each save and each load (the machine's disk is shared and its speed drifts by 2x within
minutes): a write of the same size with fsync just before and just after each save, and a read
of the checkpoint's own files with the page cache dropped (as before each load) just before and
just after each load. Each save and load is
compared with the mean of its two, and the table gives the medians over --repeat repetitions.
The load job then loads the checkpoint once more (train --load_again; the peer the same),
"again", as a roll-back does. Both of our loads read into memory the job already has (the
optimizer state is allocated in prepare); the first read past the page cache (O_DIRECT), so the
second finds little of the files there. (This column was once a second job's "warm" load, from
the page cache.)
Target (issue: checkpoints): at least 0.7 of the disk's sequential write and read speed.

The async column (issue 33: asynchronous saves): the same model under ZeRO-3 at world 2 trains
--async_steps steps and saves every --async_every, once with synchronous saves and once with
--checkpoint_async, one job after the other in each repetition. "blocked" is the time training
waited per save with --checkpoint_async (the snapshot, the commit, and any wait for the write at
the next save or the end) over the time a synchronous save of the same checkpoint took (target:
at most 0.1), both the medians of each job's saves after its first; the first is shown apart
(its snapshot memory is touched for the first time, and on this VM fresh memory is slow: see
## Speed in docs/checkpoints.md). "overlap" is the mean step time of the steps that began while
a checkpoint was being written in the background over that of the other steps of the same job
(target: at most 1.2). --async_only runs that column alone.

usage: bench/checkpoint_io.py [--dir DIR (on the disk to measure; default /var/tmp)]
                              [--d_model 1024] [--layers 8] [--repeat 5]
                              [--python /usr/bin/python3 (the peer's, with torch)]
                              [--async_steps 20] [--async_every 6] [--async_only]
"""
import argparse
import glob
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


PEER = ("torch ddp", "peer")


def train(a, folder, strategy, layout, phase, async_save=False):
    """One job at world 2 that saves (`phase` "save") or loads the checkpoint under `folder`;
    `phase` "steps": trains --async_steps steps, saving every --async_every."""
    launch = [os.path.join(ROOT, "build/bin/cxxlaunch"), "run", "--nproc_per_node=2"] + (
        ["--checkpoint_async"] if async_save else [])
    if (strategy, layout) == PEER:
        argv = launch + [a.python, os.path.join(ROOT, "bench/checkpoint_peer.py"), phase, folder,
                         "--d_model", str(a.d_model), "--layers", str(a.layers)]
    else:  # the second job finds the first's checkpoint and resumes from it
        argv = launch + [
            "--checkpoint_dir", folder, os.path.join(ROOT, "build/bin/train"), "--model", "gpt",
            "--steps", "1", "--warmup", "0", "--batch_size", "1", "--seq_len", "32", "--vocab",
            "64", "--d_model", str(a.d_model), "--layers", str(a.layers), "--heads", "4",
            "--save_every", "1", "--print_every", "1", "--load_again"]
        if phase == "steps":
            argv[argv.index("--steps") + 1] = str(a.async_steps)
            argv[argv.index("--save_every") + 1] = str(a.async_every)
            argv[argv.index("--print_every") + 1] = str(a.async_steps)
            argv.remove("--load_again")
    env = dict(os.environ, OMP_NUM_THREADS="1", CXXLAUNCH_STRATEGY=strategy,
               CXXLAUNCH_STATE_DICT_TYPE=layout)
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{strategy} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def rate(pattern, text):
    """(GB, GB/s) of the first line `pattern` starts: "(<GB> GB in <s> s, ...)"."""
    m = re.search(pattern + r".*\(([0-9.]+) GB in ([0-9.]+) s", text)
    return float(m.group(1)), float(m.group(1)) / float(m.group(2))


def saves(text):
    """Each save's (seconds, seconds training was blocked), from the trainer's "saved" lines."""
    return [(float(m.group(1)), float(m.group(2))) for m in re.finditer(
        r"saved .* \([0-9.]+ GB in ([0-9.]+) s, training blocked ([0-9.]+) s\)", text)]


def async_column(a, work, rep):
    """One repetition of the async column: (each synchronous save's seconds, each asynchronous
    save's blocked seconds, the overlapped steps' mean over the others', steps overlapped); the
    saves in order, the job's first one first."""
    out = {}
    for async_save in (False, True):
        folder = os.path.join(work, f"async-{async_save}-{rep}")
        out[async_save] = train(a, folder, "zero3", "sharded", "steps", async_save)
        shutil.rmtree(folder, ignore_errors=True)
    m = re.search(r"step time while a checkpoint was written: ([0-9.]+) ms \((\d+) steps\); "
                  r"without: ([0-9.]+) ms \((\d+) steps\)", out[True])
    if not m or int(m.group(4)) == 0:
        sys.exit("async column: no step time without a save in flight; raise --async_steps\n"
                 + out[True])
    return ([s for s, _ in saves(out[False])], [b for _, b in saves(out[True])],
            float(m.group(1)) / float(m.group(3)), int(m.group(2)))


# dd's block sizes: the disk's speed is the fastest way (also past the page cache). On this
# project's VMs a read with 4 MiB blocks runs 2-4x as fast as one with 64 MiB blocks (4.4-4.9
# against 1.1-1.9 GB/s, the page cache dropped), and a write with fsync the other way round
# (0.35-0.54 against 0.82-1.0 GB/s): one block size alone understates the disk for one of them.
BLOCKS = ((4 << 20, "4M"), (64 << 20, "64M"))


def write_speed(work, size_gb):
    """dd's write of `size_gb` with fsync, in GB/s: the fastest block size's, through the page
    cache and past it (oflag=direct, as the checkpoints are written)."""
    probe = os.path.join(work, "dd.bin")
    best = 0.0
    for block, name in BLOCKS:
        count = max(1, int(size_gb * 1e9 / block))
        for flags in ([], ["oflag=direct"]):
            best = max(best, dd(["if=/dev/zero", f"of={probe}", f"bs={name}", f"count={count}",
                                 "conv=fsync"] + flags))
            os.remove(probe)
    return best


def read_speed(folder):
    """dd's read of the checkpoint's files under `folder`, one after another, the page cache
    dropped first, in GB/s: the fastest block size's, through the page cache and past it
    (iflag=direct, as the loads read)."""
    files = sorted(glob.glob(os.path.join(folder, "**", "*.bin"), recursive=True))
    best = 0.0
    for _, name in BLOCKS:
        for flags in ([], ["iflag=direct"]):
            drop_caches()
            seconds, size = 0.0, 0
            for f in files:
                size += os.path.getsize(f)
                seconds += os.path.getsize(f) / 1e9 / dd(
                    [f"if={f}", "of=/dev/null", f"bs={name}"] + flags)
            best = max(best, size / 1e9 / seconds)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--d_model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--async_steps", type=int, default=20)
    p.add_argument("--async_every", type=int, default=6)
    p.add_argument("--async_only", action="store_true")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="cxxlaunch-ckpt-bench-", dir=a.dir)
    load_before = os.getloadavg()[0]
    modes = [] if a.async_only else [("zero3", "sharded"), ("ddp", "sharded"), ("zero3", "full"),
                                     PEER]
    sync_saves, async_blocked, overlaps, overlapped = [], [], [], 0
    first_sync, first_blocked = [], []
    ratios = {m: ([], [], []) for m in modes}  # each repetition's save, load and load again
    sizes, writes, reads, dropped = {}, [], [], True
    try:
        for rep in range(a.repeat):
            for strategy, layout in modes:
                folder = os.path.join(work, f"{strategy}-{layout}-{rep}")
                before = write_speed(work, 1.2)
                size, save = rate("saved", train(a, folder, strategy, layout, "save"))
                write = (before + write_speed(work, size)) / 2
                before = read_speed(folder)
                dropped = drop_caches()
                loaded = train(a, folder, strategy, layout, "load")
                _, load = rate("resumed from", loaded)
                _, again = rate("loaded again", loaded)
                read = (before + read_speed(folder)) / 2
                shutil.rmtree(folder, ignore_errors=True)
                writes.append(write)
                reads.append(read)
                sizes[(strategy, layout)] = size
                for series, value in zip(ratios[(strategy, layout)],
                                         (save / write, load / read, again / read)):
                    series.append(value)
            each_sync, each_blocked, overlap, steps = async_column(a, work, rep)
            first_sync.append(each_sync[0])
            first_blocked.append(each_blocked[0])
            sync_saves += each_sync[1:]
            async_blocked += each_blocked[1:]
            overlaps.append(overlap)
            overlapped += steps
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = lambda v: sorted(v)[len(v) // 2]
    each = lambda v: " ".join(f"{r:.3f}" for r in v)
    print(f"async (zero3 sharded, GPT d_model {a.d_model} x {a.layers} layers at world 2, "
          f"{a.async_steps} steps saving every {a.async_every}, {a.repeat} repetition(s); "
          f"1-minute load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after): "
          f"blocked per save "
          f"{median(async_blocked):.3f} s against a synchronous save's {median(sync_saves):.3f} s "
          f"= {median(async_blocked) / median(sync_saves):.3f}x (target <= 0.1); steps while "
          f"a save was written {median(overlaps):.2f}x the others' (target <= 1.2; "
          f"{overlapped} steps overlapped)\n"
          f"  synchronous saves after the first (s): {each(sync_saves)}\n"
          f"  asynchronous saves after the first, blocked (s): {each(async_blocked)}\n"
          f"  each job's first save: synchronous {each(first_sync)} s; asynchronous, blocked "
          f"{each(first_blocked)} s\n"
          f"  overlapped / other step time, each repetition: {each(overlaps)}")
    if not modes:
        return
    print(f"GPT d_model {a.d_model} x {a.layers} layers at world 2, checkpoints under {a.dir}, "
          f"{a.repeat} repetition(s); disk (dd, the fastest of 4 and 64 MiB blocks, through "
          f"the page cache and past it (oflag/iflag=direct), measured next to each save and "
          f"load, medians): write with fsync "
          f"{median(writes):.2f} GB/s, read {median(reads):.2f} GB/s"
          f"{'' if dropped else ' (page cache NOT dropped: not root)'}")
    print(f"{'strategy':14s} {'GB':>6s} {'save x disk':>12s} {'load x disk':>12s} "
          f"{'again x disk':>12s}   (medians; each repetition against its own dd)")
    for m in modes:
        saves, loads, agains = ratios[m]
        each = lambda v: " ".join(f"{r:.2f}" for r in v)
        print(f"{m[0] + ' ' + m[1]:14s} {sizes[m]:6.3f} {median(saves):12.2f} "
              f"{median(loads):12.2f} {median(agains):12.2f}   save {each(saves)}; load "
              f"{each(loads)}; again {each(agains)}")
    # The peer moves the same bytes as the full layout's save (rank 0 writes everything) and as
    # DDP's load (every rank reads everything): each repetition against the peer's in it.
    versus = lambda ours, peer: median([o / q for o, q in zip(ours, peer)])
    peer_saves, peer_loads, _ = ratios[PEER]
    print(f"against the peer (medians of each repetition's ratio): zero3 full save "
          f"{versus(ratios[('zero3', 'full')][0], peer_saves):.2f}x, ddp sharded load "
          f"{versus(ratios[('ddp', 'sharded')][1], peer_loads):.2f}x, zero3 sharded load "
          f"{versus(ratios[('zero3', 'sharded')][1], peer_loads):.2f}x")


if __name__ == "__main__":
    main()
