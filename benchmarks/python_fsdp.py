"""The Python side of `accel_bench_zero --model linear52M` (benchmarks/zero_bench.cpp): the same model, data sizes,
optimizer, steps and threads through PyTorch's FSDP2 (`fully_shard` on each Linear, then on the root; Gloo) and
through DistributedDataParallel (25 MiB buckets, as accel's DDP), on N CPU processes. Run under torchrun; rank 0
writes its figures as JSON.
    torchrun --nproc-per-node 2 python_fsdp.py out.json build/benchmarks/libaccel_bench_tensor_counter.so

The model: 8 x Linear(2560, 2560) with ReLU between (52,480,000 parameters), AdamW (lr 1e-4), batch 8 per process of
randn rows, loss mse_loss(model(x), y), a step = forward, backward, step, zero_grad. Time: the median (and range) of
10 steps after 2 warm-up steps, a barrier before each, `torch.set_num_threads(OMP_NUM_THREADS)` (1 unless set).

Memory, per rank, measured on a second, fresh model, in an untimed step:
- tensor bytes: PyTorch has no CPU allocator statistics, so this process loads accel_bench_zero's own counter
  (tensor_counter.hpp, built as libaccel_bench_tensor_counter.so, argv[2]) through ctypes before any tensor is made:
  every CPU tensor allocation of the process, any thread, malloc_usable_size bytes, exactly as the C++ side counts.
  "peak": the most bytes alive at once during one step after 2 warm-up steps, above what the rank held before the
  model was built; "resident": after the step. (The profiler's memory accounting was tried first and dropped: it
  showed 1.3 GB resident for fully_shard where this counter shows 0.31 GB. It subtracts only frees made on threads the
  profiler follows; our unverified reading is that FSDP2's collective buffers are released on Gloo's threads.)
- the resident set: VmHWM after resetting it (/proc/self/clear_refs) minus VmRSS before the model was built, with the
  heap trimmed and every block of 1 MiB or more mmapped during the step (mallopt), as accel_bench_zero does.
- parameters, gradients (after the synchronising backward) and optimizer state: bytes of the distinct storages of the
  local tensors (a DTensor's `to_local()`).
"""
import ctypes
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

WIDTH, LAYERS, BATCH, WARMUP, STEPS = 2560, 8, 8, 2, 10
LIBC = ctypes.CDLL("libc.so.6")
COUNTER = None  # libaccel_bench_tensor_counter.so
M_MMAP_THRESHOLD = -3


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return 1024 * int(line.split()[1])
    return 0


def rss_follows_tensors(on):
    if on:
        LIBC.malloc_trim(0)
    LIBC.mallopt(M_MMAP_THRESHOLD, (1 << 20) if on else (32 << 20))


def make_model():
    torch.manual_seed(3)
    layers = []
    for i in range(LAYERS):
        layers.append(torch.nn.Linear(WIDTH, WIDTH))
        if i < LAYERS - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def wrap(kind, net, mesh):
    if kind == "fsdp":
        for m in net:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net
    return torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=25)


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def storage_bytes(tensors):
    seen = {}
    for t in tensors:
        t = local(t)
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def batch(rank):
    torch.manual_seed(100 + rank)
    return torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)


def step(model, opt, x, y):
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def timed(kind, mesh, rank):
    gc.collect()
    net = wrap(kind, make_model(), mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    x, y = batch(rank)
    times = []
    for s in range(WARMUP + STEPS):
        dist.barrier()
        t0 = time.perf_counter()
        step(net, opt, x, y)
        if s >= WARMUP:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def memory(kind, mesh, rank):
    gc.collect()  # the timed model: FSDP2's modules are in reference cycles, freed by the collector only
    rss_follows_tensors(True)
    rss_before = status("VmRSS:")
    before = COUNTER.accel_bench_tensor_live()
    out = {}
    net = make_model()
    model = wrap(kind, net, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = batch(rank)
    for _ in range(WARMUP):
        step(model, opt, x, y)
    dist.barrier()
    time.sleep(0.2)  # as accel_bench_zero: Gloo's workers let go of the last collective's buffers
    dist.barrier()
    rss_follows_tensors(True)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    COUNTER.accel_bench_tensor_reset_peak()
    F.mse_loss(model(x), y).backward()
    out["gradient_bytes"] = storage_bytes([p.grad for p in model.parameters() if p.grad is not None])
    opt.step()
    opt.zero_grad()
    out["peak_bytes"] = COUNTER.accel_bench_tensor_peak() - before
    out["peak_rss_bytes"] = status("VmHWM:") - rss_before
    rss_follows_tensors(False)
    dist.barrier()
    time.sleep(0.2)
    dist.barrier()
    out["resident_bytes"] = COUNTER.accel_bench_tensor_live() - before
    out["parameter_bytes"] = storage_bytes(list(model.parameters()))
    out["state_bytes"] = sum(local(v).nbytes for st in opt.state.values() for v in st.values()
                             if isinstance(v, torch.Tensor))
    del model, net, opt
    return out


def main():
    global COUNTER
    COUNTER = ctypes.CDLL(sys.argv[2])
    COUNTER.accel_bench_tensor_live.restype = ctypes.c_longlong
    COUNTER.accel_bench_tensor_peak.restype = ctypes.c_longlong
    COUNTER.accel_bench_count_tensor_bytes()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ranks,))
    figures = {}
    for kind in ("ddp", "fsdp"):
        med, lo, hi = timed(kind, mesh, rank)
        figures[kind] = {"step_seconds": med, "step_min_seconds": lo, "step_max_seconds": hi,
                         **memory(kind, mesh, rank)}
    gathered = [None] * ranks
    dist.all_gather_object(gathered, figures)
    if rank == 0:
        # Each figure is the largest over the ranks (what each rank must provide), as accel_bench_zero's entries.
        out = {"processes": ranks, "threads": threads, "torch": torch.__version__, "steps": STEPS,
               "memory_method": "tensor bytes: accel_bench_zero's TensorCounter (every CPU tensor allocation, any "
                                "thread) above before the model was built; rss: VmHWM - VmRSS before",
               "per_rank": gathered}
        for kind in ("ddp", "fsdp"):
            out[kind] = {k: max(g[kind][k] for g in gathered) for k in gathered[0][kind]}
        json.dump(out, open(sys.argv[1], "w"), indent=2)
        for kind in ("ddp", "fsdp"):
            f = out[kind]
            print(f"python {kind:<4} {ranks} processes: step {1e3 * f['step_seconds']:.1f} ms "
                  f"({1e3 * f['step_min_seconds']:.1f}-{1e3 * f['step_max_seconds']:.1f}), parameters "
                  f"{f['parameter_bytes'] / 1e6:.1f} MB, gradients {f['gradient_bytes'] / 1e6:.1f} MB, state "
                  f"{f['state_bytes'] / 1e6:.1f} MB, peak {f['peak_bytes'] / 1e6:.1f} MB, resident "
                  f"{f['resident_bytes'] / 1e6:.1f} MB, peak RSS - before {f['peak_rss_bytes'] / 1e6:.1f} MB")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
