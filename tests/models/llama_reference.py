#!/usr/bin/python3
"""Independent reference check for the C++ LlamaForCausalLM / Qwen2ForCausalLM forward.

Written independently of the C++ code, from the published math of Hugging Face
transformers' modeling_llama / modeling_qwen2 (eager attention), in float32, using
only the Python standard library and torch (no transformers, no safetensors package).

Usage: llama_reference.py CASE.safetensors CONFIG.json
CASE holds the weights by HF's names, input_ids, labels, our logits and loss, and optionally
attention_mask (I64, 1 = token, 0 = padding), applied as HF's eager attention does, and
position_ids (I64, [B, T]): each token's rotary position, and packed examples as HF's
padding-free batches mark them (an example starts at every position 0; a token attends only to
earlier tokens of its own example).
Exit 0: logits and loss match; 1: they do not (or a parameter is missing/extra/misshapen);
2: bad input.
"""
import json, math, struct, sys
import torch

DTYPES = {"F32": torch.float32, "I64": torch.int64}
INPUTS = {"input_ids": "I64", "logits": "F32", "labels": "I64", "loss": "F32"}
OPTIONAL = {"attention_mask": "I64", "position_ids": "I64"}

def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header, base, out = json.loads(blob[8:8 + n].decode("utf-8")), 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = DTYPES[info["dtype"]]
        raw = bytearray(blob[base + b:base + e])
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = (info["dtype"], t.reshape(info["shape"]))
    return out

def expected_params(c):
    H, I, V, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], head_dim(c)
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    e = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not c.get("tie_word_embeddings", False):
        e["lm_head.weight"] = [V, H]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        e.update({p + "self_attn.q_proj.weight": [nq * hd, H], p + "self_attn.k_proj.weight": [nkv * hd, H],
                  p + "self_attn.v_proj.weight": [nkv * hd, H], p + "self_attn.o_proj.weight": [H, nq * hd],
                  p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                  p + "mlp.down_proj.weight": [H, I], p + "input_layernorm.weight": [H],
                  p + "post_attention_layernorm.weight": [H]})
        if has_qkv_bias(c):
            e.update({p + "self_attn.q_proj.bias": [nq * hd], p + "self_attn.k_proj.bias": [nkv * hd],
                      p + "self_attn.v_proj.bias": [nkv * hd]})
    return e

head_dim = lambda c: c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
has_qkv_bias = lambda c: c["model_type"] == "qwen2" or bool(c.get("attention_bias", False))

def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

def packed_mask(position_ids):
    """[B, 1, T, T] additive mask: a key is visible if it is at or before the query and no
    example starts (position 0) after the key and at or before the query."""
    B, T = position_ids.shape
    mask = torch.full((B, 1, T, T), torch.finfo(torch.float32).min)
    for b in range(B):
        start = 0
        for q in range(T):
            if position_ids[b, q].item() == 0:
                start = q
            mask[b, 0, q, start:q + 1] = 0.0
    return mask

def forward(c, W, input_ids, attention_mask=None, position_ids=None, lora=None):
    """lora (lora_reference.py): module name -> (A, B, scale), PEFT's W x + scale B (A x)."""
    B, T = input_ids.shape
    nq, nkv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c), c["rms_norm_eps"]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if position_ids is None:
        freqs = torch.outer(torch.arange(T, dtype=torch.int64).float(), inv_freq)
    else:  # HF's rotary embedding: [B, T] positions -> [B, 1, T, hd] tables
        freqs = (inv_freq[None, :, None] @ position_ids[:, None, :].float()).transpose(1, 2)[:, None]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    # HF's 4D mask: the lowest float above the diagonal, and on every padding key.
    mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)[None, None]
    if position_ids is not None:
        mask = packed_mask(position_ids)
    if attention_mask is not None:
        padding = mask + attention_mask[:, None, None, :].float()
        mask = mask.masked_fill(padding == 0, torch.finfo(torch.float32).min)
    def lin(x, n):
        y = torch.nn.functional.linear(x, W[n + ".weight"], W.get(n + ".bias"))
        if lora and n in lora:
            A, B, scale = lora[n]
            y = y + torch.nn.functional.linear(torch.nn.functional.linear(x, A), B) * scale
        return y
    h = W["model.embed_tokens.weight"][input_ids]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        r, x = h, rms_norm(h, W[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj").view(B, T, nq, hd).transpose(1, 2)
        k = lin(x, p + "self_attn.k_proj").view(B, T, nkv, hd).transpose(1, 2)
        v = lin(x, p + "self_attn.v_proj").view(B, T, nkv, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = nq // nkv
        k = k[:, :, None].expand(B, nkv, rep, T, hd).reshape(B, nq, T, hd)
        v = v[:, :, None].expand(B, nkv, rep, T, hd).reshape(B, nq, T, hd)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd) + mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, nq * hd)
        h = r + lin(out, p + "self_attn.o_proj")
        r, x = h, rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        h = r + lin(torch.nn.functional.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj"),
                    p + "mlp.down_proj")
    h = rms_norm(h, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return torch.matmul(h, head.t())

def causal_lm_loss(logits, labels):
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, V).float(),
                                             labels[..., 1:].reshape(-1), ignore_index=-100, reduction="mean")

def main(argv):
    if len(argv) != 3:
        print("usage: llama_reference.py CASE.safetensors CONFIG.json"); return 2
    try:
        with open(argv[2]) as f:
            c = json.load(f)
        tensors = read_safetensors(argv[1])
        exp = expected_params(c)
        for n, dt in INPUTS.items():
            if tensors.get(n, (None,))[0] != dt:
                print("input tensor %s missing or not %s" % (n, dt)); return 2
    except (OSError, ValueError, KeyError, TypeError, struct.error, RuntimeError) as e:
        print("bad input: %r" % (e,)); return 2
    for n, dt in OPTIONAL.items():
        if n in tensors and tensors[n][0] != dt:
            print("input tensor %s not %s" % (n, dt)); return 2
    params = {n: v for n, v in tensors.items() if n not in INPUTS and n not in OPTIONAL}
    missing, extra = sorted(set(exp) - set(params)), sorted(set(params) - set(exp))
    bad = sorted(n for n in set(exp) & set(params) if params[n][0] != "F32" or list(params[n][1].shape) != exp[n])
    if missing or extra or bad:
        print("missing parameters: %s\nextra parameters: %s\nwrong dtype/shape: %s" % (missing, extra, bad)); return 1
    W = {n: t for n, (_, t) in params.items()}
    ids, ours, labels, our_loss = (tensors[n][1] for n in ("input_ids", "logits", "labels", "loss"))
    with torch.no_grad():
        optional = {n: tensors[n][1] if n in tensors else None for n in OPTIONAL}
        logits = forward(c, W, ids, optional["attention_mask"], optional["position_ids"])
        loss = causal_lm_loss(logits, labels).item()
    if ours.shape != logits.shape or our_loss.numel() != 1:
        print("shape mismatch: logits %s vs ours %s, loss numel %d" % (list(logits.shape), list(ours.shape),
                                                                        our_loss.numel())); return 1
    diff = (logits - ours).abs().max().item() if logits.numel() else 0.0
    tol = 1e-5 * max(1.0, logits.abs().max().item() if logits.numel() else 0.0)
    ol = our_loss.item()
    ltol = 1e-5 * max(1.0, abs(loss)) if not math.isnan(loss) else 0.0
    loss_ok = (math.isnan(loss) and math.isnan(ol)) or abs(loss - ol) <= ltol
    ok = diff <= tol and loss_ok
    print("logits max abs diff %.3g (tolerance %.3g), loss %.6f vs ours %.6f (tolerance %.3g): %s"
          % (diff, tol, loss, ol, ltol, "OK" if ok else "MISMATCH"))
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main(sys.argv))
