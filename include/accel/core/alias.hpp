#pragma once
//! \file
//! Tensors over a flat buffer's memory that are not autograd views of it: ZeRO's flat parameter space
//! (optim/sharded.hpp), full sharding's unit buffers (model/unit_sharder.hpp), DDP's gradient buckets
//! (model/distributed_module.hpp). A view would not do: an optimizer's parameter must be a leaf, and LibTorch's
//! `Optimizer::zero_grad` calls `detach_()` on gradients, which views refuse.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <vector>

namespace accel::detail {

//! A contiguous tensor of `sizes` over `flat`'s memory from its element `offset`.
inline at::Tensor alias_of(const at::Tensor& flat, std::int64_t offset, at::IntArrayRef sizes) {
  std::vector<std::int64_t> strides(sizes.size(), 1);
  for (std::size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  at::Tensor t = at::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, sizes, strides);
  return t;
}

//! Makes `t` itself (its TensorImpl: every holder of it, a module's parameter, sees it) such an alias of `flat` from
//! element `offset`, keeping its sizes. Its values are not copied.
inline void rebind_to(at::Tensor t, const at::Tensor& flat, std::int64_t offset) {
  const at::Tensor a = alias_of(flat, offset, t.sizes());
  t.set_(a.storage(), a.storage_offset(), a.sizes(), a.strides());
}

}  // namespace accel::detail
