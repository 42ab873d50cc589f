#!/usr/bin/env python3
"""Safetensors between accel and Python, in both directions (run by ctest as interop.safetensors).

    check_safetensors.py ACCEL_INTEROP_TESTS WORK_DIR

- accel writes tensors of every covered dtype (float32, float16, bfloat16, float64, int64, int32, uint8, bool,
  scalars, empty tensors): safetensors.torch.load_file reads the same names, dtypes, shapes and bytes, and the file
  is byte for byte what save_file writes;
- save_file writes every dtype both share (float8, unsigned, complex too): accel reads it and writes it back
  byte-identical;
- Accelerate's save_model (sharded with max_shard_size="1KB", and whole) is loaded by accel into the same
  network, which accel's save_model writes again: the same file names, index and bytes as Accelerate's; the
  sharded copy loads back in Python (accelerate's load_checkpoint_in_model) equal to the model.
Prints "N passed, M failed"; exits 1 on any failure.
"""
import json
import os
import subprocess

import torch
from accelerate import Accelerator
from accelerate.utils import load_checkpoint_in_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tally import arguments, check, finish

tool, work = arguments()


def run(*args):
    subprocess.run([tool, *map(str, args)], check=True)


def same(a, b):
    """Same dtype, shape and bytes (dtypes without equality, float8 among them, compared as bytes)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def tree(d):
    return {f: (d / f).read_bytes() for f in sorted(os.listdir(d))}


# ---- accel writes, Python reads ---------------------------------------------------------------------------------
base = ((torch.arange(12, dtype=torch.float32) - 5) / 4).reshape(3, 4)
made = {"f32": base, "f16": base.half(), "bf16": base.bfloat16(), "f64": base.double().t(),
        "i64": torch.arange(-3, 3).reshape(2, 3), "i32": torch.arange(5, dtype=torch.int32) * 1000,
        "u8": torch.arange(250, 256).to(torch.uint8), "bool": base > 0, "scalar": torch.tensor(3.5),
        "scalar_i64": torch.tensor(-7), "empty": torch.empty(0, 3), "empty_bf16": torch.empty(2, 0, dtype=torch.bfloat16)}
run("write", work / "accel.safetensors")
got = load_file(work / "accel.safetensors")
check(sorted(got) == sorted(made), f"names: {sorted(got)}")
for name, t in made.items():
    check(name in got and same(got[name], t.contiguous()), f"tensor {name}: {got.get(name)} != {t}")
with safe_open(work / "accel.safetensors", "pt") as f:
    check(f.metadata() == {"format": "pt"}, f"metadata {f.metadata()}")
save_file({k: v.contiguous() for k, v in made.items()}, work / "python.safetensors", metadata={"format": "pt"})
check((work / "accel.safetensors").read_bytes() == (work / "python.safetensors").read_bytes(),
      "accel's file differs from save_file's for the same tensors")

# ---- Python writes, accel reads (and writes back) --------------------------------------------------------------
g = torch.Generator().manual_seed(7)
every = {"f32": torch.randn(4, 5, generator=g), "f16": torch.randn(7, generator=g).half(),
         "bf16": torch.randn(2, 3, 2, generator=g).bfloat16(), "f64": torch.randn(3, generator=g).double(),
         "f8_e4m3": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
         "f8_e5m2": torch.randn(6, generator=g).to(torch.float8_e5m2),
         "c64": torch.randn(3, dtype=torch.complex64, generator=g),
         "i64": torch.randint(-2**40, 2**40, (5,), generator=g), "i32": torch.randint(-9, 9, (2, 2), dtype=torch.int32, generator=g),
         "i16": torch.randint(-9, 9, (3,), dtype=torch.int16, generator=g), "i8": torch.randint(-9, 9, (3,), dtype=torch.int8, generator=g),
         "u8": torch.randint(0, 255, (3,), dtype=torch.uint8, generator=g), "u16": torch.arange(60000, 60003).to(torch.uint16),
         "u32": torch.arange(3).to(torch.uint32), "u64": torch.arange(4).to(torch.uint64),
         "bool": torch.randn(9, generator=g) > 0, "scalar": torch.tensor(1.25, dtype=torch.float16), "empty": torch.empty(0, dtype=torch.int64),
         "a.b.weight": torch.randn(2, 2, generator=g)}
save_file(every, work / "every.safetensors", metadata={"format": "pt"})
run("copy", work / "every.safetensors", work / "every_copy.safetensors")
check((work / "every.safetensors").read_bytes() == (work / "every_copy.safetensors").read_bytes(),
      "accel's copy of a save_file file is not byte-identical")
back = load_file(work / "every_copy.safetensors")
for name, t in every.items():
    check(name in back and same(back[name], t), f"copied tensor {name}")
# Several metadata entries: safetensors writes them from a hash map, in no fixed order, so the copy is compared
# by value.
meta = {"format": "pt", "note": "written by Python", "step": "12"}
save_file(every, work / "meta.safetensors", metadata=meta)
run("copy", work / "meta.safetensors", work / "meta_copy.safetensors")
with safe_open(work / "meta_copy.safetensors", "pt") as f:
    check(f.metadata() == meta, f"copied metadata {f.metadata()}")
check(all(same(load_file(work / "meta_copy.safetensors")[n], t) for n, t in every.items()), "tensors copied with metadata")

# ---- Accelerate's save_model, sharded and whole: accel loads it and saves the same files ------------------------
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 64), torch.nn.Linear(64, 4))
model(torch.randn(5, 8))  # running statistics and num_batches_tracked move off their initial values
accelerator = Accelerator(cpu=True)
accelerator.save_model(model, work / "acc_sharded", max_shard_size="1KB")
accelerator.save_model(model, work / "acc_whole")
check(len(os.listdir(work / "acc_sharded")) > 3, f"Accelerate wrote {os.listdir(work / 'acc_sharded')}: not sharded")
run("load-save", work / "acc_sharded", work / "accel_sharded", "1KB")
run("load-save", work / "acc_whole", work / "accel_whole", "10GB")
for ours, theirs in (("accel_sharded", "acc_sharded"), ("accel_whole", "acc_whole")):
    a, b = tree(work / ours), tree(work / theirs)
    check(list(a) == list(b), f"{ours} holds {list(a)}, Accelerate's {theirs} {list(b)}")
    for f in b:
        check(a.get(f) == b[f], f"{ours}/{f} differs from Accelerate's")
# A plain save_file of the state dict (no metadata) loads too.
save_file(model.state_dict(), work / "plain.safetensors")
run("load-save", work / "plain.safetensors", work / "accel_plain", "10GB")
check(tree(work / "accel_plain") == tree(work / "acc_whole"), "a save_file state dict loaded and saved again differs")
# accel's sharded checkpoint loads into PyTorch.
other = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                            torch.nn.Linear(16, 64), torch.nn.Linear(64, 4))
load_checkpoint_in_model(other, str(work / "accel_sharded"), strict=True)
for name, t in model.state_dict().items():
    check(same(other.state_dict()[name], t), f"{name} after loading accel's shards in PyTorch")
index = json.loads((work / "accel_sharded" / "model.safetensors.index.json").read_text())
check(sorted(index["weight_map"]) == sorted(model.state_dict()), "the index names every tensor")

finish()
