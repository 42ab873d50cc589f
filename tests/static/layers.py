#!/usr/bin/env python3
"""The library's layers, checked: every #include <accel/...> in include/accel points to the same layer or one below.

    base        error.hpp, detail/, policy/, config.hpp   tags, resolved configuration, errors
    core        core/                                     tensor structures, serialisation, generator state
    tracking    tracking/                                 experiment trackers: JSONL, CSV, TensorBoard event files
    plan        plan/                                     sharding plans: pure index math
    comm        comm/ (but the engines), cuda/rng.hpp     communicator interface, collectives, RNG sync
    rendezvous  state/rendezvous/                         where a job meets: store, listening, heartbeat, job identity
    engines     comm/gloo.hpp, comm/connect.hpp,          the engines: Gloo and NCCL communicators and their
                cuda/nccl.hpp, cuda/connect.hpp           constructors' declarations
    state       state/                                    launch environment, engine choice, ProcessState, GradientState
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

An `impl/*.ipp` file (the definitions a header keeps out of user code under ACCEL_SEPARATE_COMPILATION) belongs to
the layer of its header, `<folder>/<name>.hpp` beside `<folder>/impl/<name>.ipp` (its folder's layer, or the special
case above: cuda/impl/nccl.ipp is comm, cuda/impl/placement.ipp is data).

Also checked (include/accel/detail/linkage.hpp, Note [Separate compilation]): each folder's headers declare one
namespace (besides accel::detail); a header defines no `ACCEL_DECL` function (the definitions are in its .ipp) and
uses `ACCEL_DEFINITIONS` only in its last three lines, `#if ACCEL_DEFINITIONS` / `#include <accel/<folder>/impl/
<name>.ipp>` / `#endif`, the .ipp beside it; every .ipp is included that way by its header and nowhere else, opens
with `#pragma once` and a `//! \file` comment, and defines something `ACCEL_DECL` or a template; and a member defined
in an .ipp is declared `ACCEL_DECL` in its class too. Exits non-zero naming every problem found.
"""
import pathlib
import re
import sys

LAYERS = ["base", "core", "tracking", "plan", "comm", "rendezvous", "engines", "state", "data", "pipeline", "model", "optim",
          "checkpoint", "top"]
SPECIAL = {"error.hpp": "base", "config.hpp": "base", "accelerator.hpp": "top", "accel.hpp": "top",
           "src.hpp": "top",
           "comm/gloo.hpp": "engines", "comm/connect.hpp": "engines", "cuda/nccl.hpp": "engines",
           "cuda/connect.hpp": "engines", "cuda/rng.hpp": "comm", "cuda/placement.hpp": "pipeline",
           # the loaders a user names (data/'s namespace), which run the pipeline
           "data/data_loader.hpp": "pipeline", "data/prepared_loader.hpp": "pipeline", "data/prepare.hpp": "pipeline",
           "data/loader.hpp": "pipeline"}
FOLDER = {"detail": "base", "policy": "base", "accelerator": "top", "state/rendezvous": "rendezvous"}
# The namespace every header of a folder declares its public names in.
NAMESPACE = {"core": "accel", "tracking": "accel::tracking", "plan": "accel::plan", "comm": "accel::comm|accel", "state": "accel",
             "state/rendezvous": "accel::rendezvous",
             "data": "accel::data", "pipeline": "accel::pipeline", "model": "accel", "optim": "accel", "checkpoint": "accel::checkpoint",
             "accelerator": "accel",
             # a specialisation is declared in its primary template's namespace (cuda/rng.hpp, cuda/placement.hpp)
             "cuda": "accel::cuda|accel|accel::pipeline"}


def layer_of(rel: str) -> str:
    if rel in SPECIAL:
        return SPECIAL[rel]
    return FOLDER.get(folder_of(rel), folder_of(rel))


def folder_of(rel: str) -> str:
    """A header's folder: its first directory, or a subfolder with a layer of its own (state/rendezvous)."""
    two = "/".join(rel.split("/")[:2])
    return two if two in FOLDER or two in NAMESPACE else rel.split("/")[0]


def header_of(rel: str) -> str:
    """`comm/impl/gloo.ipp` -> `comm/gloo.hpp`."""
    folder, _, name = rel.rpartition("/impl/")
    return f"{folder}/{name[:-len('.ipp')]}.hpp"


def linkage_problems(rel: str, text: str, texts: dict) -> list:
    """How ACCEL_DECL and ACCEL_DEFINITIONS are used (detail/linkage.hpp). In separate compilation a function
    declared ACCEL_DECL is not inline: defined in a header, it would be defined in every translation unit that
    includes it (duplicate symbols); its definition is in an .ipp, which the header includes only where
    ACCEL_DEFINITIONS holds (header-only, or <accel/src.hpp>'s translation unit)."""
    out = []
    lines = text.rstrip("\n").split("\n")
    if rel.endswith(".hpp"):
        for n, line in enumerate(lines, 1):
            if re.match(r"^\s*(\[\[\w+\]\] )*ACCEL_DECL ", line):
                k = n - 1  # the declaration's lines, up to its ';' or '{'
                code = lambda k: lines[k].split("//")[0].rstrip()
                while not re.search(r"[;{]$", code(k)) and k + 1 < len(lines):
                    k += 1
                if code(k).endswith("{"):
                    out.append(f"{rel}:{n}: an ACCEL_DECL function defined in a header (its definition belongs in an impl/*.ipp)")
        uses = [n for n, line in enumerate(lines, 1) if "ACCEL_DEFINITIONS" in line and not line.lstrip().startswith("//")]
        if uses and rel != "detail/linkage.hpp":
            folder, _, name = rel.rpartition("/")
            want = ["#if ACCEL_DEFINITIONS", f"#include <accel/{folder}/impl/{name[:-4]}.ipp>", "#endif"]
            if lines[-3:] != want or uses != [len(lines) - 2]:
                out.append(f"{rel}: ACCEL_DEFINITIONS used other than as its last three lines: " + " / ".join(want))
    else:
        if not text.startswith("#pragma once\n//! \\file\n"):
            out.append(f"{rel}: an .ipp opens with #pragma once and a //! \\file comment naming its header")
        if not re.search(r"^(\[\[\w+\]\] )*ACCEL_DECL |^template <", text, flags=re.M):
            out.append(f"{rel}: an .ipp without an ACCEL_DECL definition or a template")
        line = f"#include <accel/{rel}>"
        includers = [h for h, t in texts.items() if line in t.split("\n")]
        if includers != [header_of(rel)]:
            out.append(f"{rel}: included by {includers or 'nothing'}; only {header_of(rel)} includes it (its last lines)")
        # A member defined here carries ACCEL_DECL on its declaration in the class too: header-only, an
        # out-of-class `inline` virtual would otherwise become the key function and emit the class's vtable and
        # every virtual function in each translation unit (Note [Separate compilation]).
        header = texts.get(header_of(rel), "")
        for cls, name in re.findall(r"^(?:\[\[\w+\]\] )*ACCEL_DECL [^(]*?\b(\w+)::(~?\w+)\(", text, flags=re.M):
            body = re.search(r"^(?:class|struct) " + cls + r"\b[^;]*?\{\n(.*?)^\};", header, flags=re.M | re.S)
            if not body or not re.search(r"^ +(?:\[\[\w+\]\] )*ACCEL_DECL .*\b" + re.escape(name) + r"\(", body.group(1), flags=re.M):
                out.append(f"{rel}: {cls}::{name} is defined ACCEL_DECL here but not declared ACCEL_DECL in its class ({header_of(rel)})")
    return out


def main(root: str) -> int:
    inc = pathlib.Path(root) / "include" / "accel"
    problems = []
    files = sorted(list(inc.rglob("*.hpp")) + list(inc.rglob("*.ipp")))
    texts = {p.relative_to(inc).as_posix(): p.read_text() for p in files}
    for path in files:
        rel = path.relative_to(inc).as_posix()
        mine = layer_of(header_of(rel) if rel.endswith(".ipp") else rel)
        if mine not in LAYERS:
            problems.append(f"{rel}: in no layer (add its folder to tests/static/layers.py and to the README's layout)")
            continue
        text = path.read_text()
        for target in re.findall(r'^#include <accel/([^>]+)>', text, flags=re.M):
            theirs = layer_of(target)
            if theirs in LAYERS and LAYERS.index(theirs) > LAYERS.index(mine):
                problems.append(f"{rel} ({mine}) includes accel/{target} ({theirs}): a back edge")
        folder = folder_of(rel)
        if folder in NAMESPACE:
            for ns in re.findall(r'^namespace ([a-z_:]+) \{', text, flags=re.M):
                full = ns if ns.startswith("accel") else None
                if full and not re.fullmatch(NAMESPACE[folder] + r"(::detail)?", full):
                    problems.append(f"{rel}: namespace {full} in folder {folder}/ (expected {NAMESPACE[folder]})")
        problems += linkage_problems(rel, text, texts)
    for p in problems:
        print(p)
    print(f"{len(files)} headers and .ipp files checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
