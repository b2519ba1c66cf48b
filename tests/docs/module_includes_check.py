#!/usr/bin/env python3
"""The modules without LibTorch stay without it, and below the runtime: common/, text/,
tensorfile/, proto/, rendezvous/ and launcher/ include no header of runtime/, models/ or apps/,
and none of LibTorch's (torch/, ATen/, c10/). The launcher must start in milliseconds and build
fast (DESIGN: launcher/ never includes runtime/); what it shares with the runtime, such as the
checkpoint files `cxxlaunch merge-weights` reads, lives in a torch-free module of its own.

usage: module_includes_check.py REPO
Exit 0: none does; 1: the includes listed, as FILE:LINE: TEXT.
"""
import os
import re
import sys

TORCH_FREE = ["common", "text", "tensorfile", "proto", "rendezvous", "launcher"]
FORBIDDEN = re.compile(r'^\s*#\s*include\s*[<"](runtime|models|apps|torch|ATen|c10)/')
SOURCES = (".h", ".cc", ".cu", ".cuh")


def forbidden_includes(repo):
    for module in TORCH_FREE:
        for folder, _, files in os.walk(os.path.join(repo, module)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        if FORBIDDEN.match(line):
                            yield os.path.relpath(path, repo), number, line.strip()


def main():
    found = list(forbidden_includes(sys.argv[1]))
    for path, number, text in found:
        print(f"{path}:{number}: {text}")
    if found:
        print(f"{len(found)} include(s) of runtime/, models/, apps/ or LibTorch in a module "
              "without LibTorch: move what both need into a torch-free module (tensorfile/, "
              "common/)")
        return 1
    print(f"{', '.join(TORCH_FREE)}: no include of runtime/, models/, apps/ or LibTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
