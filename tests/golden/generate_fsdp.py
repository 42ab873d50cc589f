"""Golden trajectories of PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`), cross-checked against DDP.

A Linear(6,10)-Tanh-Linear(10,10)-Tanh-Linear(10,4) model (float32), `fully_shard` on each Linear and then on the
root Sequential (reshard_after_forward=True, the default), trained on 2 and 3 CPU processes (Gloo, 127.0.0.1; FSDP2
shards every parameter along dim 0, so with 3 the 10 rows split 4, 4, 2 and the last Linear's 4 rows 2, 2, 0: padded
shards, meta.shard_rows). For SGD (lr 0.1, momentum 0.9) and AdamW (lr 0.01, weight_decay 0.01) and each variant:
`plain` (4 steps of zero_grad, forward, backward, step), `accumulate` (3 steps of 2 micro-batches, the first under
`set_requires_gradient_sync(False)`, each loss divided by 2 as Accelerate's gradient_accumulation_steps=2 does),
`clip` (plain with `clip_grad_norm_(params, 0.05)` before each step) and `scheduler` (plain with StepLR(step_size=2,
gamma=0.5) stepped after each step). Loss: `mse_loss(model(x), y)` over each rank's batch of 4; gradients averaged
over the ranks (FSDP's default reduce-scatter). The initial parameters (torch.manual_seed(1234), drawn once) and
every batch are written, so a reproduction loads them rather than drawing; after every step the full (gathered)
parameters, and at the end the full optimizer state. Every case is also run with DistributedDataParallel on the same
parameters and data, and the generator asserts that both agree to 1e-6 at every step
(meta.max_abs_diff_fsdp_vs_ddp). All the cases of one world size run inside one process group.

Usage: python generate_fsdp.py model/fsdp.json   (the venv of scripts/lib.sh has torch)
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

B = 4            # rows per rank and micro-batch
IN, OUT = 6, 4
INIT_SEED = 1234
TOL = 1e-6
CLIP = 0.05
OPTIMIZERS = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}),
    ("AdamW", {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.01, "amsgrad": False}),
]
VARIANTS = ["plain", "accumulate", "clip", "scheduler"]
STEPS = {"plain": 4, "accumulate": 3, "clip": 4, "scheduler": 4}
MICRO = {"plain": 1, "accumulate": 2, "clip": 1, "scheduler": 1}
SCHEDULER = {"name": "StepLR", "options": {"step_size": 2, "gamma": 0.5}}


def cases():
    return [(ws, i, name, opts, variant) for ws in (2, 3) for i, (name, opts) in enumerate(OPTIMIZERS)
            for variant in VARIANTS]


def model():
    torch.manual_seed(INIT_SEED)
    return torch.nn.Sequential(torch.nn.Linear(IN, 10), torch.nn.Tanh(), torch.nn.Linear(10, 10), torch.nn.Tanh(),
                               torch.nn.Linear(10, OUT))


def data(ws, opt_index, variant):
    """[step][micro-batch][rank] -> (x, y), from a generator seeded by the case."""
    g = torch.Generator().manual_seed(1000 * ws + 100 * opt_index + VARIANTS.index(variant))
    return [[[(torch.randn(B, IN, generator=g), torch.randn(B, OUT, generator=g)) for _ in range(ws)]
             for _ in range(MICRO[variant])] for _ in range(STEPS[variant])]


def flat(t):
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().double().flatten().tolist()


def make_optimizer(name, opts, params):
    if name == "SGD":
        return torch.optim.SGD(params, **opts)
    return torch.optim.AdamW(params, lr=opts["lr"], betas=tuple(opts["betas"]), eps=opts["eps"],
                             weight_decay=opts["weight_decay"], amsgrad=opts["amsgrad"])


def train(kind, rank, ws, mesh, opt_index, name, opts, variant):
    """One case, FSDP2 or DDP; every rank returns its losses, norms, rates, full parameters and final state."""
    net = model()
    if kind == "fsdp":
        for i in (0, 2, 4):
            fully_shard(net[i], mesh=mesh)
        fully_shard(net, mesh=mesh)
        wrapped = net
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(net)
    names = [k for k, _ in net.named_parameters()]
    if kind == "fsdp":  # really sharded: each parameter a DTensor holding this rank's rows (Shard(0))
        assert all(isinstance(p, DTensor) for p in net.parameters())
        rows = {k: p.to_local().shape[0] for k, p in zip(names, net.parameters())}
    opt = make_optimizer(name, opts, wrapped.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, **SCHEDULER["options"]) if variant == "scheduler" else None
    micro = MICRO[variant]
    steps = []
    for batches in data(ws, opt_index, variant):
        opt.zero_grad()
        losses = []
        for m, per_rank in enumerate(batches):
            x, y = per_rank[rank]
            last = m == micro - 1
            if kind == "fsdp":
                if micro > 1:
                    net.set_requires_gradient_sync(last)
                loss = F.mse_loss(wrapped(x), y)
                (loss / micro).backward()
            elif last:
                loss = F.mse_loss(wrapped(x), y)
                (loss / micro).backward()
            else:
                with wrapped.no_sync():
                    loss = F.mse_loss(wrapped(x), y)
                    (loss / micro).backward()
            losses.append(loss.item())
        rec = {"losses": losses, "lr": opt.param_groups[0]["lr"]}
        if variant == "clip":
            norm = torch.nn.utils.clip_grad_norm_(wrapped.parameters(), CLIP)
            rec["clip_norm"] = flat(norm)[0]
        opt.step()
        if sched is not None:
            sched.step()
        rec["params"] = {k: flat(p) for k, p in zip(names, net.parameters())}
        steps.append(rec)
    final = final_state(name, opt, names, net)
    return {"steps": steps, "final_state": final, "shard_rows": rows if kind == "fsdp" else None}


def final_state(name, opt, names, net):
    """Each parameter's full optimizer state at the end: SGD's momentum buffer, AdamW's moments and step."""
    final = {}
    for k, p in zip(names, net.parameters()):
        st = opt.state[p]
        if name == "SGD":
            final[k] = {"momentum_buffer": flat(st["momentum_buffer"])}
        else:
            final[k] = {"exp_avg": flat(st["exp_avg"]), "exp_avg_sq": flat(st["exp_avg_sq"]),
                        "step": flat(st["step"])[0]}
    return final


def worker(rank, ws, port, queue, kinds=("fsdp", "ddp"), train_fn=None, case_list=None):
    """One rank: every case of this world size, once per kind (`train_fn(kind, rank, ...)`, default `train`)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    mesh = init_device_mesh("cpu", (ws,))
    train_fn = train_fn or train
    out = []
    for w, i, name, opts, variant in case_list if case_list is not None else cases():
        if w == ws:
            out.append({k: train_fn(k, rank, ws, mesh, i, name, opts, variant) for k in kinds})
    queue.put((rank, out))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(ws, port, kinds=("fsdp", "ddp"), train_fn=None, case_list=None):
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, ws, port, queue, kinds, train_fn, case_list)) for r in range(ws)]
    for p in procs:
        p.start()
    results = [r for _, r in sorted(queue.get() for _ in procs)]
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    return results


def max_diff(a, b):
    """Largest |a - b| over nested lists/dicts of floats."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        return max(max_diff(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert len(a) == len(b)
        return max((max_diff(x, y) for x, y in zip(a, b)), default=0.0)
    return abs(a - b)


def assemble(ws, opt_index, name, opts, variant, per_rank, diffs, shard_rows):
    fsdp = [r["fsdp"] for r in per_rank]
    ddp = [r["ddp"] for r in per_rank]
    for r in range(1, ws):  # the gathered parameters and state are the same on every rank
        for a, b in zip(fsdp[0]["steps"], fsdp[r]["steps"]):
            assert a["params"] == b["params"] and a["lr"] == b["lr"] and a.get("clip_norm") == b.get("clip_norm")
        assert fsdp[0]["final_state"] == fsdp[r]["final_state"]
    label = f"ws{ws}_{name}_{variant}"
    d_params = max(max_diff(a["params"], b["params"]) for r in range(ws)
                   for a, b in zip(fsdp[r]["steps"], ddp[r]["steps"]))
    d_losses = max(max_diff(a["losses"], b["losses"]) for r in range(ws)
                   for a, b in zip(fsdp[r]["steps"], ddp[r]["steps"]))
    d_state = max_diff(fsdp[0]["final_state"], ddp[0]["final_state"])
    assert d_params <= TOL, (label, d_params)
    assert d_losses <= TOL and d_state <= TOL, (label, d_losses, d_state)
    if variant == "clip":
        d_norm = max(abs(a["clip_norm"] - b["clip_norm"]) for a, b in zip(fsdp[0]["steps"], ddp[0]["steps"]))
        assert d_norm <= TOL, (label, d_norm)
    diffs[label] = d_params
    shard_rows[str(ws)] = {k: [fsdp[r]["shard_rows"][k] for r in range(ws)] for k in fsdp[0]["shard_rows"]}
    batches = data(ws, opt_index, variant)
    steps = []
    for s, rec in enumerate(fsdp[0]["steps"]):
        out = {"batches": [[{"x": flat(batches[s][m][r][0]), "y": flat(batches[s][m][r][1])}
                            for m in range(MICRO[variant])] for r in range(ws)],
               "losses": [fsdp[r]["steps"][s]["losses"] for r in range(ws)],
               "lr": rec["lr"]}
        if "clip_norm" in rec:
            out["clip_norm"] = rec["clip_norm"]
        out["params"] = rec["params"]
        steps.append(out)
    init = {k: {"shape": list(v.shape), "values": flat(v)} for k, v in model().state_dict().items()}
    case = {"world_size": ws, "optimizer": {"name": name, "options": opts}, "variant": variant,
            "batch_size": B, "micro_batches": MICRO[variant], "init": init, "steps": steps,
            "final_state": fsdp[0]["final_state"]}
    if variant == "clip":
        case["clip"] = {"max_norm": CLIP, "norm_type": 2.0}
    if variant == "scheduler":
        case["scheduler"] = SCHEDULER
    return case


if __name__ == "__main__":
    diffs, shard_rows = {}, {}
    out_cases = []
    for ws in (2, 3):
        per_rank = run(ws, free_port())
        todo = [c for c in cases() if c[0] == ws]
        for j, (w, i, name, opts, variant) in enumerate(todo):
            out_cases.append(assemble(w, i, name, opts, variant, [r[j] for r in per_rank], diffs,
                                      shard_rows))
    meta = {"torch": torch.__version__, "what": __doc__.strip().splitlines()[0], "tolerance": TOL,
            "max_abs_diff_fsdp_vs_ddp": diffs,
            "shard_rows": shard_rows}
    with open(sys.argv[1], "w") as f:
        f.write('{"meta": ' + json.dumps(meta) + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in out_cases))
        f.write("\n]}\n")
