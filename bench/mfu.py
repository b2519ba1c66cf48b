#!/usr/bin/python3
"""Model FLOPs utilisation of a Llama fine-tune: the FLOPs a step must do, per second, over the
GPU's peak (the GPU check's MFU, scripts/gpu-check.sh; docs/gpu-results.md).

FLOPs per token: 6 N (forward and backward of every weight matrix: N counts every parameter
but the input embedding, a lookup; a tied embedding is the output head and counts) plus
attention's 12 L h T (the scores and their product with V, forward and backward, over the whole
T x T square as PaLM's appendix B counts it, though a causal mask halves what a flash kernel
does). The peak is the GPU's dense bf16 tensor-core rate from NVIDIA's data sheets, by the name
nvidia-smi gives, or GPU_PEAK_TFLOPS; the line printed names the one assumed.

usage: bench/mfu.py CONFIG_JSON --seq_len T --tokens_per_s X [--gpus N] [--gpu_name NAME]
prints: MFU 41.2% (...); with no known peak, "MFU n/a (...)".
"""
import argparse
import json
import os

# Dense bf16 tensor-core TFLOP/s (no sparsity), by a part of the name nvidia-smi prints; the
# first match wins, so the PCIe forms come before their families.
PEAKS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("H800", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("A10G", 70.0),
]


def parameters(c):
    """HF's parameter count of a Llama config (models/llama.cc's LlamaConfig::parameterCount)."""
    h, v, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads", heads) * (h // heads)
    bias = h + 2 * kv if c.get("model_type") == "qwen2" else 0
    layer = 2 * h * h + 2 * h * kv + bias + 3 * h * c["intermediate_size"] + 2 * h
    tied = c.get("tie_word_embeddings", False)
    return v * h * (1 if tied else 2) + layers * layer + h


def flops_per_token(c, seq_len):
    """(6 N + 12 L h T, N): the training FLOPs per token and the N they count."""
    n = parameters(c)
    if not c.get("tie_word_embeddings", False):
        n -= c["vocab_size"] * c["hidden_size"]  # the input embedding: a lookup, no FLOPs
    attention = 12 * c["num_hidden_layers"] * c["hidden_size"] * seq_len
    return 6 * n + attention, n


def peak_tflops(gpu_name):
    """(TFLOP/s, where it came from) or (None, why not)."""
    override = os.environ.get("GPU_PEAK_TFLOPS")
    if override:
        return float(override), "GPU_PEAK_TFLOPS"
    for part, peak in PEAKS:
        if part in gpu_name:
            return peak, "%s's dense bf16 data-sheet peak" % part
    return None, "no peak known for '%s'; set GPU_PEAK_TFLOPS" % gpu_name


def main():
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--seq_len", type=int, required=True)
    p.add_argument("--tokens_per_s", type=float, required=True)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--gpu_name", default="")
    a = p.parse_args()
    with open(a.config) as f:
        c = json.load(f)
    per_token, n = flops_per_token(c, a.seq_len)
    achieved = per_token * a.tokens_per_s / a.gpus / 1e12  # TFLOP/s per GPU
    peak, source = peak_tflops(a.gpu_name)
    what = "6N + 12LhT per token, N %.3g, %.1f TFLOP/s per GPU" % (n, achieved)
    if peak is None:
        print("MFU n/a (%s; %s)" % (what, source))
    else:
        print("MFU %.1f%% (%s, of %.0f TFLOP/s: %s)" % (100 * achieved / peak, what, peak, source))


if __name__ == "__main__":
    main()
