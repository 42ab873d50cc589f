#pragma once
//! \file
//! The pickles of a LibTorch archive (`data.pkl`, `constants.pkl`, the `.debug_pkl` files), followed before
//! LibTorch's unpickler reads them: `check_pickle`.
//!
//! Note [What a pickle can declare]
//! A pickle declares sizes that LibTorch's unpickler (torch/csrc/jit/serialization/unpickler.cpp) trusts:
//!  - lengths of strings and byte strings, and memo indices: LibTorch allocates them before comparing them with the
//!    data (Note [What LibTorch does with a damaged archive] in archive.hpp);
//!  - a storage's element count (`BINPERSID` on the tuple `("storage", <dtype>, <key>, <device>, <numel>)`):
//!    LibTorch makes a storage of `numel * itemsize` bytes around the record `<pickle name>/<key>` as read, of
//!    whatever size that is. A storage that claims more bytes than its record holds is a heap overflow at the first
//!    write into the tensor (a training step), and its bytes past the record are heap memory a save writes out;
//!  - a tensor's offset, sizes and strides over its storage (`torch._utils._rebuild_tensor_v2`): LibTorch sets them
//!    without comparing them with the storage's size.
//! So `check_pickle` runs the pickle as LibTorch's unpickler would, on values abstract enough to be cheap (integers,
//! strings, tuples, tensors as their storage's size; the rest opaque), with LibTorch's own treatment of globals
//! (`GLOBAL` pushes the index of a function that `REDUCE` and `BUILD` call, or the dtype of `torch.<T>Storage`), and
//! refuses, naming the member and the storage:
//!  - an opcode at a length or memo index outside the pickle, a stack or mark that runs out;
//!  - a storage whose declared bytes differ from its record's size (or that has none), an unknown dtype, a
//!    negative or overflowing element count;
//!  - a tensor whose offset, sizes and strides reach past its storage (or are negative, or overflow);
//!  - a quantized, sparse or subclassed tensor, a tensor from a tensor table, an RPC reference: kinds that accel
//!    never writes and whose checks it does not make.
//! Values are shared, not copied (a memo entry fetched many times costs nothing), so the check is linear in the
//! pickle's size. Everything the pickle declares is then within the records LibTorch reads.

#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace accel::checkpoint {

//! The size of the record `name` of the archive being checked, if it has one.
using RecordSize = std::function<std::optional<std::uint64_t>(std::string_view name)>;

//! Checks the pickle `p`, the member `member` of the archive `path` whose records `record_size` knows, as the note
//! above says. Throws `FileError` naming `path` and `member`.
ACCEL_DECL void check_pickle(std::span<const std::uint8_t> p, const std::string& path, std::string_view member,
                             const RecordSize& record_size);

}  // namespace accel::checkpoint

#if ACCEL_DEFINITIONS
#include <accel/checkpoint/impl/pickle.ipp>
#endif
