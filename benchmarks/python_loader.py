"""Python Accelerate's prepared DataLoaderShard on the same work as loader_bench.cpp: one shuffled epoch of
rank 0 of 2 over a tensor dataset of 1e6 samples x 16 floats + a label, batch 64, same torch.
Writes [{"name", "accel_seconds", "baseline", "baseline_seconds", "ratio"}] using accel's median from the C++
benchmark's JSON (same machine, same run of scripts/bench).
    python python_loader.py build/bench/loader.json build/bench/python_loader.json
"""
import json
import sys
import time

import torch
from accelerate import Accelerator
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader, TensorDataset


def main():
    accel_json, out_path = sys.argv[1], sys.argv[2]
    Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(1_000_000, 16)
    y = torch.randint(10, (1_000_000,))
    dl = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    prepared = prepare_data_loader(dl, num_processes=2, process_index=0, rng_types=["generator"])
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        batches = sum(1 for _ in prepared)
        times.append(time.perf_counter() - t0)
    python = sorted(times)[1]
    accel = None
    for b in json.load(open(accel_json))["benchmarks"]:
        if b["run_name"].startswith("BM_loader_epoch_accel") and b.get("aggregate_name") == "median":
            accel = b["real_time"] / 1e3  # milliseconds
    entry = {"name": "loader_epoch", "accel_seconds": accel, "baseline": "Python Accelerate DataLoaderShard",
             "baseline_seconds": python, "ratio": accel / python, "batches": batches}
    json.dump([entry], open(out_path, "w"), indent=2)
    print(f"Python Accelerate: {python:.3f} s per epoch ({batches} batches); accel {accel:.3f} s; ratio {accel / python:.4f}")


if __name__ == "__main__":
    main()
