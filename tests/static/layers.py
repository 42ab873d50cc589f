#!/usr/bin/env python3
"""The library's layers, checked: every #include <accel/...> in include/accel points to the same layer or one below.

    base        error.hpp, detail/, policy/, config.hpp   tags, resolved configuration, errors
    core        core/                                     tensor structures, serialisation, generator state
    tracking    tracking/                                 experiment trackers: JSONL, CSV, TensorBoard event files
    plan        plan/                                     sharding plans: pure index math
    comm        comm/, cuda/nccl.hpp, cuda/connect.hpp,   communicator interface, engines' collectives, RNG sync
                cuda/rng.hpp
    state       state/                                    launch environment, engines, ProcessState, GradientState
    data        data/ (but the four below)                the user's vocabulary: datasets, samplers, shards,
                                                          options, collate, LoaderState
    pipeline    pipeline/, cuda/placement.hpp,            a prepared loader's machinery: step sources, transports,
                data/data_loader.hpp, data/loader.hpp,    loader core, cursor, workers, placement, plan view; and
                data/prepared_loader.hpp, data/prepare.hpp  data/'s loaders, which run it (namespace accel::data:
                                                          the user names them; DataLoader iterates as a one-process
                                                          prepared loader)
    model       model/                                    DistributedModule, PreparedModel, autocast
    optim       optim/                                    accumulation, optimizer/scheduler wrappers, GradScaler
    checkpoint  checkpoint/                               checkpoint layout and orchestration
    top         accelerator.hpp, accelerator/, accel.hpp  the user's surface; src.hpp compiles the separate
                src.hpp                                   compilation mode's code (detail/linkage.hpp)

Also checked: each folder's headers declare one namespace (besides accel::detail), every function declared
`ACCEL_DECL` is defined under `#if ACCEL_DEFINITIONS`, and a member so defined is declared `ACCEL_DECL` in its class
too (include/accel/detail/linkage.hpp). Exits non-zero naming every
problem found.
"""
import pathlib
import re
import sys

LAYERS = ["base", "core", "tracking", "plan", "comm", "state", "data", "pipeline", "model", "optim", "checkpoint", "top"]
SPECIAL = {"error.hpp": "base", "config.hpp": "base", "accelerator.hpp": "top", "accel.hpp": "top",
           "src.hpp": "top",
           "cuda/nccl.hpp": "comm", "cuda/connect.hpp": "comm", "cuda/rng.hpp": "comm", "cuda/placement.hpp": "pipeline",
           # the loaders a user names (data/'s namespace), which run the pipeline
           "data/data_loader.hpp": "pipeline", "data/prepared_loader.hpp": "pipeline", "data/prepare.hpp": "pipeline",
           "data/loader.hpp": "pipeline"}
FOLDER = {"detail": "base", "policy": "base", "accelerator": "top"}
# The namespace every header of a folder declares its public names in.
NAMESPACE = {"core": "accel", "tracking": "accel::tracking", "plan": "accel::plan", "comm": "accel::comm|accel", "state": "accel",
             "data": "accel::data", "pipeline": "accel::pipeline", "model": "accel", "optim": "accel", "checkpoint": "accel::checkpoint",
             "accelerator": "accel"}


def layer_of(rel: str) -> str:
    if rel in SPECIAL:
        return SPECIAL[rel]
    folder = rel.split("/")[0]
    return FOLDER.get(folder, folder)


def linkage_problems(rel: str, text: str) -> list:
    """How ACCEL_DECL is used (detail/linkage.hpp). A function declared ACCEL_DECL is defined only under
    `#if ACCEL_DEFINITIONS`: in separate compilation a definition outside it would be a non-inline definition in every
    translation unit that includes the header (duplicate symbols)."""
    out, depth, guarded = [], 0, []
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if line.startswith("#if"):
            guarded.append("ACCEL_DEFINITIONS" in line)
        elif line.startswith("#endif") and guarded:
            guarded.pop()
        elif re.match(r"^\s*(\[\[\w+\]\] )*ACCEL_DECL ", line) and not any(guarded):
            # the declaration's lines, up to its ';' or '{'
            k = n - 1
            while not re.search(r"[;{]\s*$", lines[k]) and k + 1 < len(lines):
                k += 1
            if lines[k].rstrip().endswith("{"):
                out.append(f"{rel}:{n}: an ACCEL_DECL function defined outside #if ACCEL_DEFINITIONS")
    # A member defined out of class carries ACCEL_DECL on its declaration in the class too: header-only, an
    # out-of-class `inline` virtual would otherwise become the key function and emit the class's vtable and every
    # virtual function in each translation unit (Note [Separate compilation]).
    for cls, name in re.findall(r"^(?:\[\[\w+\]\] )*ACCEL_DECL .*?\b(\w+)::(~?\w+)\(", text, flags=re.M):
        body = re.search(r"^(?:class|struct) " + cls + r"\b[^;]*?\{\n(.*?)^\};", text, flags=re.M | re.S)
        if body and not re.search(r"^ +(?:\[\[\w+\]\] )*ACCEL_DECL .*\b" + re.escape(name) + r"\(", body.group(1), flags=re.M):
            out.append(f"{rel}: {cls}::{name} is ACCEL_DECL out of class but not on its declaration in the class")
    return out


def main(root: str) -> int:
    inc = pathlib.Path(root) / "include" / "accel"
    problems = []
    for path in sorted(inc.rglob("*.hpp")):
        rel = path.relative_to(inc).as_posix()
        mine = layer_of(rel)
        if mine not in LAYERS:
            problems.append(f"{rel}: in no layer (add its folder to tests/static/layers.py and to the README's layout)")
            continue
        text = path.read_text()
        for target in re.findall(r'#include <accel/([^>]+)>', text):
            theirs = layer_of(target)
            if theirs in LAYERS and LAYERS.index(theirs) > LAYERS.index(mine):
                problems.append(f"{rel} ({mine}) includes accel/{target} ({theirs}): a back edge")
        folder = rel.split("/")[0]
        if folder in NAMESPACE:
            for ns in re.findall(r'^namespace ([a-z_:]+) \{', text, flags=re.M):
                full = ns if ns.startswith("accel") else None
                if full and not re.fullmatch(NAMESPACE[folder] + r"(::detail)?", full):
                    problems.append(f"{rel}: namespace {full} in folder {folder}/ (expected {NAMESPACE[folder]})")
        problems += linkage_problems(rel, text)
    for p in problems:
        print(p)
    print(f"{len(list(inc.rglob('*.hpp')))} headers checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
