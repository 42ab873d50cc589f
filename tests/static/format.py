#!/usr/bin/env python3
"""The tree's C++ holds the layout of `.clang-format` (Google's style, 120 columns), checked with clang-format 14
(Debian 12's `clang-format-14`, which scripts/lib.sh installs). To fix what it finds:

    clang-format-14 -i FILE...        (or every file: tests/static/format.py ROOT --fix)

    format.py ROOT [--fix]            exits non-zero naming every file that differs
"""
import pathlib
import shutil
import subprocess
import sys

FOLDERS = ["include", "tests", "tools", "examples", "benchmarks"]
SUFFIXES = {".hpp", ".cpp", ".ipp", ".h", ".cu"}


def main(root: str, fix: bool) -> int:
    tool = shutil.which("clang-format-14")
    if tool is None:
        print("format.py: clang-format-14 not found: run scripts/test (it installs the Debian package clang-format-14)")
        return 2
    base = pathlib.Path(root)
    files = sorted(p for f in FOLDERS for p in (base / f).rglob("*")
                   if p.suffix in SUFFIXES and p.is_file() and "build" not in p.relative_to(base).parts[:1])
    if fix:
        subprocess.run([tool, "-i", "--style=file", *map(str, files)], check=True)
    differ = []
    for i in range(0, len(files), 64):
        chunk = files[i:i + 64]
        out = subprocess.run([tool, "--dry-run", "--style=file", *map(str, chunk)], capture_output=True, text=True)
        for line in out.stderr.splitlines():
            if ": warning: code should be clang-formatted" in line:
                name = line.split(":", 1)[0]
                if name not in differ:
                    differ.append(name)
    for name in differ:
        print(f"{pathlib.Path(name).relative_to(base.resolve()) if pathlib.Path(name).is_absolute() else name}: "
              "not in the layout of .clang-format (clang-format-14 -i it)")
    print(f"{len(files)} files checked, {len(differ)} problem(s)")
    return 1 if differ else 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--fix"]
    sys.exit(main(args[0] if args else ".", "--fix" in sys.argv[1:]))
