"""Seeded-shuffle vectors from the real Accelerate, for the torch version accel links.

Each case is one job with a seed: every process calls set_seed(seed), builds
DataLoader(range(n), batch_size, shuffle=True) and prepare_data_loader(...) for its rank, and iterates three
epochs. Recorded: the batches every process yields per epoch. Two samplers: the default RandomSampler with
the generator that prepare_data_loader synchronises ("generator"), and SeedableRandomSampler ("seedable",
with and without data_seed). Processes are simulated in one Python process (num_processes/process_index
arguments, the way upstream's own tests do); every rank starts from the same seed, as real ranks do.

    python tests/golden/generate_shuffles.py > tests/golden/data/shuffles.json
"""
import itertools
import json
import sys

import accelerate
import torch
from accelerate import Accelerator
from accelerate.data_loader import prepare_data_loader
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, RandomSampler

EPOCHS = 3


def run_case(seed, n, bs, dl, nproc, split, even, sampler, data_seed, replacement):
    processes = []
    for rank in range(nproc):
        set_seed(seed)
        if replacement:
            base = DataLoader(list(range(n)), batch_size=bs, drop_last=dl,
                              sampler=RandomSampler(range(n), replacement=True, num_samples=n + 5))
        else:
            base = DataLoader(list(range(n)), batch_size=bs, shuffle=True, drop_last=dl)
        prepared = prepare_data_loader(
            base, num_processes=nproc, process_index=rank, split_batches=split, even_batches=even,
            rng_types=["generator"], use_seedable_sampler=(sampler == "seedable"), data_seed=data_seed)
        epochs = [[b.tolist() for b in prepared] for _ in range(EPOCHS)]
        processes.append({"process_index": rank, "epochs": epochs})
    return {"seed": seed, "n": n, "batch_size": bs, "drop_last": dl, "num_processes": nproc,
            "split_batches": split, "even_batches": even, "sampler": sampler, "data_seed": data_seed,
            "replacement": replacement, "processes": processes}


def main():
    Accelerator(cpu=True)  # RNG synchronisation needs an AcceleratorState (one process: type NO)
    cases = []
    grid = itertools.product([0, 42, 1234], [1, 7, 10, 33], [1, 3, 4], [False, True], [1, 2, 3],
                             [False, True], [True, False])
    for seed, n, bs, dl, nproc, split, even in grid:
        if split and bs % nproc:
            continue
        cases.append(run_case(seed, n, bs, dl, nproc, split, even, "generator", None, False))
        if not split and even:
            cases.append(run_case(seed, n, bs, dl, nproc, split, even, "seedable", None, False))
            cases.append(run_case(seed, n, bs, dl, nproc, split, even, "seedable", 7 + seed, False))
            cases.append(run_case(seed, n, bs, dl, nproc, split, even, "generator", None, True))
    meta = {"generator": "tests/golden/generate_shuffles.py", "accelerate_version": accelerate.__version__,
            "torch_version": torch.__version__, "epochs": EPOCHS}
    json.dump({"meta": meta, "cases": cases}, sys.stdout, separators=(",", ":"))


if __name__ == "__main__":
    main()
