#!/usr/bin/env python3
"""What accel costs a user's translation unit at compile time, side by side in one run.

Compiles (g++ -O2 -std=c++20, the project's include directories and definitions, no ccache) a TU that
includes <torch/torch.h> alone, one that adds <accel/accel.hpp>, <accel/accel.hpp> alone, and the loader's headers
alone (what a plan/loader test includes: no c10d), the user TU of a CPU-only build, the user TU and accel/src.hpp in
ACCEL_SEPARATE_COMPILATION, and c10d's ProcessGroupGloo.hpp (the Gloo engine's dependency) alone, each `--repeat` times, keeping the fastest. Writes a JSON list of
{"name", "accel_seconds", "baseline", "baseline_seconds", "ratio"} (the ratio against torch.h alone; goal <= 1.3 for
torch.h + accel.hpp, header-only or ACCEL_SEPARATE_COMPILATION).

    compile_time.py FLAGS_FILE OUT.json [--repeat N]
FLAGS_FILE: one flag per line (build/tests/fail_torch_flags.txt: -isystem dirs and -D definitions of the tests).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUS = {
    "torch.h": "#include <torch/torch.h>\n",
    "torch.h + accel.hpp": "#include <torch/torch.h>\n#include <accel/accel.hpp>\n",
    "accel.hpp": "#include <accel/accel.hpp>\n",
    "loader headers (data/prepare.hpp)": "#include <accel/data/prepare.hpp>\n",
    # The same user TU in a CPU-only build (LibTorch without CUDA: no NCCL engine, no CUDA headers).
    "torch.h + accel.hpp, CPU-only build": "#undef ACCEL_WITH_CUDA\n#define ACCEL_WITH_CUDA 0\n#include <torch/torch.h>\n#include <accel/accel.hpp>\n",
    # The same user TU in a program built with ACCEL_SEPARATE_COMPILATION (include/accel/detail/linkage.hpp): the
    # engines, the safetensors JSON, the trackers' writers and the CUDA copies are declarations only.
    "torch.h + accel.hpp, ACCEL_SEPARATE_COMPILATION": "#define ACCEL_SEPARATE_COMPILATION\n#include <torch/torch.h>\n#include <accel/accel.hpp>\n",
    # ... and the one TU of that program that compiles them (its cost is paid once per program, not per TU).
    "src.hpp (once per program)": "#define ACCEL_SEPARATE_COMPILATION\n#include <accel/src.hpp>\n",
    # What the Gloo engine's one dependency costs by itself: c10d's ProcessGroupGloo.hpp (with Gloo's headers).
    "torch.h + c10d ProcessGroupGloo.hpp": "#include <torch/torch.h>\n#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>\n",
}


def main() -> int:
    flags_file, out = sys.argv[1], sys.argv[2]
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 2
    flags = [l.strip() for l in open(flags_file) if l.strip()]
    base = ["g++", "-std=c++20", "-O2", "-c", "-o", os.devnull, f"-I{ROOT}/include"] + flags
    times = {}
    with tempfile.TemporaryDirectory() as d:
        for name, text in TUS.items():
            src = os.path.join(d, "tu.cpp")
            with open(src, "w") as f:
                f.write(text + "int main() { return 0; }\n")
            best = None
            for _ in range(repeat):
                t0 = time.perf_counter()
                subprocess.run(base + [src], check=True)
                dt = time.perf_counter() - t0
                best = dt if best is None else min(best, dt)
            times[name] = best
            print(f"{name}: {best:.1f} s", flush=True)
        # Does the loader TU see c10d? (the plan and loader tests must not)
        with open(os.path.join(d, "tu.cpp"), "w") as f:
            f.write(TUS["loader headers (data/prepare.hpp)"] + "int main() { return 0; }\n")
        pre = subprocess.run(base[:4] + ["-E", "-o", "-"] + base[6:] + [os.path.join(d, "tu.cpp")],
                             check=True, capture_output=True, text=True).stdout
        loader_sees_c10d = "c10d" in "".join(l for l in pre.splitlines() if l.startswith("# "))
    torch = times["torch.h"]
    entries = [{"name": "compile_" + k.split(" (")[0].replace(" + ", "+").replace(", ", "_").replace(" ", "_"), "accel_seconds": v, "baseline": "torch.h alone", "baseline_seconds": torch,
                "ratio": v / torch} for k, v in times.items() if k != "torch.h"]
    for e in entries:
        if e["name"].startswith("compile_loader"):
            e["includes_c10d"] = loader_sees_c10d
    for e in entries:
        if "ratio" in e:
            print(f"{e['name']}: ratio {e['ratio']:.2f} against torch.h alone ({torch:.1f} s)")
    print(f"loader headers include c10d: {loader_sees_c10d}")
    with open(out, "w") as f:
        json.dump(entries, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
