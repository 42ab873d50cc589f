#pragma once
//! \file
//! Collectives on nested structures of tensors (structure.hpp), Accelerate's `utils/operations.py`:
//! `gather`, `broadcast`, `reduce`, `pad_across_processes`, `gather_for_metrics` (of tensors, and of vectors of
//! objects), and the typed `broadcast_object` / `gather_object`. With one process every function returns its input's
//! value, without communicating. Every rank must call the same collectives in the same order.

#include <accel/comm/communicator.hpp>
#include <accel/core/serialize.hpp>
#include <accel/core/structure.hpp>
#include <accel/error.hpp>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace accel {

// [accelerate:utils/operations.py gather]
//! Every rank's tensors concatenated along dim 0 in rank order (0-dim tensors become 1-dim first). All ranks
//! must pass the same shapes; use `pad_across_processes` first otherwise.
template <TensorStructure T>
T gather(comm::Communicator* comm, const T& x) {
  return map_tensors(x, [&](const at::Tensor& t) {
    const at::Tensor flat = t.dim() == 0 ? t.reshape({1}) : t;
    if (!comm || comm->size() == 1) return flat;
    return at::cat(comm->all_gather(flat), 0);
  });
}

// [accelerate:utils/operations.py broadcast]
//! Every rank gets `from`'s tensors (in place; shapes and dtypes must already agree). Returns `x`.
template <TensorStructure T>
T& broadcast(comm::Communicator* comm, T& x, int from = 0) {
  if (comm && comm->size() > 1) for_each_tensor(x, [&](at::Tensor& t) { comm->broadcast(t, from); });
  return x;
}

//! How `reduce` combines the ranks' tensors (Accelerate's `reduction`: "sum", "mean"; also max and min).
enum class Reduction { sum, mean, max, min };

// [accelerate:utils/operations.py reduce]
//! The reduction over ranks of each tensor (a new structure; `x` is unchanged), multiplied by `scale` when it
//! is not 1 (Accelerate honours `scale` only on XLA; here on every engine). The module function's default is the
//! mean, as Accelerate's; `Accelerator::reduce` defaults to the sum, as Accelerate's. `mean` of an integer tensor
//! is an error: it would truncate (Accelerate fails with an in-place division error).
template <TensorStructure T>
T reduce(comm::Communicator* comm, const T& x, Reduction op = Reduction::mean, double scale = 1.0) {
  return map_tensors(x, [&](const at::Tensor& t) {
    at::Tensor out = t.clone();
    if (op == Reduction::mean && !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type()))
      throw InvalidArgument(std::string("accel::reduce: the mean of an integer tensor (") +
                            c10::toString(t.scalar_type()) +
                            ") would truncate; convert it to a floating type first, or reduce with Reduction::sum");
    if (comm && comm->size() > 1) {
      const auto c10op = op == Reduction::max   ? comm::ReduceOp::max
                         : op == Reduction::min ? comm::ReduceOp::min
                                                : comm::ReduceOp::sum;
      comm->all_reduce(out, c10op);
      if (op == Reduction::mean) out.div_(comm->size());
    }
    if (scale != 1.0) out.mul_(scale);
    return out;
  });
}

// [accelerate:utils/operations.py pad_across_processes]
//! Each tensor padded along `dim` with `pad_index` to the largest size any rank has there (at the end, or at
//! the start with `pad_first`). A `dim` outside a tensor's dimensions leaves it unchanged.
template <TensorStructure T>
T pad_across_processes(comm::Communicator* comm, const T& x, int64_t dim = 0, double pad_index = 0,
                       bool pad_first = false) {
  return map_tensors(x, [&](const at::Tensor& t) {
    if (dim >= t.dim() || dim < -t.dim()) return t;
    const int64_t d = dim < 0 ? dim + t.dim() : dim;
    if (!comm || comm->size() == 1) return t;
    at::Tensor size = at::full({1}, t.size(d), at::TensorOptions().dtype(at::kLong).device(comm->device()));
    comm->all_reduce(size, comm::ReduceOp::max);
    const int64_t longest = size.item<int64_t>();
    if (longest == t.size(d)) return t;
    auto shape = t.sizes().vec();
    shape[std::size_t(d)] = longest;
    at::Tensor out = at::full(shape, pad_index, t.options());
    const int64_t start = pad_first ? longest - t.size(d) : 0;
    out.narrow(d, start, t.size(d)).copy_(t);
    return out;
  });
}

// [accelerate:accelerator.py gather_for_metrics]
//! Gathers a batch's results and drops exactly the padding duplicates: rank r contributes its first
//! `layout.real[r]` rows. Works when ranks hold different numbers of rows (uneven tails: the rows are padded
//! for the transfer and cut again). Accelerate truncates the gathered batch to a remainder instead, which
//! keeps duplicates on several paths (Q6, Q8); this cannot.
template <TensorStructure T>
T gather_for_metrics(comm::Communicator* comm, const T& x, const GatherLayout& layout) {
  const int world = comm ? comm->size() : 1;
  detail::require(int(layout.size.size()) == world && int(layout.real.size()) == world,
                  "accel::gather_for_metrics: the layout describes " + std::to_string(layout.size.size()) +
                      " ranks, the job has " + std::to_string(world));
  const int me = comm ? comm->rank() : 0;
  const int64_t longest = *std::max_element(layout.size.begin(), layout.size.end());
  return map_tensors(x, [&](const at::Tensor& t) {
    const at::Tensor rows = t.dim() == 0 ? t.reshape({1}) : t;
    detail::require(rows.size(0) == layout.size[std::size_t(me)],
                    "accel::gather_for_metrics: rank " + std::to_string(me) + " passes " +
                        std::to_string(rows.size(0)) + " rows but its batch has " +
                        std::to_string(layout.size[std::size_t(me)]) + "; pass one row per sample of the batch");
    if (world == 1) return rows.narrow(0, 0, layout.real[0]);
    at::Tensor send = rows;
    if (rows.size(0) != longest) {
      auto shape = rows.sizes().vec();
      shape[0] = longest;
      send = at::zeros(shape, rows.options());
      send.narrow(0, 0, rows.size(0)).copy_(rows);
    }
    auto parts = comm->all_gather(send);
    for (int r = 0; r < world; ++r)
      parts[std::size_t(r)] = parts[std::size_t(r)].narrow(0, 0, layout.real[std::size_t(r)]);
    return at::cat(parts, 0);
  });
}

namespace detail {
inline at::Tensor bytes_tensor(const std::vector<std::uint8_t>& bytes, c10::Device device) {
  at::Tensor t = at::empty({int64_t(bytes.size())}, at::kByte);
  if (!bytes.empty()) std::memcpy(t.data_ptr<std::uint8_t>(), bytes.data(), bytes.size());
  return t.to(device);
}
template <class T>
T from_bytes(const at::Tensor& device_bytes, int64_t n) {
  const at::Tensor t = device_bytes.cpu();
  T out{};
  std::span<const std::uint8_t> in(t.data_ptr<std::uint8_t>(), std::size_t(n));
  accel::deserialize(out, in);
  return out;
}
inline at::Tensor long_tensor(int64_t v, c10::Device device) {
  return at::full({1}, v, at::TensorOptions().dtype(at::kLong).device(device));
}
}  // namespace detail

//! `from`'s value on every rank, by typed serialisation (comm/serialize.hpp).
template <class T>
T broadcast_object(comm::Communicator* comm, const T& value, int from = 0) {
  if (!comm || comm->size() == 1) return value;
  std::vector<std::uint8_t> bytes;
  if (comm->rank() == from) accel::serialize(value, bytes);
  at::Tensor size = detail::long_tensor(int64_t(bytes.size()), comm->device());
  comm->broadcast(size, from);
  const int64_t n = size.item<int64_t>();
  at::Tensor data = comm->rank() == from ? detail::bytes_tensor(bytes, comm->device())
                                         : at::empty({n}, at::TensorOptions().dtype(at::kByte).device(comm->device()));
  comm->broadcast(data, from);
  return comm->rank() == from ? value : detail::from_bytes<T>(data, n);
}

//! Rank r gets `values[r]` of `root` (only `root`'s `values` are read), by typed serialisation: any
//! serialisable value, tensors included (comm/serialize.hpp).
template <class T>
T scatter_object(comm::Communicator* comm, const std::vector<T>& values, int root = 0) {
  if (!comm || comm->size() == 1) return values.at(0);
  const int N = comm->size();
  std::vector<std::vector<std::uint8_t>> bytes(static_cast<std::size_t>(N));
  std::vector<std::int64_t> sizes(std::size_t(N), 0);
  if (comm->rank() == root) {
    detail::require(int(values.size()) == N, "accel::scatter_object: " + std::to_string(values.size()) +
                                                 " values for " + std::to_string(N) + " ranks");
    for (int r = 0; r < N; ++r)
      accel::serialize(values[std::size_t(r)], bytes[std::size_t(r)]),
          sizes[std::size_t(r)] = std::int64_t(bytes[std::size_t(r)].size());
  }
  sizes = broadcast_object(comm, sizes, root);
  const std::int64_t longest = std::max<std::int64_t>(1, *std::max_element(sizes.begin(), sizes.end()));
  std::vector<at::Tensor> chunks;
  if (comm->rank() == root)
    for (auto& b : bytes) b.resize(std::size_t(longest)), chunks.push_back(detail::bytes_tensor(b, comm->device()));
  at::Tensor mine = at::empty({longest}, at::TensorOptions().dtype(at::kByte).device(comm->device()));
  comm->scatter(mine, chunks, root);
  return detail::from_bytes<T>(mine, sizes[std::size_t(comm->rank())]);
}

//! Every rank's value, in rank order.
template <class T>
std::vector<T> gather_object(comm::Communicator* comm, const T& value) {
  if (!comm || comm->size() == 1) return {value};
  std::vector<std::uint8_t> bytes;
  accel::serialize(value, bytes);
  const auto sizes = comm->all_gather(detail::long_tensor(int64_t(bytes.size()), comm->device()));
  int64_t longest = 0;
  for (const auto& s : sizes) longest = std::max(longest, s.item<int64_t>());
  bytes.resize(std::size_t(longest));
  const auto parts = comm->all_gather(detail::bytes_tensor(bytes, comm->device()));
  std::vector<T> out;
  for (int r = 0; r < comm->size(); ++r)
    out.push_back(detail::from_bytes<T>(parts[std::size_t(r)], sizes[std::size_t(r)].item<int64_t>()));
  return out;
}

// [accelerate:accelerator.py gather_for_metrics]
//! `gather_for_metrics` of objects (Accelerate's `use_gather_object` path, taken for non-tensor data): one element
//! per sample of the batch, any serialisable type (core/serialize.hpp). Every rank gets the ranks' elements in
//! rank order, rank r's first `layout.real[r]` only: the same samples as the tensor form keeps for the same
//! layout (padding is dropped before the transfer). One `gather_object`, two all-gathers.
template <class T>
requires(!TensorStructure<std::vector<T>>) std::vector<T> gather_for_metrics(comm::Communicator* comm,
                                                                             const std::vector<T>& x,
                                                                             const GatherLayout& layout) {
  const int world = comm ? comm->size() : 1;
  detail::require(int(layout.size.size()) == world && int(layout.real.size()) == world,
                  "accel::gather_for_metrics: the layout describes " + std::to_string(layout.size.size()) +
                      " ranks, the job has " + std::to_string(world));
  const int me = comm ? comm->rank() : 0;
  detail::require(std::int64_t(x.size()) == layout.size[std::size_t(me)],
                  "accel::gather_for_metrics: rank " + std::to_string(me) + " passes " + std::to_string(x.size()) +
                      " objects but its batch has " + std::to_string(layout.size[std::size_t(me)]) +
                      "; pass one object per sample of the batch");
  const std::vector<T> real(x.begin(), x.begin() + layout.real[std::size_t(me)]);
  if (world == 1) return real;
  std::vector<T> out;
  for (auto& part : gather_object(comm, real)) std::move(part.begin(), part.end(), std::back_inserter(out));
  return out;
}

}  // namespace accel
