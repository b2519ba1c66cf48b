#!/usr/bin/env python3
"""finetune, measured (issue 31, item 7): speed against plain PyTorch, peak memory per rank of
building and loading a ~330M Llama under ZeRO-3 with and without zero3_init_flag, and the seed's
headline on CPU (a per-worker memory cap that the fp32 build alone passes: trains with the flag,
killed at the cap without it). All runs at world 2 on CPUs, launched by `cxxlaunch run`; the
models are random HF-layout folders written by llama_init (cached in --work_dir), the data the
repository's docs/*.md as byte tokens. Five parts, each selectable (default all):

speed   apps/finetune under DDP (no config) against bench/finetune_peer.py (the same
        Llama in Python: PyTorch DDP on Gloo, same folder, blocks, batch per process, seq_len,
        AdamW with weight decay 0 and a constant lr, one thread per worker), run alternately
        ours/peer --repeat times. tokens/s of the --steps after --warmup steps (finetune's own
        `step ... tokens/s` lines, every rank's tokens over wall time; the peer prints the
        same); medians and the ratio ours/peer. Target (issue 31): >= 1.3x. With
        --mixed_precision bf16 both sides compute in bf16 (ours: `cxxlaunch run
        --mixed_precision bf16`, bf16 compute copies of the fp32 masters; the peer:
        torch.autocast on CPU, PyTorch's own mixed precision).
memory  peak RSS of each rank (/usr/bin/time's maximum RSS around the worker) of
        `finetune --steps 0` (build, prepare, load, one eval forward) of a 24-layer ~336M Llama
        (bf16 safetensors) under ZeRO-3 with nvme offload of the optimizer state and the
        parameters, with --zero3_init_flag true and false. Bar (issue 31): with the flag at most
        fp32/2 + 400 MiB; without it about the whole fp32 model on every rank.
cap     each worker in a cgroup of its own with a memory cap below what the fp32 build alone
        takes (default: 95% of the fp32 model), then `finetune --steps 3` of the same model
        with --cap_layers layers (default 48, 638M parameters), ZeRO-3 + nvme offload of both: with the flag it must train, without
        it it must be killed at the cap before the `loaded` line (while building). Needs a
        writable cgroup memory controller (v1 or v2; root in a container is enough), as
        bench/fits_in_memory.py.
lora    the speed part's model and command, full fine-tune against LoRA (--lora_r 16
        --lora_target_modules all-linear: PEFT's all-linear), alternating --repeat times in the
        same run: tokens/s (medians, and the ratio LoRA/full) and the model state per rank of
        finetune's `loaded` line (issue 50 item 4: the backward computes no weight gradient for
        the frozen matrices, and the optimizer holds the adapters alone).
lora_cap the cap part's model (606.7M parameters with the default 48 layers) and cap, three runs
        under it: the full fine-tune under ZeRO-3 without offload (it must be killed at the cap),
        with nvme offload of both (it trains: the full fine-tune needs nvme at this cap), and LoRA
        r 16 all-linear with a bf16 base under ZeRO-3 without offload (it must train; issue 50
        item 4: the frozen base held in 16 bits with no master, gradient or optimizer state).

No timed assertions: prints the figures, the bars and whether each is met.

usage: bench/finetune.py [--parts speed,memory,cap,lora,lora_cap] [--bin_dir build/bin] [--work_dir DIR]
                         [--repeat 3] [--steps 20] [--warmup 5] [--cap_mib N]
                         [--mixed_precision no|bf16]
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fits_in_memory import memory_cgroup, remove_cgroup  # noqa: E402  (the same cgroup handling)
MIB = 1 << 20
LORA = ["--lora_r", "16", "--lora_target_modules", "all-linear"]  # PEFT's all-linear


def log(*args):
    print(*args, flush=True)


def run(argv, env_extra=None, timeout=1800):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    return out.returncode, out.stdout + out.stderr, time.perf_counter() - start


def llama_params(c):
    h, i, v, layers = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["layers"]
    hd = h // c["heads"]
    kv = c.get("kv_heads", c["heads"]) * hd
    per_layer = h * h * 2 + 2 * h * kv + 3 * h * i + 2 * h
    return layers * per_layer + 2 * v * h + h  # untied embed_tokens and lm_head, model.norm


def make_model(a, work, name, c, dtype):
    """An HF folder written by llama_init (once: kept in work/models/NAME-...)."""
    key = f"{name}-h{c['hidden_size']}-l{c['layers']}-a{c['heads']}-i{c['intermediate_size']}" \
          f"-v{c['vocab_size']}-{dtype}"
    folder = os.path.join(work, "models", key)
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    argv = [os.path.join(a.bin_dir, "llama_init"), "--output_dir", partial,
            "--hidden_size", str(c["hidden_size"]), "--intermediate_size",
            str(c["intermediate_size"]), "--num_hidden_layers", str(c["layers"]),
            "--num_attention_heads", str(c["heads"]), "--vocab_size", str(c["vocab_size"]),
            "--dtype", dtype, "--seed", "1234"]
    rc, text, s = run(argv)
    if rc != 0:
        sys.exit(f"llama_init failed ({rc}):\n{text}")
    os.rename(partial, folder)
    log(f"wrote {folder} in {s:.1f} s")
    return folder


def make_data(path, size):
    """size bytes of text: the repository's docs/*.md, repeated."""
    text = b"".join(open(f, "rb").read() for f in sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                                  "*.md"))))
    if not text:
        text = open(os.path.abspath(__file__), "rb").read()
    with open(path, "wb") as f:
        f.write((text * (size // len(text) + 1))[:size])
    return path


def tokens_per_s(text, warmup):
    """tokens/s over the steps after `warmup` (the intervals of the `step n/N` lines)."""
    lines = [(int(m.group(1)), int(m.group(2)), float(m.group(3))) for m in re.finditer(
        r"step +([0-9]+)/([0-9]+) .*? ([0-9.]+) tokens/s", text)]
    timed, seconds_per_token, last = [], 0.0, 0
    for step, _, rate in lines:
        if step > warmup:
            # equal tokens per step: total tokens / total time over the timed intervals
            timed.append(step - last)
            seconds_per_token += (step - last) / rate
        last = step
    return sum(timed) / seconds_per_token if timed else None


def speed_setup(a, work, data):
    """The speed part's model, its finetune arguments and the launch (the lora part's too)."""
    c = dict(hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
             layers=a.layers, heads=a.heads, vocab_size=a.vocab_size)
    model = make_model(a, work, "speed", c, "f32")
    steps = a.warmup + a.steps
    common = ["--model_dir", model, "--data", data, "--steps", str(steps), "--seq_len",
              str(a.seq_len), "--batch_size", str(a.batch_size), "--per_device_eval_batch_size",
              str(a.batch_size), "--lr", "1e-4",
              "--eval_fraction", "0.01", "--print_every", str(a.warmup),
              # The peer's recipe: a constant lr, no clipping, no checkpoints.
              "--lr_scheduler_type", "constant", "--max_grad_norm", "0", "--save_steps", "0"]
    launch = [os.path.join(a.bin_dir, "cxxlaunch"), "run", "--nproc_per_node", "2", "--cpu",
              "--mixed_precision", a.mixed_precision]
    return c, common, launch


def part_lora(a, work, scratch, data):
    c, common, launch = speed_setup(a, work, data)
    lora = LORA
    log(f"lora: the speed model ({llama_params(c) / 1e6:.1f}M parameters), full fine-tune "
        f"against LoRA r 16 all-linear, mixed precision {a.mixed_precision}, {a.repeat} rounds")
    rates, state = {"full": [], "lora": []}, {}
    for r in range(a.repeat):
        for who, extra in (("full", []), ("lora", lora)):
            out = os.path.join(scratch, f"lora-out-{who}-{r}")
            rc, text, s = run(launch + [os.path.join(a.bin_dir, "finetune")] + common + extra +
                              ["--output_dir", out])
            shutil.rmtree(out, ignore_errors=True)
            rate = tokens_per_s(text, a.warmup)
            loaded = re.search(r"loaded .*?; (parameters .*)", text)
            if rc != 0 or rate is None or not loaded:
                sys.exit(f"finetune ({who}) failed ({rc}):\n{text[-4000:]}")
            rates[who].append(rate)
            state[who] = loaded.group(1).strip()
            log(f"  round {r + 1}: {who} {rate:8.1f} tokens/s ({s:.0f} s wall)")
    f, l = statistics.median(rates["full"]), statistics.median(rates["lora"])
    return {"full": f, "lora": l, "ratio": l / f, "state": state}


def part_speed(a, work, scratch, data):
    c, common, launch = speed_setup(a, work, data)
    log(f"speed: Llama {llama_params(c) / 1e6:.1f}M parameters (hidden {a.hidden_size}, "
        f"{a.layers} layers, {a.heads} heads, intermediate {a.intermediate_size}, vocab "
        f"{a.vocab_size}, fp32, mixed precision {a.mixed_precision}), world 2, batch {a.batch_size} x seq {a.seq_len} per process, "
        f"{a.steps} timed steps after {a.warmup}, {a.repeat} rounds ours/peer alternating")
    ours, peer, evals = [], [], {}
    first_eval = lambda text: (re.findall(r"eval loss ([0-9.]+)", text) or [None])[0]
    peer_argv = launch + [a.python, os.path.join(ROOT, "bench", "finetune_peer.py")] + common + [
        "--mixed_precision", a.mixed_precision]
    for r in range(a.repeat):
        out = os.path.join(scratch, f"speed-out-{r}")
        ours_argv = launch + [os.path.join(a.bin_dir, "finetune")] + common + ["--output_dir", out]
        for who, argv, rates in (("ours", ours_argv, ours), ("peer", peer_argv, peer)):
            rc, text, s = run(argv)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(out + ".partial", ignore_errors=True)
            rate = tokens_per_s(text, a.warmup)
            if rc != 0 or rate is None:
                sys.exit(f"{' '.join(argv)} failed ({rc}):\n{text[-4000:]}")
            rates.append(rate)
            evals[who] = first_eval(text)
            log(f"  round {r + 1}: {who} {rate:8.1f} tokens/s ({s:.0f} s wall, load average "
                f"{os.getloadavg()[0]:.1f})")
    o, q = statistics.median(ours), statistics.median(peer)
    log(f"  eval loss before training (the same model and blocks): ours {evals['ours']}, "
        f"peer {evals['peer']}")
    return {"evals": evals, "ours": ours, "peer": peer, "ours_median": o, "peer_median": q, "ratio": o / q,
            "params": llama_params(c)}


def oom_kills(cgroup):
    """OOM kills the kernel counted in a worker's cgroup (v1 memory.oom_control, v2 events)."""
    for name, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
        try:
            for line in open(os.path.join(cgroup, name)):
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        except OSError:
            pass
    return None


def zero3_run(a, model, data, scratch, init_flag, steps, cap=None, seq_len=64, batch_size=1,
              offload=True, extra=(), mixed_precision="no"):
    """One finetune job at world 2 under ZeRO-3 (by default with nvme offload of the optimizer
    state and the parameters; `extra` finetune flags, e.g. LoRA's); a dict of what it did."""
    swap = tempfile.mkdtemp(prefix="swap-", dir=scratch)
    out = os.path.join(scratch, "cap-out")
    argv = [os.path.join(a.bin_dir, "cxxlaunch"), "run", "--nproc_per_node", "2", "--cpu",
            "--use_deepspeed", "--zero_stage", "3", "--mixed_precision", mixed_precision,
            "--zero3_init_flag", "true" if init_flag else "false"]
    if offload:
        argv += ["--offload_optimizer_device", "nvme", "--offload_param_device", "nvme",
                 "--offload_optimizer_nvme_path", swap, "--offload_param_nvme_path", swap]
    if cap is not None:
        base, limit_file = cap[0], cap[1]
        # Each worker puts itself into a cgroup of its own, capped, then becomes the trainer.
        argv += ["/bin/sh", "-c",
                 f'd="{base}/w$$"; mkdir "$d" && echo {cap[2] * MIB} > "$d/{limit_file}" '
                 f'&& echo $$ > "$d/cgroup.procs" && exec "$@"', "capped"]
    argv += ["/usr/bin/time", "-f", "peak_rss_kib %M", os.path.join(a.bin_dir, "finetune"),
             "--model_dir", model, "--data", data, "--steps", str(steps), "--seq_len",
             str(seq_len), "--batch_size", str(batch_size), "--per_device_eval_batch_size",
             str(batch_size), "--lr", "1e-5",
             "--eval_fraction", "0.05", "--print_every", "1", "--lr_scheduler_type", "constant",
             "--max_grad_norm", "0", "--save_steps", "0"] + list(extra)
    if steps > 0:
        argv += ["--output_dir", out]
    rc, text, s = run(argv)
    kills = []
    if cap is not None:
        for d in sorted(os.listdir(cap[0])):  # the workers' cgroups, empty once they exited
            if d.startswith("w"):
                kills.append(oom_kills(os.path.join(cap[0], d)))
                remove_cgroup(os.path.join(cap[0], d))
    shutil.rmtree(swap, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out + ".partial", ignore_errors=True)
    loaded = re.search(r"loaded .*", text)
    killed = (any(k for k in kills if k) or "signal 9" in text or "SIGKILL" in text
              or "exit 137" in text or "Killed" in text)
    return {"rc": rc, "seconds": s, "text": text, "argv": argv,
            "rss_mib": [int(k) / 1024 for k in re.findall(r"peak_rss_kib ([0-9]+)", text)],
            "loaded": loaded.group(0) if loaded else None,
            "steps": re.findall(r"step +[0-9]+/[0-9]+ .*", text),
            "evals": re.findall(r"eval loss .*", text), "killed": killed, "oom_kills": kills}


def part_memory(a, model, data, scratch, fp32_mib):
    log(f"memory: finetune --steps 0 at world 2, ZeRO-3, nvme offload of optimizer state and "
        f"parameters; fp32 model {fp32_mib:.0f} MiB, bar with the flag "
        f"{fp32_mib / 2 + 400:.0f} MiB")
    results = {}
    for flag in (True, False):
        r = zero3_run(a, model, data, scratch, flag, 0)
        if r["rc"] != 0:
            sys.exit(f"{' '.join(r['argv'])} failed ({r['rc']}):\n{r['text'][-4000:]}")
        results[flag] = r
        log(f"  zero3_init_flag {str(flag).lower():5s}: peak RSS per rank "
            f"{' / '.join(f'{m:.0f}' for m in r['rss_mib'])} MiB ({r['seconds']:.0f} s wall)")
        log(f"    {r['loaded']}")
    return results


def part_cap(a, model, data, scratch, cap_mib, runs, what):
    """`runs`: {name: zero3_run keyword arguments}, each run under the same per-worker cap."""
    cgroup = memory_cgroup()
    if cgroup is None:
        log(f"{what}: no writable cgroup memory controller found: skipped")
        return None
    base, limit_file = cgroup
    parent = os.path.join(base, f"cxxlaunch-bench-finetune-{os.getpid()}")
    os.mkdir(parent)
    log(f"{what}: per-worker memory cap {cap_mib} MiB (cgroup {limit_file}), world 2, ZeRO-3, "
        f"finetune --steps {a.cap_steps}, batch 1 x seq {a.cap_seq_len}")
    results = {}
    try:
        for name, kwargs in runs.items():
            r = zero3_run(a, model, data, scratch, kwargs.pop("init_flag", True), a.cap_steps,
                          cap=(parent, limit_file, cap_mib), seq_len=a.cap_seq_len, **kwargs)
            trained = r["rc"] == 0 and len(r["steps"]) >= a.cap_steps
            r["outcome"] = ("trained" if trained else
                            ("killed at the cap " + ("before" if r["loaded"] is None else "after")
                             + " the `loaded` line") if r["killed"] else f"failed (rc {r['rc']})")
            results[name] = r
            log(f"  {name}: {r['outcome']}; peak RSS per rank "
                f"{' / '.join(f'{m:.0f}' for m in r['rss_mib']) or '-'} MiB; OOM kills per "
                f"worker cgroup {r['oom_kills']} ({r['seconds']:.0f} s wall)")
            for line in ([r["loaded"]] if r["loaded"] else []) + r["steps"] + r["evals"]:
                log(f"    {line}")
            if r["outcome"].startswith("failed"):
                log(r["text"][-3000:])
    finally:
        remove_cgroup(parent)
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="speed,memory,cap,lora,lora_cap")
    p.add_argument("--bin_dir", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--python", default="/usr/bin/python3", help="a python3 with torch")
    p.add_argument("--work_dir", default="/var/tmp/cxxlaunch-bench-finetune",
                   help="on local disk (nvme swap files go here): the models are kept here "
                   "between runs, everything else is removed")
    # speed
    p.add_argument("--hidden_size", type=int, default=512)
    p.add_argument("--intermediate_size", type=int, default=1408)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab_size", type=int, default=2048)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--mixed_precision", choices=["no", "bf16"], default="no",
                   help="speed: both sides in bf16 (ours: the runtime's compute copies; the "
                        "peer: torch.autocast)")
    # memory and cap
    p.add_argument("--mem_hidden_size", type=int, default=1024)
    p.add_argument("--mem_intermediate_size", type=int, default=2304)
    p.add_argument("--mem_layers", type=int, default=24)
    p.add_argument("--mem_heads", type=int, default=16)
    p.add_argument("--mem_vocab_size", type=int, default=32000)
    p.add_argument("--cap_layers", type=int, default=48,
                   help="the cap part's model: the memory model with this many layers")
    p.add_argument("--cap_mib", type=int, default=None,
                   help="default: 95%% of the cap model's fp32 size")
    p.add_argument("--cap_steps", type=int, default=3)
    p.add_argument("--cap_seq_len", type=int, default=64)
    a = p.parse_args()
    parts = set(a.parts.split(","))
    known = {"speed", "memory", "cap", "lora", "lora_cap"}
    if parts - known:
        sys.exit(f"--parts: unknown {sorted(parts - known)}")
    os.makedirs(a.work_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="run-", dir=a.work_dir)
    started = time.perf_counter()
    try:
        log(f"machine: {os.cpu_count()} CPUs, "
            f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.1f} GiB; "
            f"binaries {a.bin_dir}; work dir {a.work_dir}")
        speed = memory = cap = lora = lora_cap = None
        speed_data = make_data(os.path.join(scratch, "speed.txt"), 128 << 10)
        if "speed" in parts:
            speed = part_speed(a, a.work_dir, scratch, speed_data)
        if "lora" in parts:
            lora = part_lora(a, a.work_dir, scratch, speed_data)
        if parts & {"memory", "cap", "lora_cap"}:
            c = dict(hidden_size=a.mem_hidden_size, intermediate_size=a.mem_intermediate_size,
                     layers=a.mem_layers, heads=a.mem_heads, vocab_size=a.mem_vocab_size)
            model = make_model(a, a.work_dir, "memory", c, "bf16")
            numel = llama_params(c)
            fp32_mib = numel * 4 / MIB
            data = make_data(os.path.join(scratch, "small.txt"), 20 * a.cap_seq_len)
            log(f"memory/cap model: {numel / 1e6:.1f}M parameters (hidden {a.mem_hidden_size}, "
                f"{a.mem_layers} layers, {a.mem_heads} heads, intermediate "
                f"{a.mem_intermediate_size}, vocab {a.mem_vocab_size}), bf16 on disk "
                f"{numel * 2 / MIB:.0f} MiB, fp32 {fp32_mib:.0f} MiB")
            if "memory" in parts:
                memory = part_memory(a, model, data, scratch, fp32_mib)
            if parts & {"cap", "lora_cap"}:
                # Deeper than the memory model: what stays in memory while training streams
                # the layers from nvme is set by one layer and the vocabulary, not by the depth,
                # so the cap is below the fp32 model by the layers' whole size.
                c_cap = dict(c, layers=a.cap_layers)
                cap_model = make_model(a, a.work_dir, "cap", c_cap, "bf16")
                cap_fp32_mib = llama_params(c_cap) * 4 / MIB
                log(f"cap model: the same with {a.cap_layers} layers, "
                    f"{llama_params(c_cap) / 1e6:.1f}M parameters, fp32 {cap_fp32_mib:.0f} MiB")
                cap_mib = a.cap_mib or int(cap_fp32_mib * 0.95)
                if "cap" in parts:
                    cap = part_cap(a, cap_model, data, scratch, cap_mib, {
                        "with the flag": dict(init_flag=True),
                        "without the flag": dict(init_flag=False)}, "cap")
                if "lora_cap" in parts:
                    lora_cap = part_cap(a, cap_model, data, scratch, cap_mib, {
                        "full, no offload": dict(offload=False),
                        "full, nvme offload of both": dict(),
                        "LoRA r 16 all-linear, bf16, no offload": dict(
                            offload=False, mixed_precision="bf16", extra=LORA)}, "lora_cap")

        log(f"\nsummary ({time.perf_counter() - started:.0f} s in all)")
        if speed:
            log(f"speed: ours {speed['ours_median']:.0f} tokens/s "
                f"({', '.join(f'{x:.0f}' for x in speed['ours'])}), PyTorch DDP "
                f"{speed['peer_median']:.0f} tokens/s "
                f"({', '.join(f'{x:.0f}' for x in speed['peer'])}): {speed['ratio']:.2f}x "
                f"(target >= 1.3x: {'met' if speed['ratio'] >= 1.3 else 'MISSED'})")
        if memory:
            bar = fp32_mib / 2 + 400
            w, wo = max(memory[True]["rss_mib"]), max(memory[False]["rss_mib"])
            log(f"memory: fp32 model {fp32_mib:.0f} MiB; peak RSS per rank with the flag "
                f"{' / '.join(f'{m:.0f}' for m in memory[True]['rss_mib'])} MiB (bar <= "
                f"{bar:.0f}: {'met' if w <= bar else 'MISSED'}), without "
                f"{' / '.join(f'{m:.0f}' for m in memory[False]['rss_mib'])} MiB "
                f"({wo / fp32_mib:.2f}x the fp32 model)")
        if cap:
            log(f"cap {cap_mib} MiB: with the flag {cap['with the flag']['outcome']}; without "
                f"{cap['without the flag']['outcome']}")
        if lora_cap:
            log(f"lora_cap {cap_mib} MiB: " + "; ".join(
                f"{name} {r['outcome']} (peak RSS {max(r['rss_mib'] or [0]):.0f} MiB)"
                for name, r in lora_cap.items()))
        if lora:
            log(f"lora: full {lora['full']:.0f} tokens/s, LoRA r 16 all-linear "
                f"{lora['lora']:.0f} tokens/s: {lora['ratio']:.2f}x; model state per rank: "
                f"full {lora['state']['full']}; LoRA {lora['state']['lora']}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
