#!/usr/bin/env python3
"""The joined-step door, checked (Note [The joined-step door] in include/accel/state/gradient_state.hpp).

Under uneven tails a rank that runs out of batches repeats the calls of its last step, so every call of the user's
surface that talks to the other ranks during a step must pass through `GradientState::joined`, the one door that
records it. A helper that forgets it would hang or diverge only on the rank that runs out first, at run time. This
check fails instead: in the headers of the user's surface (the Accelerator's members, the prepared model and the
prepared optimizer and scheduler), every line that issues a collective must lie inside the arguments of a
`joined(...)` call, or say on that line (or the line above) why it is not a step's call:
`// not a step call: <reason>`.

A line issues a collective when it hands the communicator to a call (`f(..., comm())`, `state_.comm()`), calls
one of its members, or calls one of the known collective members of the layers below (a DistributedModule's
`synchronize`/`before_forward`, a sharded optimizer's or a scaler's `step`, `reduce_flag`).

    joined_steps.py ROOT     exits non-zero naming every line found
"""
import pathlib
import re
import sys

SURFACE = ["accelerator.hpp", "accelerator/*.hpp", "model/prepared_model.hpp", "optim/accelerated.hpp"]
COLLECTIVE = re.compile(
    r"(?:\w\(|,)\s*(?:state_\.)?comm\(\)"        # the communicator handed to a collective (or to a component)
    r"|\bcomm\(\)->|\bcomm_->"                   # a member of the communicator
    r"|->synchronize\(|\bbefore_forward\("       # DistributedModule: the gradient all-reduce, the buffers' broadcast
    r"|sharded->step\(|scaler_?->step\("         # ZeRO's all-gather, the scaler's inf/NaN all-reduce
    r"|\breduce_flag\(|\bcheck_replicas\(")      # the Accelerator's own flags and replica check
EXEMPT = "// not a step call:"
# A declaration, or the head of a definition, of one of the collective members: not a call.
DECLARATION = re.compile(r"^\s*(?:\[\[\w+\]\]\s*)?[\w:<>]+\s+(?:[\w<>.]+::)?(?:reduce_flag|check_replicas)\(")


def code_of(line: str) -> str:
    """The line without its comment (a string literal holding `//` is not expected in these lines)."""
    return line.split("//", 1)[0]


def exempt(lines: list, i: int) -> bool:
    """Whether the statement holding line `i` (0-based) says why it is not a step's call: on one of its lines, or on
    the line above it (a statement starts after a line that ends in `;`, `{` or `}`)."""
    first = i
    while first > 0 and not re.search(r"[;{}]\s*(//.*)?$", lines[first - 1]) and EXEMPT not in lines[first - 1]:
        first -= 1
    return any(EXEMPT in lines[k] for k in range(max(first - 1, 0), i + 1))


def door_spans(text: str) -> list:
    """(start, end) offsets of the argument lists of every `joined(` call."""
    spans = []
    for m in re.finditer(r"\bjoined\(", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        spans.append((m.end(), i))
    return spans


def problems_of(rel: str, text: str) -> list:
    out = []
    # comments blanked (kept as spaces, so offsets and lines stay), for the door's spans
    bare = re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), text)
    spans = door_spans(bare)
    lines = text.split("\n")
    offset = 0
    for n, line in enumerate(lines, 1):
        start = offset
        offset += len(line) + 1
        code = code_of(line)
        if line.lstrip().startswith("#") or not COLLECTIVE.search(code) or DECLARATION.search(code):
            continue
        at = start + COLLECTIVE.search(code).start()
        if any(a <= at < b for a, b in spans):
            continue
        if exempt(lines, n - 1):
            continue
        out.append(f"{rel}:{n}: issues a collective outside GradientState::joined (Note [The joined-step door]): "
                   f"`{code.strip()}`; route it through the door, or say why it is not a step's call ({EXEMPT} ...)")
    return out


SELF_TEST = """
double Accelerator<Policies...>::forgot(const at::Tensor& x) { return accel::reduce(state_.comm(), x).item<double>(); }
at::Tensor Accelerator<Policies...>::through(const at::Tensor& x) {
  return GradientState::joined(GradientState::CallKind::collective, [&] { return accel::gather(state_.comm(), x); },
                               [&] { return [] {}; });
}
void Accelerator<Policies...>::exempt() {
  d->synchronize();  // not a step call: a reason
}
"""


def self_test() -> bool:
    """The check finds a collective outside the door, and accepts one inside it or with its reason."""
    found = problems_of("self_test.hpp", SELF_TEST)
    return len(found) == 1 and found[0].startswith("self_test.hpp:2:")


def main(root: str) -> int:
    if not self_test():
        print("joined_steps.py: the self-test failed: the check no longer tells a collective outside the door")
        return 2
    inc = pathlib.Path(root) / "include" / "accel"
    files = sorted({p for pattern in SURFACE for p in inc.glob(pattern)})
    problems = []
    for path in files:
        problems += problems_of(path.relative_to(inc).as_posix(), path.read_text())
    for p in problems:
        print(p)
    print(f"{len(files)} headers checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
