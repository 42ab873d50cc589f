#!/usr/bin/env python3
"""Edit-compile time of a user's training loop: the README's first example, recompiled after an edit.

Compiles (g++ -O2 -std=c++20 unless --opt, the project's include directories and definitions, no ccache) the first ```cpp block
of README.md (the training loop a user starts from) after an edit (a line appended, so nothing is reused but what the
variant keeps on purpose), in interleaved rounds (A, B, C, ... A, B, C, ...: the machine may be shared and noisy):

  torch.h                   a TU that includes <torch/torch.h> alone: the baseline;
  header-only               the example as it stands;
  separate                  the example in ACCEL_SEPARATE_COMPILATION (<accel/src.hpp> compiled once, not counted);
  header-only + PCH         the example with <torch/torch.h> and <accel/accel.hpp> precompiled, as
                            accel_target_precompile_headers does it (the header built once, not counted; then
                            `-include` of it, as CMake compiles a target's sources);
  separate + PCH            both.

The one-time costs (each precompiled header, <accel/src.hpp>) are compiled and reported once. A precompiled header
that g++ would not use is an error, not a slow figure: its text is replaced by an #error once the .gch is built.
Records user seconds (getrusage of the compiler) and wall seconds of each compile, and the load average before each
round. Writes a JSON list of {"name", "accel_seconds" (min user s), "baseline", "baseline_seconds" (torch.h's min),
"ratio" (median over the rounds of the round's ratio to torch.h), "ratio_min" (min/min), "wall_min", "rounds", "one_time", "load_average"}.

    edit_compile.py FLAGS_FILE OUT.json [--rounds N] [--opt -O0]
--opt: the optimisation level of every compile (-O2 by default; -O0 is a debug build's edit loop).
FLAGS_FILE: one flag per line (build/tests/fail_torch_flags.txt: -isystem dirs and -D definitions of the tests).
"""
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEPARATE = ["-DACCEL_SEPARATE_COMPILATION"]


def readme_example() -> str:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"^```cpp\n(.*?)^```", text, re.S | re.M)
    if not m:
        raise SystemExit("README.md has no ```cpp block")
    return m.group(1)


def compile_once(cmd):
    """(user seconds, wall seconds) of one compiler run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before, wall


def main() -> int:
    flags_file, out = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    flags = [l.strip() for l in open(flags_file) if l.strip()]
    opt = sys.argv[sys.argv.index("--opt") + 1] if "--opt" in sys.argv else "-O2"
    base = ["g++", "-std=c++20", opt, f"-I{ROOT}/include"] + flags
    example = readme_example()
    with tempfile.TemporaryDirectory() as d:
        once = {}
        pch = {}
        for mode, extra in (("header-only", []), ("separate", SEPARATE)):
            folder = os.path.join(d, "pch_" + mode)
            os.mkdir(folder)
            header = os.path.join(folder, "accel_pch.hpp")
            with open(header, "w") as f:
                f.write("#include <torch/torch.h>\n#include <accel/accel.hpp>\n")
            user, wall = compile_once(base + extra + ["-x", "c++-header", header, "-o", header + ".gch"])
            once[f"precompiled header ({mode}), once"] = {"user": user, "wall": wall}
            with open(header, "w") as f:  # g++ reads the text only if it rejects the .gch
                f.write('#error "the precompiled header was not used"\n')
            pch[mode] = ["-include", header, "-Winvalid-pch"]
        src = os.path.join(d, "src.cpp")
        with open(src, "w") as f:
            f.write("#include <accel/src.hpp>\n")
        user, wall = compile_once(base + SEPARATE + ["-c", src, "-o", os.devnull])
        once["<accel/src.hpp> (separate), once"] = {"user": user, "wall": wall}
        for name, t in once.items():
            print(f"{name}: {t['user']:.1f} user s, {t['wall']:.1f} wall s", flush=True)

        variants = {
            "torch.h": ("#include <torch/torch.h>\nint main() { return 0; }\n", []),
            "header-only": (example, []),
            "separate": (example, SEPARATE),
            "header-only + PCH": (example, pch["header-only"]),
            "separate + PCH": (example, SEPARATE + pch["separate"]),
        }
        results = {k: [] for k in variants}
        loads = []
        tu = os.path.join(d, "train.cpp")
        for r in range(rounds):
            loads.append(os.getloadavg())
            for name, (text, extra) in variants.items():
                with open(tu, "w") as f:
                    f.write(text + f"// edit {r}\n")  # the edit
                user, wall = compile_once(base + extra + ["-c", tu, "-o", os.devnull])
                results[name].append({"user": user, "wall": wall})
                print(f"round {r + 1}: {name}: {user:.1f} user s, {wall:.1f} wall s", flush=True)
    torch = results["torch.h"]
    entries = []
    for name, runs in results.items():
        if name == "torch.h":
            continue
        per_round = [x["user"] / t["user"] for x, t in zip(runs, torch)]
        suffix = "" if opt == "-O2" else "_" + opt.lstrip("-")
        entries.append({"name": "edit_compile_readme_" + name.replace(" + ", "_").replace("-", "_") + suffix,
                        "accel_seconds": min(x["user"] for x in runs), "baseline": "torch.h alone",
                        "baseline_seconds": min(t["user"] for t in torch), "ratio": statistics.median(per_round),
                        "ratio_min": min(x["user"] for x in runs) / min(t["user"] for t in torch),
                        "wall_min": min(x["wall"] for x in runs), "rounds": runs, "ratio_per_round": per_round})
    print(f"load average before each round (1, 5, 15 min): {[tuple(round(v, 2) for v in l) for l in loads]}")
    print(f"torch.h alone: {min(t['user'] for t in torch):.1f} user s (min of {rounds})")
    for e in entries:
        print(f"{e['name']}: {e['accel_seconds']:.1f} user s, ratio {e['ratio']:.2f} (median of rounds; "
              f"{min(e['ratio_per_round']):.2f}-{max(e['ratio_per_round']):.2f}), min/min {e['ratio_min']:.2f}")
    with open(out, "w") as f:
        for e in entries:
            e["one_time"], e["load_average"] = once, loads
        json.dump(entries, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
