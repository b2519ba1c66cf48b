"""The peer of bench/checkpoint_io.py's jobs: the same GPT and AdamW in PyTorch's own Python DDP,
saving and loading a checkpoint the way accelerate does under DDP. `save` trains one step, then
rank 0 writes the model's and the optimizer's state dicts (torch.save, fsynced as ours are); `load`
builds the job afresh and every rank reads both back (torch.load, load_state_dict), as accelerate's
load_state does, then reads them once more into the job it made. Prints the same "saved DIR
(X GB in T s, R GB/s)", "resumed from DIR (...)" and "loaded again DIR (...)" lines as
apps/examples/train.cc with --load_again, timed on rank 0 from a barrier before to a barrier
after.
Run under any launcher that sets torchrun's environment (bench/checkpoint_io.py uses cxxlaunch run).

usage: checkpoint_peer.py save|load DIR [--d_model 1024] [--layers 8]
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ddp_peer import Gpt

VOCAB, SEQ_LEN, HEADS = 64, 32, 4  # bench/checkpoint_io.py's train command


def save(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def rate(folder, start):
    seconds = time.perf_counter() - start
    gb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 1e9
    return f"({gb:.3f} GB in {seconds:.3f} s, {gb / seconds:.2f} GB/s)"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save", "load"])
    p.add_argument("dir")
    p.add_argument("--d_model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)
    model = nn.parallel.DistributedDataParallel(Gpt(VOCAB, SEQ_LEN, a.d_model, a.layers, HEADS))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    model_file, opt_file = (os.path.join(a.dir, n) for n in ("pytorch_model.bin", "optimizer.bin"))
    if a.mode == "save":
        x = torch.randint(VOCAB, (1, SEQ_LEN))
        F.cross_entropy(model(x[:, :-1]).reshape(-1, VOCAB), x[:, 1:].reshape(-1)).backward()
        opt.step()  # AdamW's state exists from its first step on
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            os.makedirs(a.dir, exist_ok=True)
            save(model.module.state_dict(), model_file)
            save(opt.state_dict(), opt_file)
        dist.barrier()
        if rank == 0:
            print(f"saved {a.dir} {rate(a.dir, start)}", flush=True)
    else:  # a fresh job's load, then one into the state the first made (as train --load_again)
        for line in ("resumed from", "loaded again"):
            dist.barrier()
            start = time.perf_counter()
            model.module.load_state_dict(torch.load(model_file, map_location="cpu"))
            opt.load_state_dict(torch.load(opt_file, map_location="cpu"))
            dist.barrier()
            if rank == 0:
                print(f"{line} {a.dir} {rate(a.dir, start)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
