#!/usr/bin/env python3
"""Every C++ block of README.md compiles (ctest readme.blocks).

    check_blocks.py SOURCE_DIR OUT_DIR COMPILER FLAGS_FILE

A block whose fence is ```cpp is a whole translation unit: it compiles as it stands. A block whose fence is
```cpp fragment is the body of a function: it may use the names that tests/readme/prelude.hpp declares (the first
example's Acc, acc, net, adamw, x, y and its prepared model, opt, loader, sched; state, epochs, step, total_steps, ds,
Ema) and declare its own. The fragments are compiled together, each in its own function, in one translation unit;
each whole block in its own, two at a time. Every unit is compiled with -fsyntax-only (templates are instantiated, nothing is
generated), with the include directories and definitions of the unit tests (FLAGS_FILE, one argument per line), and
`#line` directives, so that an error names README.md and the block's own line. Other fences (```sh, ```cmake, plain
```) are not checked. Prints "N block(s) in K unit(s), P problem(s)"; exits 1 when P > 0.
"""
import concurrent.futures
import pathlib
import re
import subprocess
import sys
import time

FENCE = re.compile(r"^```(\S*)\s*(.*?)\s*$")


def blocks(readme: pathlib.Path):
    """Yields (kind, first line number of the code, code) for each ```cpp block; kind is 'whole' or 'fragment'."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, info = m.group(1), m.group(2)
        start = i + 1
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if lang == "cpp":
            if info not in ("", "fragment"):
                raise SystemExit(f"README.md:{start}: unknown info string '```cpp {info}' (```cpp or ```cpp fragment)")
            yield ("fragment" if info == "fragment" else "whole"), start + 1, "\n".join(lines[start:i])
        i += 1  # the closing fence


def main() -> int:
    src, out, compiler, flags_file = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    readme = src / "README.md"
    out.mkdir(parents=True, exist_ok=True)
    found = list(blocks(readme))
    units = []
    fragments = []
    for n, (kind, line, code) in enumerate(found, 1):
        text = f'#line {line} "{readme}"\n{code}\n'
        if kind == "whole":
            units.append((f"block {n} (README.md:{line})", out / f"block_{n}.cpp", text))
        else:
            fragments.append(f"void readme_fragment_{n}() {{\n{text}}}\n")
    if fragments:
        prelude = src / "tests" / "readme" / "prelude.hpp"
        text = f'#include "{prelude}"\n' + "\n".join(fragments)
        units.append((f"{len(fragments)} fragment(s)", out / "fragments.cpp", text))
    flags = [f for f in pathlib.Path(flags_file).read_text().splitlines() if f]
    for _, path, text in units:
        path.write_text(text, encoding="utf-8")

    def compile_unit(unit):
        name, path, _ = unit
        t = time.monotonic()
        r = subprocess.run([compiler, "-std=c++20", "-fsyntax-only", f"-I{src / 'include'}", *flags, str(path)],
                           capture_output=True, text=True)
        return name, r, time.monotonic() - t

    problems = 0
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # ctest: PROCESSORS 2
        for name, r, seconds in pool.map(compile_unit, units):
            print(f"{name}: {'ok' if r.returncode == 0 else 'FAILED'} ({seconds:.1f} s)")
            if r.returncode != 0:
                problems += 1
                print(r.stdout + r.stderr)
    print(f"{len(found)} block(s) in {len(units)} unit(s), {problems} problem(s) ({time.monotonic() - t0:.1f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
