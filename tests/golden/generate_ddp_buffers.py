"""Golden vectors for DDP's buffer broadcast (broadcast_buffers=True, PyTorch's and Accelerate's default).

A Linear-BatchNorm1d-ReLU-Linear model trained by PyTorch's DistributedDataParallel on 2 and 3 CPU processes (Gloo,
127.0.0.1): gradient accumulation over 2 micro-batches with `no_sync` on the first (as Accelerate's `accumulate`
does), so that DDP's rule shows: rank 0's buffers are broadcast before a forward only when the previous forward
ran with gradients and outside `no_sync`. Then an evaluation forward under `no_grad` in eval mode. Every rank's
parameters and buffers are written after training and after evaluation.

Usage: python generate_ddp_buffers.py model/ddp_buffers.json   (the venv of scripts/lib.sh has torch)
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

B = 4           # rows per process and micro-batch
STEPS = 6       # micro-batches per process (3 optimizer steps)
LR = 0.1


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def data(n_proc):
    g = torch.Generator().manual_seed(1)
    rows = STEPS * B * n_proc
    return torch.randn(rows, 4, generator=g) * 2 + 1, torch.randn(rows, 2, generator=g), torch.randn(8, 4, generator=g)


def state(m):
    return {k: v.detach().double().flatten().tolist() for k, v in m.state_dict().items()}


def worker(rank, n_proc, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=n_proc)
    net = model()
    if rank != 0:  # different weights elsewhere: DDP broadcasts rank 0's at construction
        with torch.no_grad():
            for p in net.parameters():
                p.add_(1.0)
    ddp = torch.nn.parallel.DistributedDataParallel(net, broadcast_buffers=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    x, y, x_eval = data(n_proc)
    for j in range(STEPS):  # this rank's j-th batch is global batch j * n_proc + rank (a sharded loader, no shuffle)
        g = j * n_proc + rank
        xb, yb = x[g * B:(g + 1) * B], y[g * B:(g + 1) * B]
        sync = j % 2 == 1
        if sync:
            loss = torch.nn.functional.mse_loss(ddp(xb), yb)
            (loss / 2).backward()
            opt.step()
            opt.zero_grad()
        else:
            with ddp.no_sync():
                loss = torch.nn.functional.mse_loss(ddp(xb), yb)
                (loss / 2).backward()
    trained = state(net)
    ddp.eval()
    with torch.no_grad():
        out = ddp(x_eval)
    queue.put((rank, trained, state(net), out.double().flatten().tolist()))
    dist.destroy_process_group()


def run(n_proc, port):
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, n_proc, port, queue)) for r in range(n_proc)]
    for p in procs:
        p.start()
    results = sorted(queue.get() for _ in procs)
    for p in procs:
        p.join()
    x, y, x_eval = data(n_proc)
    net = model()
    return {
        "num_processes": n_proc,
        "batch_size": B,
        "steps": STEPS,
        "lr": LR,
        "initial": state(net),
        "x": x.double().flatten().tolist(),
        "y": y.double().flatten().tolist(),
        "x_eval": x_eval.double().flatten().tolist(),
        "ranks": [{"after_training": t, "after_evaluation": e, "eval_output": o} for _, t, e, o in results],
    }


if __name__ == "__main__":
    out = {"meta": {"torch": torch.__version__, "what": __doc__.strip().splitlines()[0]},
           "cases": [run(2, 29651), run(3, 29652)]}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
