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

# The name: one string literal or several adjacent ones, which C++ joins.
TEST_CASE = re.compile(r'\b(?:TEST_CASE|TEMPLATE_TEST_CASE|SCENARIO)\s*\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def name_of(literals):
    joined = "".join(LITERAL.findall(literals))
    return re.sub(r"\\(.)", r"\1", joined)  # \" is ", \\ is a backslash


def bad(name):
    return ";" in name or "\\" in name or name.startswith("-") or name.startswith(" ")


def main():
    repo = sys.argv[1]
    found = []
    for path in sorted(glob.glob(os.path.join(repo, "tests", "**", "*.cc"), recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in TEST_CASE.finditer(text):
            name = name_of(m.group(1))
            if bad(name):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{os.path.relpath(path, repo)}:{line}: {name}")
    for entry in found:
        print(entry)
    if found:
        print(f"{len(found)} test name(s) ctest cannot select: no ';', no backslash, no leading "
              "'-' or space")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
