#!/usr/bin/env python3
"""The docs and the code name the same settings: every environment variable and launcher flag
the code defines is in the docs, and every one the docs name exists in the code.

usage: names_check.py REPO CXXLAUNCH_BINARY
Exit 0: they agree; 1: names listed that one side lacks.
"""
import glob
import os
import re
import subprocess
import sys

VARIABLE = re.compile(r"CXXLAUNCH_[A-Z0-9_]*[A-Z0-9]\b")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*(?:-[a-z0-9_]+)*)")
SUBCOMMANDS = ["run", "config", "env", "test", "estimate-memory", "status", "merge-weights"]
CODE = ["apps", "bench", "cmake", "common", "launcher", "models", "rendezvous", "runtime",
        "scripts", "tests", "CMakeLists.txt", "CMakePresets.json", ".ci"]


def read(paths):
    text = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            text.append(f.read())
    return "\n".join(text)


def files(repo, roots):
    out = []
    for root in roots:
        path = os.path.join(repo, root)
        if os.path.isfile(path):
            out.append(path)
        for dirpath, _, names in os.walk(path):
            out += [os.path.join(dirpath, n) for n in names
                    if n.endswith((".cc", ".h", ".cu", ".py", ".sh", ".txt", ".cmake", ".json",
                                   ".in", ".yaml", "run"))]
    return out


def main(repo, binary):
    docs = read(sorted(glob.glob(os.path.join(repo, "docs", "*.md"))) +
                [os.path.join(repo, "README.md")])
    code = read(files(repo, CODE))
    problems = []

    # Defined in code, so they must be documented: the worker contract and the config schema.
    defined = set(VARIABLE.findall(read([os.path.join(repo, "common", "env_names.h"),
                                         os.path.join(repo, "launcher", "config_schema.cc")])))
    problems += ["undocumented variable " + v for v in sorted(defined - set(VARIABLE.findall(docs)))]

    # Named in the docs, so they must exist somewhere in the code (tests and CMake count).
    problems += ["documented variable " + v + " is in no source"
                 for v in sorted(set(VARIABLE.findall(docs)) - set(VARIABLE.findall(code)))]

    # Every flag of every subcommand is in the docs.
    flags = set()
    for sub in SUBCOMMANDS:
        result = subprocess.run([binary, sub, "--help"], capture_output=True, text=True)
        if result.returncode != 0:
            continue  # a subcommand this build does not have
        flags |= set(FLAG.findall(result.stdout + result.stderr))
    flags.discard("help")
    documented_flags = set(FLAG.findall(docs))
    # Ours follow `cxxlaunch` on a line, or stand in the tables; other tools' (sbatch, mpirun,
    # perf) are not checked.
    ours = "\n".join(l.split("cxxlaunch", 1)[1] if "cxxlaunch" in l else l
                      for l in docs.splitlines() if "cxxlaunch" in l or l.startswith("|"))
    problems += ["undocumented flag --" + f for f in sorted(flags - documented_flags)]

    # Every flag the docs name is one of the launcher's or appears in some source (the example
    # programs', the scripts', the benchmarks').
    spelled = set(FLAG.findall(code)) | set(re.findall(r'"([a-z][a-z0-9_-]*)"', code))
    problems += ["documented flag --" + f + " is in no source"
                 for f in sorted(set(FLAG.findall(ours)) - flags - spelled)]

    for p in problems:
        print(p)
    print("%d variables and %d flags checked: %s" % (
        len(defined), len(flags), "agree" if not problems else "%d problem(s)" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
