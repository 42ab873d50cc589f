"""The Python side of benchmarks/train_bench.cpp: the same MLPs, random data of the same sizes, the same batch
per process, SGD, 2 CPU processes, through Python Accelerate (which wraps the model in
PyTorch's DistributedDataParallel, Gloo). Run under torchrun; rank 0 writes its figures as JSON.
    torchrun --nproc-per-node 2 python_train.py out.json [large|small]
"""
import json
import sys
import time

import torch
from accelerate import Accelerator

# "large": compute-bound (the GEMMs dominate); "small": the main example's MLP, where per-step overhead dominates.
SIZES = {"large": dict(batch=64, inputs=1024, hidden=2048, layers=4, warmup=3, steps=20),
         "small": dict(batch=32, inputs=64, hidden=128, layers=1, warmup=20, steps=300)}
CLASSES = 10


def main():
    size = sys.argv[2] if len(sys.argv) > 2 else "large"
    cfg = SIZES[size]
    BATCH, IN, HIDDEN, WARMUP, STEPS = cfg["batch"], cfg["inputs"], cfg["hidden"], cfg["warmup"], cfg["steps"]
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU()]
    for _ in range(cfg["layers"] - 1):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, CLASSES))
    n = (WARMUP + STEPS) * BATCH * acc.num_processes
    data = torch.utils.data.TensorDataset(torch.randn(n, IN), torch.randint(0, CLASSES, (n,)))
    best = float("inf")
    for _ in range(2):  # as the C++ side: two runs, the best kept
        model, opt, loader = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=1e-3),
                                         torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True))
        for i, (x, y) in enumerate(loader):
            if i == WARMUP:
                acc.wait_for_everyone()
                t0 = time.perf_counter()
            with acc.accumulate(model):
                acc.backward(torch.nn.functional.cross_entropy(model(x), y))
                opt.step()
                opt.zero_grad()
        acc.wait_for_everyone()
        best = min(best, (time.perf_counter() - t0) / STEPS)
        acc.free_memory()
    if acc.is_main_process:
        out = {"size": size, "python_step_seconds": best, "python_samples_per_s": BATCH * acc.num_processes / best,
               "threads": torch.get_num_threads(), "torch": torch.__version__}
        json.dump(out, open(sys.argv[1], "w"), indent=2)
        print(f"python accelerate + DDP: {best:.4f} s/step ({out['python_samples_per_s']:.1f} samples/s), "
              f"{out['threads']} thread(s) per process")


if __name__ == "__main__":
    main()
