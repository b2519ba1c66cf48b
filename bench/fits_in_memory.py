#!/usr/bin/env python3
"""Fits where DDP does not: every worker of apps/examples/train (GPT, world 2) runs in a cgroup
of its own whose memory limit this benchmark sets (the same cap for every mode). A GPT sized so
that DDP's model state (16 bytes a parameter) passes the cap is trained by DDP (the kernel's
OOM killer stops it) and by ZeRO-3 (fits: 8 bytes a parameter at world 2); a GPT twice as big,
too big for ZeRO-3 in memory too, is trained by ZeRO-3 with nvme offload of the optimizer state
and the fp32 master parameters (a swap directory on local disk).

Prints, per run: the result (trained, or killed at the cap), each rank's peak resident memory
(/usr/bin/time's maximum RSS, inside the cap), the model state the runtime reports, and the
step time. Needs a writable cgroup memory controller (v1 or v2; root in a container is enough).

usage: bench/fits_in_memory.py [--cap_mib 1600] [--d_model 1024] [--layers 8] [--steps 3]
                               [--swap DIR]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def memory_cgroup():
    """(directory of this process's memory cgroup, the limit file's name), or None."""
    with open("/proc/self/cgroup") as f:
        lines = [l.strip().split(":", 2) for l in f]
    for _, controllers, path in lines:  # cgroup v1
        if "memory" in controllers.split(","):
            root = "/sys/fs/cgroup/memory"
            if os.path.isdir(root):
                return os.path.join(root, path.lstrip("/")), "memory.limit_in_bytes"
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):  # cgroup v2
        controllers = os.path.join(mount, "cgroup.controllers")
        if os.path.exists(controllers) and "memory" in open(controllers).read().split():
            path = [p for _, c, p in lines if c == ""][0]
            return os.path.join(mount, path.lstrip("/")), "memory.max"
    return None


def remove_cgroup(path):
    for _ in range(100):  # the kernel may take a moment to let go of an exited task
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.1)
    print(f"could not remove cgroup {path}", file=sys.stderr)


def run(a, parent, limit_file, mode, layers, env_extra):
    """One job; returns (trained, [peak RSS MiB per rank], state text, ms per step)."""
    # Each worker puts itself into a cgroup of its own, capped, then becomes the trainer.
    wrapper = (f'd="{parent}/w$$"; mkdir "$d" && echo {a.cap_mib << 20} > "$d/{limit_file}" '
               f'&& echo $$ > "$d/cgroup.procs" && exec "$@"')
    argv = [os.path.join(ROOT, "build/bin/cxxlaunch"), "run", "--nproc_per_node=2",
            "/bin/sh", "-c", wrapper, "capped", "/usr/bin/time", "-f", "peak_rss_kib %M",
            os.path.join(ROOT, "build/bin/train"), "--model", "gpt", "--steps", str(a.steps),
            "--batch_size", "1", "--seq_len", "32", "--vocab", "64", "--d_model",
            str(a.d_model), "--layers", str(layers), "--heads", "4", "--schedule", "constant",
            "--warmup", "0", "--print_every", str(a.steps)]
    env = dict(os.environ, OMP_NUM_THREADS="1", CXXLAUNCH_STRATEGY=mode, **env_extra)
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    text = out.stdout + out.stderr
    rss = [int(k) / 1024 for k in re.findall(r"peak_rss_kib ([0-9]+)", text)]
    step = re.search(r"mean step time ([0-9.]+) ms", out.stdout)
    state = re.search(r"parameters .*total [0-9.]+ [KM]iB(; offloaded to nvme [0-9.]+ [KM]iB)?",
                      out.stdout)
    params = re.search(r"training gpt \(([0-9]+) parameters\)", out.stdout)
    for d in os.listdir(parent):  # the workers' cgroups, empty once they exited
        if d.startswith("w"):
            remove_cgroup(os.path.join(parent, d))
    return (out.returncode == 0, rss, state.group(0) if state else "-",
            float(step.group(1)) if step else None, int(params.group(1)) if params else None,
            text)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cap_mib", type=int, default=1600)
    p.add_argument("--d_model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--swap", default=None, help="nvme swap directory (default: a temporary one "
                   "under /var/tmp, on local disk)")
    a = p.parse_args()
    found = memory_cgroup()
    if found is None:
        sys.exit("fits_in_memory: no cgroup memory controller found; this benchmark needs one")
    base, limit_file = found
    parent = os.path.join(base, f"cxxlaunch-bench-{os.getpid()}")
    os.mkdir(parent)
    swap = a.swap or tempfile.mkdtemp(prefix="cxxlaunch-swap-", dir="/var/tmp")
    nvme = {"CXXLAUNCH_OFFLOAD_OPTIMIZER": "nvme", "CXXLAUNCH_OFFLOAD_PARAMS": "nvme",
            "CXXLAUNCH_OFFLOAD_OPTIMIZER_NVME_PATH": swap,
            "CXXLAUNCH_OFFLOAD_PARAM_NVME_PATH": swap}
    runs = [("ddp", a.layers, {}), ("zero3", a.layers, {}), ("zero3", 2 * a.layers, {}),
            ("zero3 + nvme", 2 * a.layers, nvme)]
    try:
        print(f"per-worker memory cap {a.cap_mib} MiB (cgroup {limit_file}), world 2, GPT "
              f"d_model {a.d_model}, batch 1 x seq 32, AdamW, {a.steps} steps")
        print(f"{'mode':14s} {'params':>8s} {'result':>14s} {'peak RSS MiB':>16s} {'ms/step':>9s}"
              "  model state (rank 0)")
        for mode, layers, extra in runs:
            trained, rss, state, ms, params, text = run(a, parent, limit_file,
                                                        mode.split()[0], layers, extra)
            result = "trained" if trained else "killed at cap" if "signal 9" in text or \
                "exit 137" in text or "SIGKILL" in text else "failed"
            peak = "/".join(f"{r:.0f}" for r in rss) or "-"
            size = f"{params / 1e6:.0f}M" if params else f"{layers} layers"
            print(f"{mode:14s} {size:>8s} {result:>14s} {peak:>16s} "
                  f"{ms if ms is not None else '-':>9}  {state}")
            if result == "failed":
                print(text[-2000:])
    finally:
        remove_cgroup(parent)
        if a.swap is None:
            shutil.rmtree(swap, ignore_errors=True)


if __name__ == "__main__":
    main()
