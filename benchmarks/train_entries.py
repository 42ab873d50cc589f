"""Pairs benchmarks/train_bench.cpp's figures with Python Accelerate's (python_train.py) into entries of
build/bench/results.json (ratio = accel time / baseline time, so samples/s ratio = 1 / ratio).
    python train_entries.py accel_train.json python_large.json python_small.json out.json
"""
import json
import sys

accel, large, small = (json.load(open(p)) for p in sys.argv[1:4])
entries = [
    {"name": "train_step_2proc_cpu_mlp14M", "accel_seconds": accel["accel_step_seconds"],
     "baseline": "Python Accelerate + DDP", "baseline_seconds": large["python_step_seconds"],
     "ratio": accel["accel_step_seconds"] / large["python_step_seconds"],
     "samples_per_s_ratio": large["python_step_seconds"] / accel["accel_step_seconds"]},
    {"name": "train_step_2proc_cpu_mlp_small", "accel_seconds": accel["small_accel_step_seconds"],
     "baseline": "Python Accelerate + DDP", "baseline_seconds": small["python_step_seconds"],
     "ratio": accel["small_accel_step_seconds"] / small["python_step_seconds"],
     "samples_per_s_ratio": small["python_step_seconds"] / accel["small_accel_step_seconds"]},
    {"name": "train_step_bucketed_vs_flat", "accel_seconds": accel["accel_step_seconds"],
     "baseline": "one flat all-reduce after backward", "baseline_seconds": accel["flat_step_seconds"],
     "ratio": accel["accel_step_seconds"] / accel["flat_step_seconds"]},
    {"name": "allreduce_exposed_in_backward", "accel_seconds": max(0.0, accel["backward_sync_seconds"] - accel["backward_local_seconds"]),
     "baseline": "the same all-reduce alone", "baseline_seconds": accel["allreduce_alone_seconds"],
     "ratio": max(0.0, accel["backward_sync_seconds"] - accel["backward_local_seconds"]) / accel["allreduce_alone_seconds"],
     "hidden_fraction": accel["hidden_fraction"]},
]
json.dump(entries, open(sys.argv[4], "w"), indent=2)
