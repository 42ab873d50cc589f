#pragma once
//! \file
//! Transports: how a fetched step reaches the process that trains on it. A step source (planned_source.hpp,
//! batch_sampler_source.hpp, stream_source.hpp) fetches a step into a `Fetched<Payload>`; the prepared loader's
//! cursor hands it to the transport on the loop's thread (collectives must keep their order), which returns this
//! rank's batch.
//!
//! | transport           | payload                                   | what it does                                 |
//! |---------------------|-------------------------------------------|----------------------------------------------|
//! | `LocalTransport`    | this rank's batch, fetched and placed     | nothing (sharded loading)                    |
//! | `DispatchTransport` | rank 0: the global batch and its `DispatchStep` | broadcasts the step's description, scatters every tensor leaf, places the slice |

#include <accel/comm/collectives.hpp>
#include <accel/core/serialize.hpp>
#include <accel/core/structure.hpp>
#include <accel/data/loader_core.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/state/gradient_state.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace accel::data {

//! No slice function: dispatched loading cuts every tensor along dim 0 (Accelerate's default `slice_fn`).
struct NoSlice {};

namespace detail {

//! One fetched step: what the transport moves, and what the loader publishes to `GradientState` once the loop
//! holds the batch (whether it is the last, and every rank's rows: from the plans, or a layout).
template <class Payload>
struct Fetched {
  Payload payload;
  GradientState::LoaderView view;
};

//! One step of dispatched loading, as rank 0 describes it: where each rank's rows start in the global batch,
//! how many it gets and how many of those are real, whether it is the epoch's last step, and rank 0's error.
struct DispatchStep {
  bool has_step = false;
  bool end = false;
  std::vector<std::int64_t> begin, size, real;
  std::vector<std::int8_t> dtypes;
  std::vector<std::vector<std::int64_t>> shapes;  // trailing dimensions of every tensor leaf
  std::string error;
  //! The step's cut (`plan::DispatchCut`) as per-rank rows.
  void cut(const plan::DispatchCut& c, int N) {
    for (int r = 0; r < N; ++r) {
      const plan::Span s = c.slice(r);
      begin.push_back(s.begin);
      size.push_back(s.size());
      real.push_back(c.real(r));
    }
  }
};
inline auto accel_fields(DispatchStep& s) { return std::tie(s.has_step, s.end, s.begin, s.size, s.real, s.dtypes, s.shapes, s.error); }
inline auto accel_fields(const DispatchStep& s) { return std::tie(s.has_step, s.end, s.begin, s.size, s.real, s.dtypes, s.shapes, s.error); }

//! What dispatched loading fetches: the step's description (rank 0 fills it) and, on rank 0, the global batch.
template <class Batch>
struct DispatchPayload {
  DispatchStep step;
  std::optional<Batch> global;
};

//! Every rank learns rank 0's description of the step (a typed broadcast); rank 0's loading error stops every rank
//! with its message. Returns whether there is a step (false: the end of a stream).
ACCEL_DECL bool receive_step(const PrepareContext& ctx, DispatchStep& step);
#if ACCEL_DEFINITIONS
ACCEL_DECL bool receive_step(const PrepareContext& ctx, DispatchStep& step) {
  if (ctx.comm && ctx.num_processes > 1) step = broadcast_object(ctx.comm, step, 0);
  if (!step.error.empty())
    throw Error(ctx.process_index == 0 ? step.error
                                       : "accel: rank " + std::to_string(ctx.process_index) + ": dispatched loading stopped: " + step.error);
  return step.has_step;
}
#endif

//! Rank 0 sends the step's description (typed broadcast), then every tensor leaf of the global batch is cut into
//! per-rank chunks (padded to one size) and scattered, and every rank keeps its `size[me]` rows. Returns this
//! rank's batch; counts the bytes received and those a broadcast of the whole global batch would have cost.
template <class Batch, class Slice>
Batch dispatch_transport(const PrepareContext& ctx, DispatchStep& step, const std::optional<Batch>& global,
                         std::int64_t& bytes_received, std::int64_t& bytes_broadcast, const Slice& slice) {
  const int me = ctx.process_index, N = ctx.num_processes;
  if constexpr (!std::is_same_v<Slice, NoSlice>) {
    // A slice function: rank 0 cuts the global batch with it and every rank receives its part, serialised
    // (any serialisable batch: tensors, strings, numbers, described structs).
    if (!receive_step(ctx, step)) return Batch{};
    std::vector<Batch> parts;
    if (me == 0)
      for (int r = 0; r < N; ++r) parts.push_back(slice(*global, step.begin[std::size_t(r)], step.size[std::size_t(r)]));
    if (ctx.comm && N > 1) return scatter_object(ctx.comm, parts, 0);
    return parts.at(std::size_t(me));
  } else if constexpr (TensorStructure<Batch>) {
    if (me == 0 && global) {
      step.dtypes.clear(), step.shapes.clear();
      for_each_tensor(*global, [&](const at::Tensor& t) {
        step.dtypes.push_back(std::int8_t(t.scalar_type()));
        step.shapes.push_back(t.sizes().slice(1).vec());
      });
    }
    if (!receive_step(ctx, step)) return Batch{};
    const std::int64_t rows = *std::max_element(step.size.begin(), step.size.end());
    const std::int64_t total = std::accumulate(step.size.begin(), step.size.end(), std::int64_t{0});
    Batch out{};
    if (me == 0 && global) out = *global;
    std::size_t leaf = 0;
    const auto dev = ctx.comm ? ctx.comm->device() : c10::Device(c10::kCPU);
    for_each_tensor(out, [&](at::Tensor& t) {
      const std::size_t l = leaf++;
      accel::detail::require(l < step.dtypes.size(), "accel: dispatched loading: the batch's structure differs between ranks");
      std::vector<std::int64_t> shape{rows};
      shape.insert(shape.end(), step.shapes[l].begin(), step.shapes[l].end());
      const auto opts = at::TensorOptions().dtype(at::ScalarType(step.dtypes[l])).device(dev);
      std::vector<at::Tensor> chunks;
      if (me == 0) {
        const at::Tensor src = t.to(dev);
        for (int r = 0; r < N; ++r) {
          at::Tensor chunk = at::zeros(shape, opts);
          if (step.size[std::size_t(r)] > 0)
            chunk.narrow(0, 0, step.size[std::size_t(r)]).copy_(src.narrow(0, step.begin[std::size_t(r)], step.size[std::size_t(r)]));
          chunks.push_back(chunk);
        }
      }
      at::Tensor mine = at::empty(shape, opts);
      if (ctx.comm && N > 1) ctx.comm->scatter(mine, chunks, 0);
      else mine = chunks.at(std::size_t(me));
      const std::int64_t row_bytes = (mine.numel() / std::max<std::int64_t>(rows, 1)) * std::int64_t(mine.element_size());
      bytes_received += rows * row_bytes;
      bytes_broadcast += total * row_bytes;
      t = mine.narrow(0, 0, step.size[std::size_t(me)]);
    });
    return out;
  } else {
    static_assert(!std::is_same_v<Slice, NoSlice>,
                  "accel::loading::dispatched cuts batches by their tensors: every leaf of the batch must be a tensor; for "
                  "other fields pass a slice function to prepare_data_loader, or use loading::sharded");
    return Batch{};  // the slice-function branch above has returned already
  }
}

}  // namespace detail

//! Sharded loading: the source fetched (and placed) this rank's own batch; nothing moves.
struct LocalTransport {
  template <class Core, class Batch>
  std::optional<Batch> deliver(Core&, detail::Fetched<Batch>& f) const {
    return std::move(f.payload);
  }
};

//! Dispatched loading: rank 0's global batch is cut and scattered; the slice is placed on this rank's device.
//! When rank 0 says there is no step (the end of a stream), there is no batch. A stream's last step and rows
//! are learned here, from rank 0's description.
template <class Slice = NoSlice>
struct DispatchTransport {
  Slice slice;
  template <class Core, class Batch>
  std::optional<Batch> deliver(Core& k, detail::Fetched<detail::DispatchPayload<Batch>>& f) const {
    auto& step = f.payload.step;
    Batch out = detail::dispatch_transport(k.ctx, step, f.payload.global, k.bytes_received, k.bytes_broadcast_equivalent, slice);
    if (!step.has_step) return std::nullopt;
    if (!f.view.plans) f.view = {.end_of_dataloader = step.end, .direct = {step.size, step.real}};
    return k.placement()(std::move(out));
  }
};

}  // namespace accel::data
