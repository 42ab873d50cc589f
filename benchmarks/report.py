"""Turns Google Benchmark JSON into build/bench/results.json entries.

A benchmark named BM_<work>_accel is paired with BM_<work>_<baseline> from the same run; the entry's ratio
is accel time / baseline time (median of the repetitions). Other fields: the counters of the accel side.
Files holding a list are entries already in the results format (multi-process benchmarks), merged as they are.
An entry measures seconds ("accel_seconds", "baseline_seconds") unless it names another unit: {"unit": "bytes"}
entries carry "accel_bytes" and "baseline_bytes" instead, and their ratio is accel bytes / baseline bytes.
    python report.py BASELINE_LABELS_JSON results.json bench1.json [bench2.json ...]
"""
import json
import sys


def medians(path):
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("aggregate_name") == "median":
            out[b["run_name"].split("/")[0]] = b
    return out


def main():
    labels = json.loads(sys.argv[1])
    results_path = sys.argv[2]
    try:
        results = json.load(open(results_path))
    except (OSError, ValueError):
        results = []
    for path in sys.argv[3:]:
        data = json.load(open(path))
        if isinstance(data, list):  # entries already in the results format (multi-process benchmarks)
            for entry in data:
                results = [r for r in results if not (r["name"] == entry["name"] and r["baseline"] == entry["baseline"])]
                results.append(entry)
            continue
        runs = medians(path)
        for name, accel in runs.items():
            if not name.endswith("_accel"):
                continue
            work = name[: -len("_accel")]
            for base_name, base in runs.items():
                suffix = base_name[len(work) + 1:]
                if base_name.startswith(work + "_") and suffix != "accel":
                    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
                    a = accel["real_time"] * scale[accel["time_unit"]]
                    b = base["real_time"] * scale[base["time_unit"]]
                    entry = {"name": work.removeprefix("BM_"), "accel_seconds": a,
                             "baseline": labels.get(suffix, suffix), "baseline_seconds": b, "ratio": a / b}
                    entry.update({k: v for k, v in accel.items() if k in ("batches", "bytes_per_batch")})
                    results = [r for r in results if not (r["name"] == entry["name"] and r["baseline"] == entry["baseline"])]
                    results.append(entry)
    json.dump(results, open(results_path, "w"), indent=2)
    for r in results:
        unit = r.get("unit", "seconds")
        if unit == "seconds":
            a, b, u = r["accel_seconds"], r["baseline_seconds"], "s"
        else:
            a, b, u = r[f"accel_{unit}"], r[f"baseline_{unit}"], {"bytes": "B"}.get(unit, unit)
        print(f'{r["name"]:<32} accel {a:.3e} {u}  {r["baseline"]:<28} {b:.3e} {u}  ratio {r["ratio"]:.3f}')


if __name__ == "__main__":
    main()
