#!/usr/bin/env python3
"""Every Catch2 test name can be selected by ctest: catch_discover_tests registers each TEST_CASE
under its name, and a name with ';' (a CMake list separator), a backslash, or a leading '-' (read
as a Catch2 option) registers as something that runs no test or the wrong one, and fails.

usage: test_names_check.py REPO
Exit 0: every name is fine; 1: the bad ones listed, as FILE:LINE: NAME.
"""
import glob
import os
import re
import sys

TEST_CASE = re.compile(r'\b(?:TEST_CASE|TEMPLATE_TEST_CASE|SCENARIO)\s*\(\s*"((?:[^"\\]|\\.)*)"')


def bad(name):
    return ";" in name or "\\" in name or name.startswith("-") or name != name.strip()


def main():
    repo = sys.argv[1]
    found = []
    for path in sorted(glob.glob(os.path.join(repo, "tests", "**", "*.cc"), recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in TEST_CASE.finditer(text):
            if bad(m.group(1)):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{os.path.relpath(path, repo)}:{line}: {m.group(1)}")
    for entry in found:
        print(entry)
    if found:
        print(f"{len(found)} test name(s) ctest cannot select: no ';', no backslash, no leading "
              "'-' or space")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
