#!/usr/bin/env python3
"""Learning-rate sequences of PyTorch's schedulers, for include/accel/optim/schedulers.hpp.

Writes tests/golden/optim/schedulers.json: for every case, the learning rate of each parameter group right after
construction and after each step (and, for OneCycleLR with cycle_momentum, the momentum or beta1 too). Two
parameter groups with different learning rates everywhere, so that per-group base lrs are exercised. Python's json
writes floats with repr, the shortest string that reads back as the same double, so the values are exact.

The first three warmup schedules (constant, linear, cosine) come from transformers' lambdas copied below from
transformers 5.23.0 (transformers/optimization.py). The later ones (cosine with hard restarts, polynomial decay,
inverse square root) are called from the real transformers package, pinned to transformers==5.24.0 in
tests/golden/requirements-schedulers.txt: a temporary environment with the project's torch and that pin generates,
e.g.

    python3 -m venv /tmp/tf && /tmp/tf/bin/pip install -r tests/golden/requirements-schedulers.txt
    echo "$ACCEL_VENV/lib/python3.11/site-packages" > /tmp/tf/lib/python3.11/site-packages/accel_venv.pth
    /tmp/tf/bin/python tests/golden/generate_schedulers.py > tests/golden/optim/schedulers.json

(the project's venv holds torch; the .pth file lends it). Without transformers the script stops.

Usage: python generate_schedulers.py > tests/golden/optim/schedulers.json
"""
import json
import math
import sys
from functools import partial

import torch
import transformers
from torch.optim import SGD, Adam, AdamW
from torch.optim import lr_scheduler as L

LRS = [0.1, 0.03]


# ---- transformers 5.23.0, transformers/optimization.py (verbatim) --------------------------------------------
def _get_constant_schedule_with_warmup_lr_lambda(current_step: int, *, num_warmup_steps: int):
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _get_linear_schedule_with_warmup_lr_lambda(current_step: int, *, num_warmup_steps: int, num_training_steps: int):
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))


# transformers 5.23.0 defines this function twice; the second definition (with min_lr_rate) is the one that
# get_cosine_schedule_with_warmup finds at call time, so it is the one copied.
def _get_cosine_schedule_with_warmup_lr_lambda(
    current_step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float, min_lr_rate: float = 0.0
):
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    factor = factor * (1 - min_lr_rate) + min_lr_rate
    return max(0, factor)
# ---- end of transformers ---------------------------------------------------------------------------------------


def optimizer(kind):
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    groups = [{"params": [params[0]], "lr": LRS[0]}, {"params": [params[1]], "lr": LRS[1]}]
    if kind == "sgd":
        return SGD(groups, lr=LRS[0], momentum=0.9)
    if kind == "adam":
        return Adam(groups, lr=LRS[0])
    if kind == "adamw":
        return AdamW(groups, lr=LRS[0])
    raise ValueError(kind)


def lambda_of(spec):
    kind = spec["fn"]
    if kind == "warmup_constant":
        return partial(_get_constant_schedule_with_warmup_lr_lambda, num_warmup_steps=spec["warmup"])
    if kind == "warmup_linear":
        return partial(_get_linear_schedule_with_warmup_lr_lambda, num_warmup_steps=spec["warmup"],
                       num_training_steps=spec["total"])
    if kind == "warmup_cosine":
        return partial(_get_cosine_schedule_with_warmup_lr_lambda, num_warmup_steps=spec["warmup"],
                       num_training_steps=spec["total"], num_cycles=spec["num_cycles"])
    if kind == "mult":  # MultiplicativeLR's factors: 0.95 (first group), 1 - 1 / (10 + epoch) (second)
        return [lambda e: 0.95, lambda e: 1.0 - 1.0 / (10.0 + e)]
    if kind == "mult_one":  # one function for every group: 0.8 every third epoch, else 1
        return lambda e: 0.8 if e % 3 == 0 else 1.0
    if kind == "power":  # a plain lambda: base * 0.97^epoch (first group) or 1 / (1 + epoch) (second)
        return [lambda e: 0.97 ** e, lambda e: 1.0 / (1.0 + e)]
    raise ValueError(kind)


def make(opt, spec):
    k, p = spec["kind"], spec.get("params", {})
    last = p.get("last_epoch", -1)  # >= 0: resumed by index, from the initial_lr a "prior" scheduler set
    if k == "StepLR":
        return L.StepLR(opt, step_size=p["step_size"], gamma=p["gamma"], last_epoch=last)
    if k == "MultiStepLR":
        return L.MultiStepLR(opt, milestones=p["milestones"], gamma=p["gamma"], last_epoch=last)
    if k == "ExponentialLR":
        return L.ExponentialLR(opt, gamma=p["gamma"], last_epoch=last)
    if k == "LinearLR":
        return L.LinearLR(opt, start_factor=p["start_factor"], end_factor=p["end_factor"], total_iters=p["total_iters"],
                          last_epoch=last)
    if k == "CosineAnnealingLR":
        return L.CosineAnnealingLR(opt, T_max=p["T_max"], eta_min=p["eta_min"], last_epoch=last)
    if k == "LambdaLR":
        fn = p["fn"]
        if fn == "warmup_cosine_hard_restarts":
            return transformers.get_cosine_with_hard_restarts_schedule_with_warmup(
                opt, num_warmup_steps=p["warmup"], num_training_steps=p["total"], num_cycles=p["num_cycles"])
        if fn == "warmup_polynomial":
            return transformers.get_polynomial_decay_schedule_with_warmup(
                opt, num_warmup_steps=p["warmup"], num_training_steps=p["total"], lr_end=p["lr_end"], power=p["power"])
        if fn == "inverse_sqrt":
            return transformers.get_inverse_sqrt_schedule(opt, num_warmup_steps=p["warmup"], timescale=p["timescale"])
        return L.LambdaLR(opt, lambda_of(p))
    if k == "MultiplicativeLR":
        return L.MultiplicativeLR(opt, lambda_of(p))
    if k == "ConstantLR":
        return L.ConstantLR(opt, factor=p["factor"], total_iters=p["total_iters"], last_epoch=last)
    if k == "PolynomialLR":
        return L.PolynomialLR(opt, total_iters=p["total_iters"], power=p["power"], last_epoch=last)
    if k == "CosineAnnealingWarmRestarts":
        return L.CosineAnnealingWarmRestarts(opt, T_0=p["T_0"], T_mult=p["T_mult"], eta_min=p["eta_min"],
                                             last_epoch=last)
    if k == "CyclicLR":
        return L.CyclicLR(opt, base_lr=p["base_lr"], max_lr=p["max_lr"], step_size_up=p["step_size_up"],
                          step_size_down=p["step_size_down"], mode=p["mode"], gamma=p["gamma"],
                          cycle_momentum=p["cycle_momentum"], base_momentum=p["base_momentum"],
                          max_momentum=p["max_momentum"])
    if k == "ChainedScheduler":
        return L.ChainedScheduler([make(opt, s) for s in p["schedulers"]], optimizer=opt)
    if k == "OneCycleLR":
        return L.OneCycleLR(opt, max_lr=p["max_lr"], total_steps=p["total_steps"], pct_start=p["pct_start"],
                            anneal_strategy=p["anneal_strategy"], cycle_momentum=p["cycle_momentum"],
                            div_factor=p["div_factor"], final_div_factor=p["final_div_factor"],
                            three_phase=p["three_phase"], base_momentum=p["base_momentum"],
                            max_momentum=p["max_momentum"])
    if k == "SequentialLR":
        subs = [make(opt, s) for s in p["schedulers"]]
        return L.SequentialLR(opt, schedulers=subs, milestones=p["milestones"])
    if k == "ReduceLROnPlateau":
        return L.ReduceLROnPlateau(opt, mode=p["mode"], factor=p["factor"], patience=p["patience"],
                                   threshold=p["threshold"], threshold_mode=p["threshold_mode"],
                                   cooldown=p["cooldown"], min_lr=p["min_lr"], eps=p["eps"])
    raise ValueError(k)


def momentum_of(opt):
    return [g["betas"][0] if "betas" in g else g["momentum"] for g in opt.param_groups]


def run(case):
    opt = optimizer(case.get("optimizer", "sgd"))
    prior = make(opt, case["prior"]) if "prior" in case else None  # noqa: F841 (alive, as in the C++ test)
    sched = make(opt, case)
    lrs = [[g["lr"] for g in opt.param_groups]]
    moms = [momentum_of(opt)]
    metrics = case.get("metrics")
    for i in range(case["steps"]):
        opt.step()
        if metrics is not None:
            sched.step(metrics[i])
        else:
            sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
        moms.append(momentum_of(opt))
        assert sched.get_last_lr() == lrs[-1]
    case["lr"] = lrs
    if case["kind"] in ("OneCycleLR", "CyclicLR") and case["params"]["cycle_momentum"]:
        case["momentum"] = moms
    # ChainedScheduler has no last_epoch: accel's counts its steps
    case["last_epoch"] = sched.last_epoch if case["kind"] != "ChainedScheduler" else case["steps"]
    return case


def cases():
    out = []
    for step_size in (1, 3, 7):
        for gamma in (0.5, 0.1, 0.9):
            out.append({"kind": "StepLR", "params": {"step_size": step_size, "gamma": gamma}, "steps": 40})
    for milestones, gamma in (([5, 12, 30], 0.1), ([3, 3, 20], 0.5), ([1, 40], 0.7)):
        out.append({"kind": "MultiStepLR", "params": {"milestones": milestones, "gamma": gamma}, "steps": 50})
    for gamma in (0.95, 0.5, 0.999):
        out.append({"kind": "ExponentialLR", "params": {"gamma": gamma}, "steps": 60})
    for sf, ef, n in ((1 / 3, 1.0, 5), (0.1, 1.0, 17), (1.0, 0.05, 30), (0.5, 0.25, 8)):
        out.append({"kind": "LinearLR", "params": {"start_factor": sf, "end_factor": ef, "total_iters": n}, "steps": 45})
    for t_max, eta_min in ((10, 0.0), (25, 1e-4), (7, 0.01), (50, 0.0)):
        out.append({"kind": "CosineAnnealingLR", "params": {"T_max": t_max, "eta_min": eta_min}, "steps": 120})
    out.append({"kind": "LambdaLR", "params": {"fn": "power"}, "steps": 40})
    for warmup, total in ((0, 50), (10, 60), (25, 40)):
        out.append({"kind": "LambdaLR", "params": {"fn": "warmup_linear", "warmup": warmup, "total": total}, "steps": 70})
        out.append({"kind": "LambdaLR", "params": {"fn": "warmup_constant", "warmup": warmup}, "steps": 40})
        for cycles in (0.5, 1.0, 2.5):
            out.append({"kind": "LambdaLR", "params": {"fn": "warmup_cosine", "warmup": warmup, "total": total,
                                                       "num_cycles": cycles}, "steps": 70})
    for opt in ("sgd", "adam", "adamw"):
        for anneal in ("cos", "linear"):
            for three in (False, True):
                for pct, div, fdiv, total in ((0.3, 25.0, 1e4, 100), (0.25, 10.0, 100.0, 61)):
                    out.append({"kind": "OneCycleLR", "optimizer": opt,
                                "params": {"max_lr": [1.0, 0.4], "total_steps": total, "pct_start": pct,
                                           "anneal_strategy": anneal, "cycle_momentum": True, "div_factor": div,
                                           "final_div_factor": fdiv, "three_phase": three,
                                           "base_momentum": 0.85, "max_momentum": [0.95, 0.9]},
                                "steps": total})
    out.append({"kind": "OneCycleLR", "params": {"max_lr": [0.5, 0.5], "total_steps": 40, "pct_start": 0.4,
                                                 "anneal_strategy": "cos", "cycle_momentum": False,
                                                 "div_factor": 25.0, "final_div_factor": 1e4, "three_phase": False,
                                                 "base_momentum": 0.85, "max_momentum": 0.95}, "steps": 40})
    warm = {"kind": "LinearLR", "params": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 10}}
    out.append({"kind": "SequentialLR", "params": {"schedulers": [warm, {"kind": "CosineAnnealingLR",
                                                                         "params": {"T_max": 40, "eta_min": 1e-4}}],
                                                   "milestones": [10]}, "steps": 60})
    out.append({"kind": "SequentialLR", "params": {"schedulers": [
        {"kind": "ExponentialLR", "params": {"gamma": 0.9}},
        {"kind": "StepLR", "params": {"step_size": 4, "gamma": 0.5}},
        {"kind": "LambdaLR", "params": {"fn": "warmup_linear", "warmup": 5, "total": 30}}],
        "milestones": [6, 20]}, "steps": 50})
    out.append({"kind": "SequentialLR", "params": {"schedulers": [
        {"kind": "LambdaLR", "params": {"fn": "warmup_constant", "warmup": 8}},
        {"kind": "MultiStepLR", "params": {"milestones": [3, 9], "gamma": 0.3}}],
        "milestones": [12]}, "steps": 40})
    for factor, n in ((1 / 3, 5), (0.5, 12), (0.1, 1), (1.0, 3)):
        out.append({"kind": "ConstantLR", "params": {"factor": factor, "total_iters": n}, "steps": 30})
    out.append({"kind": "MultiplicativeLR", "params": {"fn": "mult"}, "steps": 40})
    out.append({"kind": "MultiplicativeLR", "params": {"fn": "mult_one"}, "steps": 30})
    for n, power in ((5, 1.0), (30, 2.0), (17, 0.5), (40, 3.0)):
        out.append({"kind": "PolynomialLR", "params": {"total_iters": n, "power": power}, "steps": 50})
    for t0, tmult, eta_min in ((10, 1, 0.0), (5, 2, 1e-3), (3, 3, 0.0), (7, 1, 0.005)):
        out.append({"kind": "CosineAnnealingWarmRestarts", "params": {"T_0": t0, "T_mult": tmult, "eta_min": eta_min},
                    "steps": 100})
    for opt in ("sgd", "adam"):
        for mode, gamma in (("triangular", 1.0), ("triangular2", 1.0), ("exp_range", 0.97)):
            for up, down in ((5, None), (4, 9)):
                out.append({"kind": "CyclicLR", "optimizer": opt,
                            "params": {"base_lr": [0.01, 0.002], "max_lr": 0.2, "step_size_up": up,
                                       "step_size_down": down, "mode": mode, "gamma": gamma, "cycle_momentum": True,
                                       "base_momentum": [0.8, 0.85], "max_momentum": 0.95},
                            "steps": 60})
    out.append({"kind": "CyclicLR", "params": {"base_lr": 0.001, "max_lr": [0.1, 0.05], "step_size_up": 6,
                                               "step_size_down": 2, "mode": "triangular2", "gamma": 1.0,
                                               "cycle_momentum": False, "base_momentum": 0.8, "max_momentum": 0.9},
                "steps": 50})
    out.append({"kind": "ChainedScheduler", "params": {"schedulers": [
        {"kind": "ConstantLR", "params": {"factor": 0.1, "total_iters": 2}},
        {"kind": "ExponentialLR", "params": {"gamma": 0.9}}]}, "steps": 30})
    out.append({"kind": "ChainedScheduler", "params": {"schedulers": [
        {"kind": "LinearLR", "params": {"start_factor": 0.2, "end_factor": 1.0, "total_iters": 6}},
        {"kind": "StepLR", "params": {"step_size": 4, "gamma": 0.5}},
        {"kind": "MultiplicativeLR", "params": {"fn": "mult"}}]}, "steps": 40})
    for warmup, total in ((0, 50), (10, 60), (25, 40)):
        for cycles in (1, 3):
            out.append({"kind": "LambdaLR", "params": {"fn": "warmup_cosine_hard_restarts", "warmup": warmup,
                                                       "total": total, "num_cycles": cycles}, "steps": 70})
        for lr_end, power in ((1e-7, 1.0), (1e-3, 2.0), (0.0, 0.5)):
            out.append({"kind": "LambdaLR", "params": {"fn": "warmup_polynomial", "warmup": warmup, "total": total,
                                                       "lr_end": lr_end, "power": power}, "steps": 70})
    for warmup, timescale in ((0, None), (10, None), (8, 20), (0, 50)):
        out.append({"kind": "LambdaLR", "params": {"fn": "inverse_sqrt", "warmup": warmup, "timescale": timescale},
                    "steps": 60})
    prior = {"kind": "ExponentialLR", "params": {"gamma": 0.8}}
    for spec in ({"kind": "StepLR", "params": {"step_size": 3, "gamma": 0.5, "last_epoch": 5}},
                 {"kind": "CosineAnnealingLR", "params": {"T_max": 10, "eta_min": 0.001, "last_epoch": 4}},
                 {"kind": "LinearLR", "params": {"start_factor": 0.25, "end_factor": 1.0, "total_iters": 8,
                                                 "last_epoch": 2}},
                 {"kind": "MultiStepLR", "params": {"milestones": [4, 9], "gamma": 0.1, "last_epoch": 3}},
                 {"kind": "ConstantLR", "params": {"factor": 0.5, "total_iters": 6, "last_epoch": 3}},
                 {"kind": "PolynomialLR", "params": {"total_iters": 12, "power": 2.0, "last_epoch": 4}},
                 {"kind": "CosineAnnealingWarmRestarts", "params": {"T_0": 4, "T_mult": 2, "eta_min": 0.001,
                                                                    "last_epoch": 5}}):
        out.append(dict(spec, prior=prior, steps=30))
    plateau = [1.0, 0.9, 0.9, 0.9, 0.95, 0.9, 0.8, 0.8, 0.80001, 0.79999, 0.8, 0.8, 0.8, 0.5, 0.5, 0.5, 0.5, 0.5,
               0.5, 0.49, 0.49, 0.49, 0.49, 0.49, 0.49, 0.49, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
    rising = [0.1, 0.2, 0.2, 0.2, 0.2, 0.25, 0.25, 0.25, 0.25, 0.250001, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3,
              0.31, 0.31, 0.31, 0.31, 0.31, 0.31, 0.31, 0.31, 0.31, 0.31]
    for mode, metrics in (("min", plateau), ("max", rising)):
        for tmode, threshold in (("rel", 1e-4), ("abs", 0.01)):
            for patience, cooldown, min_lr, factor in ((2, 0, 0.0, 0.5), (1, 3, [0.02, 0.01], 0.1), (0, 1, 0.004, 0.7)):
                out.append({"kind": "ReduceLROnPlateau",
                            "params": {"mode": mode, "factor": factor, "patience": patience, "threshold": threshold,
                                       "threshold_mode": tmode, "cooldown": cooldown, "min_lr": min_lr, "eps": 1e-8},
                            "metrics": metrics, "steps": len(metrics)})
    # eps larger than a reduction: the reduction is dropped
    out.append({"kind": "ReduceLROnPlateau",
                "params": {"mode": "min", "factor": 0.5, "patience": 0, "threshold": 1e-4, "threshold_mode": "rel",
                           "cooldown": 0, "min_lr": 0.0, "eps": 0.02},
                "metrics": [1.0] * 12, "steps": 12})
    return out


def name_of(c):
    return c["kind"] + ("/" + c["optimizer"] if "optimizer" in c else "") + " " + json.dumps(c["params"], sort_keys=True)


def main():
    all_cases = [run(c) for c in cases()]
    for c in all_cases:
        c["name"] = name_of(c)
    meta = {"torch": torch.__version__, "transformers_lambdas": "5.23.0", "transformers": transformers.__version__,
            "lrs": LRS}
    sys.stdout.write('{"meta": ' + json.dumps(meta) + ',\n "cases": [\n')
    sys.stdout.write(",\n".join(json.dumps(c, sort_keys=True) for c in all_cases))
    sys.stdout.write("\n]}\n")


if __name__ == "__main__":
    main()
