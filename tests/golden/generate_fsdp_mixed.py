"""Golden trajectories of PyTorch's FSDP2 (`fully_shard`) with MixedPrecisionPolicy(bfloat16 params, float32 reduce).

The jobs of generate_fsdp.py (same model, initial parameters, batches, optimizers, JSON schema; its helpers are
imported from it) with `fully_shard(module, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
reduce_dtype=torch.float32))` on each Linear (0, 2, 4) and then on the root Sequential (`cast_forward_inputs` True,
`output_dtype` None, reshard_after_forward the default), trained on 2 and 3 CPU processes (Gloo, 127.0.0.1). FSDP2
all-gathers the fp32 shards cast to bf16, so forward and backward run in bf16; the model's output is bf16 and the
loss is `mse_loss(model(x).float(), y)` (fp32). Gradients are reduce-scattered in fp32 (averaged over the ranks) into
fp32 sharded gradients, and the optimizer steps the fp32 sharded parameters. Variants `plain` (4 steps) and
`accumulate` (3 steps of 2 micro-batches, the first under `set_requires_gradient_sync(False)`, each loss divided by 2)
for SGD and AdamW: 8 cases, each with the same batches as the case of the same name in fsdp.json. Recorded as in
fsdp.json: every rank's losses, the full fp32 parameters (gathered with `full_tensor()`) after every step, and the
full fp32 optimizer state at the end. Mixed precision does not match fp32 training, so instead of DDP every case is
also run with fp32 FSDP2 (no mp_policy, same loss); the generator asserts that the bf16 run moves away from it
(meta.min_abs_diff_vs_fp32 < largest parameter difference <= meta.tolerance) and records the largest parameter and
loss differences per case (meta.max_abs_diff_vs_fp32_fsdp, meta.max_abs_diff_losses_vs_fp32_fsdp). It also asserts
that every rank gathers the same parameters and state, and generates everything twice (fresh process groups) and
asserts that both JSON texts are identical.

Usage: python generate_fsdp_mixed.py model/fsdp_mixed.json   (the venv of scripts/lib.sh has torch)
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_fsdp import B, OPTIMIZERS, data, flat, free_port, make_optimizer, max_diff, model  # noqa: E402
from generate_fsdp import final_state, run as run_cases  # noqa: E402

POLICY = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
VARIANTS = ["plain", "accumulate"]
MICRO = {"plain": 1, "accumulate": 2}
TOL = 5e-2       # upper bound asserted on |bf16 run - fp32 run| of the parameters, every step (AdamW
                 # normalises: an element whose gradient is near 0 can move up to ~lr a step apart)
MIN_DIFF = 1e-5  # lower bound asserted on the same: bf16 visibly matters (fp32 FSDP vs DDP differ by <= 3e-8)


def cases():
    return [(ws, i, name, opts, variant) for ws in (2, 3) for i, (name, opts) in enumerate(OPTIMIZERS)
            for variant in VARIANTS]


def train(kind, rank, ws, mesh, opt_index, name, opts, variant):
    """One case, FSDP2 with the bf16 policy ("mixed") or without ("fp32"); every rank returns its record."""
    net = model()
    policy = {"mp_policy": POLICY} if kind == "mixed" else {}
    for i in (0, 2, 4):
        fully_shard(net[i], mesh=mesh, **policy)
    fully_shard(net, mesh=mesh, **policy)
    names = [k for k, _ in net.named_parameters()]
    # really sharded, and the shards (what the optimizer steps) stay fp32
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in net.parameters())
    rows = {k: p.to_local().shape[0] for k, p in zip(names, net.parameters())}
    opt = make_optimizer(name, opts, net.parameters())
    micro = MICRO[variant]
    steps = []
    for batches in data(ws, opt_index, variant):
        opt.zero_grad()
        losses = []
        for m, per_rank in enumerate(batches):
            x, y = per_rank[rank]
            if micro > 1:
                net.set_requires_gradient_sync(m == micro - 1)
            out = net(x)
            assert out.dtype == (torch.bfloat16 if kind == "mixed" else torch.float32), out.dtype
            loss = F.mse_loss(out.float(), y)
            (loss / micro).backward()
            losses.append(loss.item())
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in net.parameters())
        opt.step()
        steps.append({"losses": losses, "lr": opt.param_groups[0]["lr"],
                      "params": {k: flat(p) for k, p in zip(names, net.parameters())}})
    final = final_state(name, opt, names, net)
    return {"steps": steps, "final_state": final, "shard_rows": rows}


def run(ws, port):
    """Every case of `ws` processes, mixed precision and fp32, through generate_fsdp's process spawning."""
    return run_cases(ws, port, ("mixed", "fp32"), train, cases())


def assemble(ws, opt_index, name, opts, variant, per_rank, diffs, loss_diffs, shard_rows):
    mixed = [r["mixed"] for r in per_rank]
    fp32 = [r["fp32"] for r in per_rank]
    for r in range(1, ws):  # the gathered parameters and state are the same on every rank
        for a, b in zip(mixed[0]["steps"], mixed[r]["steps"]):
            assert a["params"] == b["params"] and a["lr"] == b["lr"]
        assert mixed[0]["final_state"] == mixed[r]["final_state"]
    label = f"ws{ws}_{name}_{variant}"
    d_params = max(max_diff(a["params"], b["params"]) for r in range(ws)
                   for a, b in zip(mixed[r]["steps"], fp32[r]["steps"]))
    d_losses = max(max_diff(a["losses"], b["losses"]) for r in range(ws)
                   for a, b in zip(mixed[r]["steps"], fp32[r]["steps"]))
    assert MIN_DIFF < d_params <= TOL, (label, d_params)
    diffs[label] = d_params
    loss_diffs[label] = d_losses
    shard_rows[str(ws)] = {k: [mixed[r]["shard_rows"][k] for r in range(ws)] for k in mixed[0]["shard_rows"]}
    batches = data(ws, opt_index, variant)
    steps = []
    for s, rec in enumerate(mixed[0]["steps"]):
        steps.append({"batches": [[{"x": flat(batches[s][m][r][0]), "y": flat(batches[s][m][r][1])}
                                   for m in range(MICRO[variant])] for r in range(ws)],
                      "losses": [mixed[r]["steps"][s]["losses"] for r in range(ws)],
                      "lr": rec["lr"], "params": rec["params"]})
    init = {k: {"shape": list(v.shape), "values": flat(v)} for k, v in model().state_dict().items()}
    return {"world_size": ws, "optimizer": {"name": name, "options": opts}, "variant": variant,
            "batch_size": B, "micro_batches": MICRO[variant], "init": init, "steps": steps,
            "final_state": mixed[0]["final_state"]}


def generate():
    """The whole file's text, from fresh process groups."""
    diffs, loss_diffs, shard_rows = {}, {}, {}
    out_cases = []
    for ws in (2, 3):
        per_rank = run(ws, free_port())
        todo = [c for c in cases() if c[0] == ws]
        for j, (w, i, name, opts, variant) in enumerate(todo):
            out_cases.append(assemble(w, i, name, opts, variant, [r[j] for r in per_rank], diffs, loss_diffs,
                                      shard_rows))
    meta = {"torch": torch.__version__, "what": __doc__.strip().splitlines()[0],
            "mp_policy": {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": None,
                          "cast_forward_inputs": True},
            "loss": "mse_loss(model(x).float(), y)",
            "tolerance": TOL, "min_abs_diff_vs_fp32": MIN_DIFF,
            "max_abs_diff_vs_fp32_fsdp": diffs, "max_abs_diff_losses_vs_fp32_fsdp": loss_diffs,
            "deterministic": "generated twice from fresh process groups; identical text",
            "shard_rows": shard_rows}
    return ('{"meta": ' + json.dumps(meta) + ', "cases": [\n' + ",\n".join(json.dumps(c) for c in out_cases)
            + "\n]}\n")


if __name__ == "__main__":
    first = generate()
    second = generate()
    assert first == second, "two generations differ"
    with open(sys.argv[1], "w") as f:
        f.write(first)
