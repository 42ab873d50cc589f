#!/usr/bin/env python3
"""Plots every ratio of build/bench/results.json against its goal: one horizontal bar per entry (accel / baseline,
log scale; left of 1 is faster than the baseline, or smaller for an entry in bytes), the goal marked where the entry
has one. matplotlib from the pinned Python environment (scripts/requirements.lock).

    plot.py results.json out.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Goals of entries that do not carry their own "goal" field (benchmarks/README.md says where each comes from).
GOALS = {"all_reduce": 1.05, "gather": 1.05, "broadcast": 1.05, "rendezvous": 2.0, "compile_torch.h+accel.hpp": 1.3,
         "train_step": 1.02, "epoch": 1.0}


def goal_of(entry):
    if "goal" in entry:
        return entry["goal"]
    for prefix, goal in GOALS.items():
        if entry["name"].startswith(prefix):
            return goal
    return None


def main():
    results = [r for r in json.load(open(sys.argv[1])) if r.get("ratio", 0) > 0]
    results.sort(key=lambda r: r["name"])
    labels = [f'{r["name"]}  (vs {r["baseline"]})' + (f' [{r["unit"]}]' if r.get("unit", "seconds") != "seconds" else "")
              for r in results]
    ratios = [r["ratio"] for r in results]
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(results) + 1.5))
    colors = []
    for r in results:
        g = goal_of(r)
        colors.append("#999999" if g is None else ("#2a9d4b" if r["ratio"] <= g else "#d1495b"))
    ax.barh(range(len(results)), ratios, color=colors)
    for i, r in enumerate(results):
        g = goal_of(r)
        if g is not None:
            ax.plot([g, g], [i - 0.4, i + 0.4], color="black", linewidth=2)
        ax.text(r["ratio"] * 1.03, i, f'{r["ratio"]:.3g}', va="center", fontsize=7)
    ax.axvline(1.0, color="#444444", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(results)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("accel / baseline: time, or bytes for entries marked [bytes] (log scale; black tick: goal; green: goal met, "
                  "red: missed, grey: no goal)")
    ax.set_title("accel side by side with its baselines (build/bench/results.json)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"plot: {sys.argv[2]} ({len(results)} ratios)")


if __name__ == "__main__":
    main()
