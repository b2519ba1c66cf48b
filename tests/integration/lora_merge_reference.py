#!/usr/bin/python3
"""Independent check of `cxxlaunch merge-weights --lora`: the merged folder against its base and
adapter, computed here with torch (Debian's python3-torch; no peft, no safetensors package).

Usage: lora_merge_reference.py BASE_DIR ADAPTER_DIR MERGED_DIR
Reads adapter_config.json (r, lora_alpha, use_rslora) and PEFT's key names itself. For every
tensor of the base, the merged folder must hold one of the same name, dtype and shape. Tensors
no adapter targets: the same bytes. Targeted weights W: with scale = lora_alpha / r (or
lora_alpha / sqrt(r) with use_rslora),
  - the value nearest to W + scale * B @ A computed in float64, in W's dtype (either of two at
    a tie): the merge rounds once;
  - within one unit of the dtype (eps * max(|W|, |W'|)) plus float32 arithmetic's error bound
    (eps32 * (|W| + |W'| + r * scale * |B| @ |A|)) of torch's float32 computation (W.float() + scale * (B.float() @ A.float())).to(dtype), and how many elements
    are bit for bit equal to it is printed (float32 matmul orders its sums its own way).
Exit 0: all hold; 1: a difference (printed); 2: bad input.
"""
import json, math, os, struct, sys
import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float64: torch.int64}


def read_file(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header, base, out = json.loads(blob[8:8 + n].decode("utf-8")), 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = bytes(blob[base + b:base + e])
        dt = DTYPES[info["dtype"]]
        t = torch.frombuffer(bytearray(raw), dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = (info["dtype"], t.reshape(info["shape"]), raw)
    return out


def read_folder(path):
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_file(os.path.join(path, "model.safetensors"))
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    out = {}
    for name in sorted(set(weight_map.values())):
        for key, value in read_file(os.path.join(path, name)).items():
            if weight_map.get(key) == name:
                out[key] = value
    return out


def neighbours(x):
    """The values of x's dtype just below and just above each element of x (finite x)."""
    if x.dtype == torch.float64:
        return (torch.nextafter(x, torch.full_like(x, -math.inf)),
                torch.nextafter(x, torch.full_like(x, math.inf)))
    bits = INT_VIEW[x.dtype]
    width = {torch.int16: 16, torch.int32: 32}[bits]
    raw = x.contiguous().view(bits).to(torch.int64) & ((1 << width) - 1)
    sign_bit = 1 << (width - 1)
    magnitude = raw & (sign_bit - 1)
    key = torch.where(raw & sign_bit != 0, -magnitude, magnitude)  # ordered like the values

    def value(k):
        b = torch.where(k >= 0, k, (-k) | sign_bit)
        b = torch.where(b >= sign_bit, b - (1 << width), b)  # as the signed view holds it
        return b.to(bits).view(x.dtype).to(torch.float64)

    return value(key - 1), value(key + 1)


def main(base_dir, adapter_dir, merged_dir):
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        config = json.load(f)
    r, alpha = config["r"], config["lora_alpha"]
    scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    base = read_folder(base_dir)
    adapter = read_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    merged = read_folder(merged_dir)
    pairs = {}
    for key in adapter:
        assert key.startswith("base_model.model."), key
        parts = key[len("base_model.model."):].split(".")
        assert parts[-1] == "weight", key
        at = max(i for i, p in enumerate(parts) if p in ("lora_A", "lora_B"))
        module = ".".join(parts[:at])
        pairs.setdefault(module + ".weight", {})[parts[at][-1]] = adapter[key][1]

    problems = []
    if set(merged) != set(base):
        problems.append("names differ: missing %s, extra %s" %
                        (sorted(set(base) - set(merged)), sorted(set(merged) - set(base))))
    equal = total = 0
    for name, (dtype, w, raw) in sorted(base.items()):
        if name not in merged:
            continue
        m_dtype, m, m_raw = merged[name]
        if m_dtype != dtype or list(m.shape) != list(w.shape):
            problems.append("%s: %s %s, the base's %s %s" %
                            (name, m_dtype, list(m.shape), dtype, list(w.shape)))
            continue
        if name not in pairs:
            if m_raw != raw:
                problems.append("%s: not targeted, but its bytes changed" % name)
            continue
        a, b = pairs[name]["A"], pairs[name]["B"]
        delta32 = scale * (b.float() @ a.float())
        expected32 = (w.float() + delta32).to(w.dtype)
        exact = w.double() + scale * (b.double() @ a.double())
        ours = m.double()
        # Rounded once: no value of the dtype is nearer the exact sum than ours.
        below, above = neighbours(m)
        err = (ours - exact).abs()
        worse = (err > (below - exact).abs()) | (err > (above - exact).abs())
        if worse.any():
            i = worse.nonzero()[0].tolist()
            problems.append("%s%s: %r, but %r is nearer the exact %r" %
                            (name, i, ours[tuple(i)].item(),
                             min(below[tuple(i)].item(), above[tuple(i)].item(),
                                 key=lambda v: abs(v - exact[tuple(i)].item())),
                             exact[tuple(i)].item()))
        eps = torch.finfo(w.dtype).eps
        # One unit of the dtype, plus float32 arithmetic's error bound for a sum of r products
        # and the addition (torch's side).
        size = scale * (b.double().abs() @ a.double().abs())
        eps32 = torch.finfo(torch.float32).eps
        bound = (eps * torch.maximum(w.double().abs(), ours.abs()) +
                 eps32 * (w.double().abs() + ours.abs() + r * size) + 1e-30)
        off = (ours - expected32.double()).abs() > bound
        if off.any():
            i = off.nonzero()[0].tolist()
            problems.append("%s%s: %r, torch's float32 gives %r" %
                            (name, i, ours[tuple(i)].item(), expected32.double()[tuple(i)].item()))
        same = (m.contiguous().view(INT_VIEW[m.dtype]) ==
                expected32.contiguous().view(INT_VIEW[m.dtype]))
        equal += int(same.sum())
        total += same.numel()
    missing = sorted(set(pairs) - set(base))
    if missing:
        problems.append("targets missing from the base: %s" % missing)
    for p in problems:
        print(p)
    print("%d tensors, %d targeted; %d of %d merged elements bit for bit torch's float32 result" %
          (len(base), len(pairs), equal, total))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
