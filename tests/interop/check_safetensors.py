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
  sharded copy loads back in Python (accelerate's load_checkpoint_in_model) equal to the model;
- a map of names to tensors (no module) saved by accel's save_safetensors_sharded, sharded and whole, with a tied
  weight: the same files, byte for byte, as Accelerate's save_model recipe writes for the same dict (sorted by name:
  clean_state_dict_for_safetensors, huggingface_hub's split_torch_state_dict_into_shards, save_file, the index);
  the same shards as huggingface_hub's save_torch_state_dict (its index is the same JSON, without the final
  newline); and those directories read back whole by load_safetensors_sharded.
Prints "N passed, M failed"; exits 1 on any failure.
"""
import json
import logging
import os
import shutil
import subprocess

import torch
from accelerate import Accelerator
from accelerate.utils import clean_state_dict_for_safetensors, load_checkpoint_in_model
from huggingface_hub import save_torch_state_dict, split_torch_state_dict_into_shards
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

# ---- a map without a module: save_safetensors_sharded and load_safetensors_sharded --------------------------------
g = torch.Generator().manual_seed(11)
state = {"embed.weight": torch.randn(40, 8, generator=g), "head.bias": torch.randn(40, generator=g).half(),
         "layers.0.weight": torch.randn(16, 8, generator=g).bfloat16(), "layers.1.weight": torch.randn(300, generator=g),
         "norm.steps": torch.tensor(12), "mask": torch.randn(64, generator=g) > 0, "empty": torch.empty(0, 5),
         "zeta.scale": torch.randn(3, generator=g).double()}
save_file(state, work / "map.safetensors")


def accelerate_recipe(tensors, out, max_shard_size):
    """What Accelerator.save_model does with a state_dict (accelerator.py), for a dict."""
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)  # its warning of the tie, expected here
    tensors = clean_state_dict_for_safetensors(dict(tensors))
    split = split_torch_state_dict_into_shards(tensors, filename_pattern="model{suffix}.safetensors",
                                               max_shard_size=max_shard_size)
    out.mkdir(parents=True)
    for filename, names in split.filename_to_tensors.items():
        save_file({n: tensors[n] for n in names}, out / filename, metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


ordered = dict(sorted(state.items()))  # a TensorMap's order
tied = dict(ordered)
tied["unembed.weight"] = tied["embed.weight"]  # shares storage: saved once, under the first name
tied = dict(sorted(tied.items()))
for size in ("1KB", "10GB"):
    ours, theirs, hub = work / f"map_accel_{size}", work / f"map_python_{size}", work / f"map_hub_{size}"
    for d in (ours, theirs, hub, work / f"map_accel_untied_{size}"):
        shutil.rmtree(d, ignore_errors=True)
    hub.mkdir(parents=True)
    run("map-save", work / "map.safetensors", ours, size, "embed.weight", "unembed.weight")
    accelerate_recipe(tied, theirs, size)
    a, b = tree(ours), tree(theirs)
    check(list(a) == list(b), f"{ours.name} holds {list(a)}, the Python recipe {list(b)}")
    check(size == "10GB" or len(a) > 3, f"{ours.name} is not sharded: {list(a)}")
    for f in b:
        check(a.get(f) == b[f], f"{ours.name}/{f} differs from Python's")
    # huggingface_hub's save_torch_state_dict (no tie: it keeps another name of a tied pair): the same shards.
    run("map-save", work / "map.safetensors", work / f"map_accel_untied_{size}", size)
    save_torch_state_dict(ordered, hub, max_shard_size=size)
    a, b = tree(work / f"map_accel_untied_{size}"), tree(hub)
    check(list(a) == list(b), f"untied {size}: accel wrote {list(a)}, huggingface_hub {list(b)}")
    for f in b:
        if f.endswith(".index.json"):
            check(json.loads(a.get(f, b"null")) == json.loads(b[f]), f"the index differs from huggingface_hub's ({size})")
        else:
            check(a.get(f) == b[f], f"untied {size}: {f} differs from huggingface_hub's")
    # Read back whole, from accel's directory and from huggingface_hub's.
    for src in (ours, hub):
        run("map-load", src, work / f"{src.name}.whole.safetensors")
        back = load_file(work / f"{src.name}.whole.safetensors")
        want = {k: v for k, v in ordered.items()}
        check(sorted(back) == sorted(want), f"{src.name} read back holds {sorted(back)}")
        for name, t in want.items():
            check(name in back and same(back[name], t), f"{src.name}: tensor {name} read back")

finish()
