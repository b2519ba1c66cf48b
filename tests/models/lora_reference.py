#!/usr/bin/python3
"""Independent reference check for a LoRA adapter in PEFT's layout on the C++ Llama.

Written from PEFT's published math (tuners/lora/layer.py: y = W x + scale * B(A(dropout(x))),
scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora) and its file layout
(utils/save_and_load.py: keys "base_model.model." + the module's name + ".lora_A.weight" /
".lora_B.weight", no adapter name), in float32, with only the standard library and torch (no
peft, no transformers); the Llama forward is llama_reference.py's.

Usage: lora_reference.py MODEL_DIR ADAPTER_DIR CASE.safetensors
       lora_reference.py --check-only MODEL_DIR ADAPTER_DIR
MODEL_DIR: an HF folder (config.json, model.safetensors or an index and its shards);
ADAPTER_DIR: adapter_config.json and adapter_model.safetensors; CASE: input_ids (I64) and our
logits (F32) for them. --check-only: no logits to compare; the adapter must fit the base, have
been trained (some B not zero) and give finite logits.
Exit 0: the logits match (1e-5); 1: they do not, or the adapter does not fit the base; 2: bad
input.
"""
import json, math, os, struct, sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref

PREFIX = "base_model.model."

def read_model(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    files = ["model.safetensors"]
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    W = {}
    for name in files:
        W.update({n: t for n, (_, t) in ref.read_safetensors(os.path.join(folder, name)).items()})
    return W

def main(argv):
    check_only = len(argv) == 4 and argv[1] == "--check-only"
    if check_only:
        argv = argv[1:] + [None]
    if len(argv) != 4:
        print("usage: lora_reference.py [--check-only] MODEL_DIR ADAPTER_DIR [CASE.safetensors]")
        return 2
    try:
        with open(os.path.join(argv[1], "config.json")) as f:
            c = json.load(f)
        W = read_model(argv[1])
        with open(os.path.join(argv[2], "adapter_config.json")) as f:
            ac = json.load(f)
        adapter = ref.read_safetensors(os.path.join(argv[2], "adapter_model.safetensors"))
        if check_only:
            ids, ours = torch.randint(c["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1)), None
        else:
            case = ref.read_safetensors(argv[3])
            ids, ours = case["input_ids"][1], case["logits"][1]
    except (OSError, ValueError, KeyError, TypeError, struct.error, RuntimeError) as e:
        print("bad input: %r" % (e,)); return 2
    problems = []
    if ac.get("peft_type") != "LORA" or ac.get("bias", "none") != "none" or ac.get("fan_in_fan_out"):
        problems.append("adapter_config.json is not a plain LoRA adapter: %r" % (ac,))
    r, alpha = ac["r"], ac["lora_alpha"]
    scale = alpha / math.sqrt(r) if ac.get("use_rslora") else alpha / r
    targets = ac["target_modules"]
    lora = {}
    for key, (dtype, t) in adapter.items():
        if not key.startswith(PREFIX) or not key.endswith((".lora_A.weight", ".lora_B.weight")):
            problems.append("not a PEFT LoRA key: " + key); continue
        module, part = key[len(PREFIX):].rsplit(".", 2)[0], key.rsplit(".", 2)[1]
        lora.setdefault(module, {})[part] = t
    for module, parts in sorted(lora.items()):
        w = W.get(module + ".weight")
        A, B = parts.get("lora_A"), parts.get("lora_B")
        if w is None or A is None or B is None:
            problems.append("%s: no base weight or a factor missing" % module); continue
        if isinstance(targets, list) and module.rsplit(".", 1)[-1] not in targets:
            problems.append("%s is not in target_modules %r" % (module, targets))
        if list(A.shape) != [r, w.shape[1]] or list(B.shape) != [w.shape[0], r]:
            problems.append("%s: A %s and B %s do not fit W %s at r %d"
                            % (module, list(A.shape), list(B.shape), list(w.shape), r))
    if not lora:
        problems.append("the adapter holds no LoRA factor")
    if problems:
        print("\n".join(problems)); return 1
    terms = {m: (p["lora_A"], p["lora_B"], scale) for m, p in lora.items()}
    with torch.no_grad():
        logits = ref.forward(c, W, ids, lora=terms)
    if check_only:
        trained = any(B.abs().max().item() > 0 for _, B, _ in terms.values())
        ok = trained and bool(torch.isfinite(logits).all())
        print("%d adapted modules, scale %g, %s: %s" % (len(lora), scale, "trained" if trained else "B all zero",
                                                        "OK" if ok else "MISMATCH"))
        return 0 if ok else 1
    if ours.shape != logits.shape:
        print("shape mismatch: logits %s vs ours %s" % (list(logits.shape), list(ours.shape))); return 1
    diff = (logits - ours).abs().max().item()
    tol = 1e-5 * max(1.0, logits.abs().max().item())
    ok = diff <= tol
    print("%d adapted modules, scale %g: logits max abs diff %.3g (tolerance %.3g): %s"
          % (len(lora), scale, diff, tol, "OK" if ok else "MISMATCH"))
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main(sys.argv))
