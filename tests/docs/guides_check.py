#!/usr/bin/env python3
"""Two rules of the repository's shape, checked together:

- The user guides (docs/*.md and the README) are guides, not run logs: no dates, clock times or
  load averages, links included. A dated run belongs in bench/results/<subject>.md, whose heading
  carries the run's date; a guide links to the subject's file.
- No source file in any module (C++, CUDA, Python, shell; tests and benchmarks included) passes
  600 lines, so that no module needs a later split: a file that grows past it is split by what
  its parts do.

usage: guides_check.py REPO
Exit 0: both hold; 1: the dated lines (FILE:LINE: TEXT) and the long files (FILE: N lines) listed.
"""
import glob
import os
import re
import sys

DATED = [
    re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b"),                 # 2026-12-04
    re.compile(r"\b[0-2]?\d:[0-5]\d(:[0-5]\d)?\s*(UTC|GMT|Z\b|[ap]\.?m\.?)", re.I),  # 23:39 UTC
    re.compile(r"\b(at|since|until|from)\s+[0-2]?\d:[0-5]\d\b", re.I),   # at 23:39
    re.compile(r"\bload average", re.I),
    re.compile(r"\b(January|February|March|April|May|June|July|August|September|October|"
               r"November|December)\s+\d{1,2},?\s+(19|20)\d\d\b"),
]


def dated_lines(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if any(p.search(line) for p in DATED):
                yield number, line.rstrip("\n")


MAX_LINES = 600
SOURCES = (".cc", ".h", ".cu", ".cuh", ".py", ".sh", ".cjs")


def long_sources(repo):
    """Source files over MAX_LINES, outside build folders, caches and other hidden folders."""
    for top, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "build", "node_modules")))
        for name in sorted(files):
            if name.endswith(SOURCES):
                path = os.path.join(top, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    count = sum(1 for _ in f)
                if count > MAX_LINES:
                    yield os.path.relpath(path, repo), count


def main():
    repo = sys.argv[1]
    guides = sorted(glob.glob(os.path.join(repo, "docs", "**", "*.md"), recursive=True))
    guides.append(os.path.join(repo, "README.md"))
    found = [(os.path.relpath(g, repo), n, t) for g in guides for n, t in dated_lines(g)]
    for path, number, text in found:
        print(f"{path}:{number}: {text}")
    if found:
        print(f"{len(found)} dated line(s) in the guides: move the run to bench/results/ and link "
              "it, or say it without the date")
    long = list(long_sources(repo))
    for path, count in long:
        print(f"{path}: {count} lines")
    if long:
        print(f"{len(long)} source file(s) over {MAX_LINES} lines: split each by what its parts do")
    return 1 if found or long else 0


if __name__ == "__main__":
    sys.exit(main())
