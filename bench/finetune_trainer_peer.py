#!/usr/bin/python3
"""The GPU check's peer of apps/finetune at the TinyLlama shape: what the documents' users run,
transformers' Trainer (with accelerate) on the same HF folder, the same byte tokens of the same
text cut into the same --seq_len blocks (the last --eval_fraction held out), the same batch, bf16
(Trainer's: fp32 weights, autocast), attn_implementation="sdpa", fused AdamW, a constant lr,
gradient clipping at 1.0, and gradient checkpointing when ours has it. Where accelerate is
missing (Trainer needs it), transformers' LlamaForCausalLM with sdpa in a plain loop under
bf16 autocast with fused AdamW stands in; the first line says which ran.

Prints "peer: ...", a line per --print_every steps "step n/N  loss L  T tokens/s" (tokens of the
interval over its wall time, synchronised with the GPU, as finetune counts them) and at the end
"GPU peak X MiB" (torch.cuda.max_memory_allocated), which scripts/gpu-check.sh reads.

usage: bench/finetune_trainer_peer.py --model_dir DIR --data FILE --seq_len 2048
           --batch_size 8 --steps 15 [--print_every 5] [--lr 5e-5] [--eval_fraction 0.02]
           [--gradient_checkpointing]
"""
import argparse
import math
import tempfile
import time

import torch
import transformers


def blocks_of(path, seq_len, eval_fraction):
    data = torch.tensor(list(open(path, "rb").read()), dtype=torch.long)
    blocks = data[: data.numel() // seq_len * seq_len].view(-1, seq_len)
    held = math.ceil(blocks.size(0) * eval_fraction) if eval_fraction > 0 else 0
    return blocks[: blocks.size(0) - held]


class Meter:
    """Tokens/s over each --print_every steps, the GPU synchronised at each end."""

    def __init__(self, a):
        self.a = a
        self.start = None
        self.losses = []

    def step(self, step, loss):
        torch.cuda.synchronize()
        now = time.perf_counter()
        if self.start is None:  # the first step (warm-up, allocations) is not timed
            self.start = now
            return
        self.losses.append(loss)
        if step % self.a.print_every == 0 or step == self.a.steps:
            tokens = len(self.losses) * self.a.batch_size * self.a.seq_len
            known = [v for v in self.losses if not math.isnan(v)]
            loss_text = "  loss %.4f" % (sum(known) / len(known)) if known else ""
            print("step %4d/%d%s  %.0f tokens/s" % (step, self.a.steps, loss_text,
                                                    tokens / max(now - self.start, 1e-9)),
                  flush=True)
            self.start, self.losses = now, []


def with_trainer(a, model, train):
    class Dataset(torch.utils.data.Dataset):
        def __len__(self):
            return train.size(0)

        def __getitem__(self, i):
            return {"input_ids": train[i], "labels": train[i]}

    meter = Meter(a)

    class Timer(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            meter.step(state.global_step, float("nan"))

        def on_log(self, args, state, control, logs=None, **kwargs):
            pass

    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=a.batch_size, max_steps=a.steps,
            learning_rate=a.lr, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
            bf16=True, optim="adamw_torch_fused", gradient_checkpointing=a.gradient_checkpointing,
            logging_steps=a.steps, save_strategy="no", report_to=[], disable_tqdm=True,
            remove_unused_columns=False, dataloader_num_workers=0, seed=1234)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Dataset(),
                                       callbacks=[Timer()])
        result = trainer.train()
        print("train loss %.4f" % result.training_loss)


def with_loop(a, model, train):
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0, fused=True)
    meter = Meter(a)
    order = torch.randperm(train.size(0), generator=torch.Generator().manual_seed(1234))
    for step in range(1, a.steps + 1):
        first = ((step - 1) * a.batch_size) % max(train.size(0) - a.batch_size + 1, 1)
        batch = train[order[first : first + a.batch_size]].cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        meter.step(step, loss.item())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--print_every", type=int, default=5)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--eval_fraction", type=float, default=0.02)
    p.add_argument("--gradient_checkpointing", action="store_true")
    a = p.parse_args()
    try:
        import accelerate  # noqa: F401  (Trainer needs it)

        trainer = True
    except ImportError:
        trainer = False
    print("peer: " + ("transformers %s Trainer + accelerate" % transformers.__version__ if trainer
                      else "transformers %s LlamaForCausalLM in a plain bf16 loop (no accelerate), "
                      "fused AdamW" % transformers.__version__), flush=True)
    torch.manual_seed(1234)
    model = transformers.LlamaForCausalLM.from_pretrained(
        a.model_dir, torch_dtype=torch.float32, attn_implementation="sdpa").cuda()
    train = blocks_of(a.data, a.seq_len, a.eval_fraction)
    torch.cuda.reset_peak_memory_stats()
    (with_trainer if trainer else with_loop)(a, model, train)
    print("GPU peak %.1f MiB" % (torch.cuda.max_memory_allocated() / 2**20), flush=True)


if __name__ == "__main__":
    main()
