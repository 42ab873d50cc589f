"""Entries of build/bench/results.json for full sharding against PyTorch, from one run of each side on N processes:
accel_bench_zero --model linear52M (its entries, a list) and python_fsdp.py (its figures). Ratios = accel / Python:
- full sharding against fully_shard (FSDP2): step time, peak tensor bytes of a step, tensor bytes resident after it,
  peak resident set of a step above the one before the model;
- DDP against DistributedDataParallel: step time and peak tensor bytes (how far apart the two sides are without
  sharding, for reading the first).
    python fsdp_entries.py zero_linear52M_N.json python_fsdp_N.json out.json
"""
import json
import sys


def main():
    accel = {e["name"]: e for e in json.load(open(sys.argv[1]))}
    py = json.load(open(sys.argv[2]))
    n = py["processes"]
    tag = f"_{n}proc_cpu_adamw_linear52M"
    entries = []

    def add(name, accel_value, kind, field, unit, label, extra=None):
        b = py[kind][field]
        e = {"name": name, "baseline": label, "ratio": accel_value / b, "threads": py["threads"], "torch": py["torch"]}
        if unit == "bytes":
            e.update({"unit": "bytes", "accel_bytes": int(accel_value), "baseline_bytes": int(b)})
        else:
            e.update({"accel_seconds": accel_value, "baseline_seconds": b,
                      "baseline_range_seconds": [py[kind]["step_min_seconds"], py[kind]["step_max_seconds"]]})
        e.update(extra or {})
        entries.append(e)

    fsdp, ddp = "Python fully_shard (FSDP2)", "Python DistributedDataParallel"
    full_step = accel["full_train_step" + tag]
    add("full_train_step" + tag, full_step["accel_seconds"], "fsdp", "step_seconds", "seconds", fsdp,
        {"range_seconds": full_step.get("range_seconds")})
    add("full_step_peak_bytes" + tag, accel["full_step_peak_bytes" + tag]["accel_bytes"], "fsdp", "peak_bytes",
        "bytes", fsdp)
    add("full_resident_bytes" + tag, accel["full_resident_bytes" + tag]["accel_bytes"], "fsdp", "resident_bytes",
        "bytes", fsdp)
    add("full_peak_rss_bytes" + tag, accel["full_peak_rss_bytes" + tag]["accel_bytes"], "fsdp", "peak_rss_bytes",
        "bytes", fsdp)
    # DDP: the baseline side of accel's sharded entries.
    add("ddp_train_step" + tag, full_step["baseline_seconds"], "ddp", "step_seconds", "seconds", ddp,
        {"range_seconds": full_step.get("baseline_range_seconds")})
    add("ddp_step_peak_bytes" + tag, accel["full_step_peak_bytes" + tag]["baseline_bytes"], "ddp", "peak_bytes",
        "bytes", ddp)
    json.dump(entries, open(sys.argv[3], "w"), indent=2)
    for e in entries:
        print(f'{e["name"]:<48} ratio {e["ratio"]:.3f} against {e["baseline"]}')


if __name__ == "__main__":
    main()
