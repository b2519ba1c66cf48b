#!/usr/bin/env python3
"""An independent safetensors reader (json + struct, no safetensors or torch package): reads a
folder (index or single file) and writes every F32 tensor's values, in name order, as raw
little-endian float32 to OUT, and a line per tensor (name dtype shape) to stdout.

usage: read_safetensors.py DIR OUT
"""
import json
import os
import struct
import sys


def read_file(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {name: (e["dtype"], e["shape"], data[e["data_offsets"][0]:e["data_offsets"][1]])
            for name, e in header.items()}


def main():
    folder, out = sys.argv[1], sys.argv[2]
    index = os.path.join(folder, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    tensors = {}
    for name in files:
        tensors.update(read_file(os.path.join(folder, name)))
    with open(out, "wb") as f:
        for name in sorted(tensors):
            dtype, shape, raw = tensors[name]
            count = 1
            for d in shape:
                count *= d
            print(name, dtype, "x".join(map(str, shape)))
            if dtype == "F32":
                assert len(raw) == 4 * count, name
                f.write(struct.pack("<%df" % count, *struct.unpack("<%df" % count, raw)))


if __name__ == "__main__":
    main()
