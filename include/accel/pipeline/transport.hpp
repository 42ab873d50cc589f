#pragma once
//! \file
//! Transports: how a fetched step reaches the process that trains on it. A step source (planned_source.hpp,
//! batch_sampler_source.hpp, stream_source.hpp) fetches a step into a `Fetched<Payload>`; the prepared loader's
//! cursor hands it to the transport on the loop's thread (collectives must keep their order), which returns this
//! rank's batch.
//!
//! | transport           | reader of rank r | payload                               | what it does                 |
//! |---------------------|------------------|---------------------------------------|------------------------------|
//! | `LocalTransport`    | r                | this rank's batch, fetched and placed | nothing (sharded loading)    |
//! | `DispatchTransport` | 0                | rank 0: the global batch and its `DispatchStep` | packs every rank's
//! message (on the workers), scatters them in one collective, places the slice |
//!
//! The transport owns what differs between the loading paths, and the sources and the loader core ask it (never
//! the configuration's `loading` policy): which rank reads the data of rank r's steps (`reader_of(r)`, whether r
//! reads at all: `reads_on(r)`; `single_reader`: one rank reads for all, so it alone samples and every rank runs
//! its steps) and what a fetched step carries (`payload_type<Batch>`). A source states which transports it works
//! with (`static_assert`s naming the mismatch), so a prepared loader whose source and transport disagree does not
//! compile (tests/fail/source_transport_mismatch.cpp), nor one whose configuration's `loading` policy and transport
//! disagree (data/prepared_loader.hpp; tests/fail/loading_transport_mismatch.cpp).
//!
//! A transport may also `pack` a fetched step where it was fetched (on the loader's workers): the dispatched
//! transport cuts rank 0's global batch into every rank's message there, so that the loop's thread only sends it
//! (Note [One message per step]).

#include <accel/comm/collectives.hpp>
#include <accel/core/serialize.hpp>
#include <accel/core/structure.hpp>
#include <accel/data/prepare_context.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/plan/plan.hpp>
#include <accel/state/gradient_state.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace accel::pipeline {

//! No slice function: dispatched loading cuts every tensor along dim 0 (Accelerate's default `slice_fn`).
struct NoSlice {};

namespace detail {

using data::PrepareContext;

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
inline auto accel_fields(DispatchStep& s) {
  return std::tie(s.has_step, s.end, s.begin, s.size, s.real, s.dtypes, s.shapes, s.error);
}
inline auto accel_fields(const DispatchStep& s) {
  return std::tie(s.has_step, s.end, s.begin, s.size, s.real, s.dtypes, s.shapes, s.error);
}

//! What dispatched loading fetches: the step's description (rank 0 fills it) and, on rank 0, the global batch and
//! (packed on the worker that fetched it) every rank's message.
template <class Batch>
struct DispatchPayload {
  DispatchStep step;
  std::optional<Batch> global;
  at::Tensor message;  //!< rank 0, no slice function: [N, length] bytes on the engine's device (`pack_step`)
};

// Note [One message per step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Dispatched loading's transport is on the loop's thread (its collectives keep their order with the training's),
// so every collective there is time the step loses: a broadcast of the step's description (two: its length, then
// its bytes) and one scatter per tensor leaf cost 1.5 ms a step on 2 loaded CPU processes (benchmarks/README.md,
// Prefetching). So a step is one scatter: rank 0 sends each rank one message of `capacity` bytes,
//
//     [ int64 length | int64 description bytes | description (DispatchStep, serialised) | leaf 0 rows | leaf 1 rows ...
//     ]
//
// every part 16-byte aligned; a leaf's part holds the step's largest slice (`max(size)` rows of its trailing shape),
// rank r's rows first. Every rank computes the offsets alone from the description (`MessageLayout`), and its leaves are
// views into the received message (no copy). The capacity is the loader's, the same on every rank: it starts at 0
// and grows only when a message does not fit, at a step every rank learns from the message's header: rank 0 then
// sends the header alone (a scatter of the old capacity, or a broadcast of the length while the capacity is under
// a header) and the message again at the new capacity (at least 1/8 more, so that growing shapes do not grow it at
// every step). With fixed shapes the capacity is set by the first step and every later step is one scatter. Rank 0
// packs the messages on the worker that fetched the step (`DispatchTransport::pack`), so the cutting and copying run
// ahead of the loop too.

//! Where every part of a step's message lies (Note [One message per step]), from its description alone.
struct MessageLayout {
  std::int64_t rows = 0, length = 0;
  std::vector<std::int64_t> offset, row_bytes;  // per tensor leaf
  static constexpr std::int64_t header = 16;    // int64 length, int64 description bytes
  static std::int64_t aligned(std::int64_t n) { return (n + 15) / 16 * 16; }
  //! The layout of `step` (a step of `N` ranks), whose serialised description has `description` bytes. Refuses a
  //! description that is not one of N ranks, names an unknown dtype, or whose sizes do not fit in an int64.
  static MessageLayout of(const DispatchStep& step, std::int64_t description, int N) {
    accel::detail::require(
        (!step.has_step || int(step.size.size()) == N) && step.shapes.size() == step.dtypes.size(),
        "accel: dispatched loading: a message from rank 0 describes another number of ranks or leaves");
    MessageLayout m;
    for (const auto s : step.size) m.rows = std::max(m.rows, s);
    m.length = aligned(header + description);
    for (std::size_t l = 0; l < step.dtypes.size(); ++l) {
      accel::detail::require(accel::detail::serialisable_dtype(step.dtypes[l]),
                             "accel: dispatched loading: a message from rank 0 names an unknown dtype");
      std::int64_t bytes = std::int64_t(c10::elementSize(at::ScalarType(step.dtypes[l]))), part = 0;
      bool overflow = false;
      for (const auto d : step.shapes[l]) overflow |= d < 0 || __builtin_mul_overflow(bytes, d, &bytes);
      overflow |= __builtin_mul_overflow(bytes, m.rows, &part) || part > INT64_MAX - 16 - m.length;
      accel::detail::require(
          !overflow, "accel: dispatched loading: a step's batch is too large to send (leaf " + std::to_string(l) + ")");
      m.offset.push_back(m.length);
      m.row_bytes.push_back(bytes);
      m.length += aligned(part);
    }
    return m;
  }
  //! `rows` rows of leaf `l` in the message `bytes` (rank r's part of rank 0's messages, or the one received).
  static at::Tensor leaf(const at::Tensor& bytes, const MessageLayout& m, const DispatchStep& step, std::size_t l,
                         std::int64_t rows) {
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), step.shapes[l].begin(), step.shapes[l].end());
    return bytes.narrow(0, m.offset[l], rows * m.row_bytes[l]).view(at::ScalarType(step.dtypes[l])).view(shape);
  }
  //! The header and `description`, padded to 16 bytes (CPU): the start of every rank's message, or (no description)
  //! the header alone that announces a message longer than the capacity.
  static at::Tensor head(std::int64_t length, std::span<const std::uint8_t> description) {
    at::Tensor h = at::zeros({aligned(header + std::int64_t(description.size()))}, at::kByte);
    const std::int64_t sizes[2] = {length, std::int64_t(description.size())};
    std::memcpy(h.data_ptr<std::uint8_t>(), sizes, sizeof sizes);
    if (!description.empty()) std::memcpy(h.data_ptr<std::uint8_t>() + header, description.data(), description.size());
    return h;
  }
  //! The length and description bytes a received message's header gives (checked).
  static std::pair<std::int64_t, std::int64_t> read_head(const at::Tensor& bytes) {
    const at::Tensor h = bytes.narrow(0, 0, header).cpu();
    std::int64_t v[2];
    std::memcpy(v, h.data_ptr<std::uint8_t>(), sizeof v);
    accel::detail::require(v[1] >= 0 && v[0] >= header + v[1],
                           "accel: dispatched loading: a message from rank 0 has a "
                           "malformed header (length " +
                               std::to_string(v[0]) + ")");
    return {v[0], v[1]};
  }
};

//! Rank 0's loading error stops every rank with its message (on rank 0, the message itself). Returns whether there
//! is a step (false: the end of a stream).
inline bool step_or_error(int rank, const DispatchStep& step) {
  if (!step.error.empty())
    throw Error(rank == 0 ? step.error
                          : "accel: rank " + std::to_string(rank) + ": dispatched loading stopped: " + step.error);
  return step.has_step;
}

//! Rank 0: the step's description completed with every tensor leaf's dtype and trailing shape, and every rank's
//! message packed (`payload.message`). A batch that cannot be cut (a leaf with no rows) becomes the step's error,
//! which every rank then stops with.
template <class Batch>
void pack_step(const PrepareContext& ctx, DispatchPayload<Batch>& payload) {
  auto& step = payload.step;
  const int N = ctx.num_processes;
  const auto dev = ctx.comm ? ctx.comm->device() : c10::Device(c10::kCPU);
  std::vector<at::Tensor> leaves;
  step.dtypes.clear(), step.shapes.clear();
  if (payload.global && step.error.empty()) {
    try {
      for_each_tensor(*payload.global, [&](const at::Tensor& t) {
        accel::detail::require(t.dim() >= 1,
                               "accel: dispatched loading cuts every tensor of a batch along its first "
                               "dimension; a leaf has none (a 0-d tensor): give it one, or pass a slice function");
        step.dtypes.push_back(std::int8_t(t.scalar_type()));
        step.shapes.push_back(t.sizes().slice(1).vec());
        leaves.push_back(t);
      });
    } catch (const std::exception& e) {
      step.error = e.what(), step.dtypes.clear(), step.shapes.clear(), leaves.clear();
    }
  }
  std::vector<std::uint8_t> description;
  accel::serialize(step, description);
  const auto layout = MessageLayout::of(step, std::int64_t(description.size()), N);
  const at::Tensor head = MessageLayout::head(layout.length, description).to(dev);
  at::Tensor message = at::zeros({N, layout.length}, at::TensorOptions().dtype(at::kByte).device(dev));
  message.narrow(1, 0, head.numel()).copy_(head.unsqueeze(0).expand({N, head.numel()}));
  for (std::size_t l = 0; l < leaves.size(); ++l) {
    const at::Tensor src = leaves[l].to(dev);
    for (int r = 0; r < N; ++r)
      if (const std::int64_t rows = step.size[std::size_t(r)]; rows > 0)
        MessageLayout::leaf(message[r], layout, step, l, rows).copy_(src.narrow(0, step.begin[std::size_t(r)], rows));
  }
  payload.message = std::move(message);
}

//! Every rank: its message of the step (one scatter of `capacity` bytes from rank 0, two when the capacity grows:
//! Note [One message per step]) as a 1-d byte tensor on the engine's device, and its description's bytes.
inline std::pair<at::Tensor, std::int64_t> receive_message(const PrepareContext& ctx, const at::Tensor& sent,
                                                           std::int64_t& capacity) {
  if (!ctx.comm || ctx.num_processes == 1) return {sent[0], MessageLayout::read_head(sent[0]).second};
  const int me = ctx.process_index, N = ctx.num_processes;
  const auto dev = ctx.comm->device();
  const auto bytes = at::TensorOptions().dtype(at::kByte).device(dev);
  // Rank 0's messages at `capacity` bytes (padded, or the header alone when they do not fit).
  auto chunks = [&] {
    std::vector<at::Tensor> out;
    if (me != 0) return out;
    const std::int64_t length = sent.size(1);
    at::Tensor padded = sent;
    if (length > capacity) {
      padded = at::zeros({N, capacity}, bytes);
      padded.narrow(1, 0, MessageLayout::header)
          .copy_(MessageLayout::head(length, {}).to(dev).unsqueeze(0).expand({N, MessageLayout::header}));
    } else if (length < capacity) {
      padded = at::zeros({N, capacity}, bytes);
      padded.narrow(1, 0, length).copy_(sent);
    }
    for (int r = 0; r < N; ++r) out.push_back(padded[r]);
    return out;
  };
  std::int64_t length = 0, description = 0;
  at::Tensor mine;
  if (capacity < MessageLayout::header) {  // nothing sent yet: the length first
    at::Tensor n = at::full({2}, me == 0 ? sent.size(1) : 0, at::TensorOptions().dtype(at::kLong).device(dev));
    ctx.comm->broadcast(n, 0);
    length = n[0].item<std::int64_t>();
    accel::detail::require(
        length >= MessageLayout::header,
        "accel: dispatched loading: rank 0 announced a message of " + std::to_string(length) + " bytes");
  } else {
    mine = at::empty({capacity}, bytes);
    ctx.comm->scatter(mine, chunks(), 0);
    std::tie(length, description) = MessageLayout::read_head(mine);
  }
  if (length > capacity) {
    capacity = std::max(length, MessageLayout::aligned(capacity + capacity / 8));
    mine = at::empty({capacity}, bytes);
    ctx.comm->scatter(mine, chunks(), 0);
    const auto again = MessageLayout::read_head(mine);
    accel::detail::require(again.first == length, "accel: dispatched loading: rank 0's message changed length");
    description = again.second;
  }
  return {mine.narrow(0, 0, length), description};
}

//! Every rank learns rank 0's description of the step (a typed broadcast); rank 0's loading error stops every rank
//! with its message. Returns whether there is a step (false: the end of a stream).
inline bool receive_step(const PrepareContext& ctx, DispatchStep& step) {
  if (ctx.comm && ctx.num_processes > 1) step = broadcast_object(ctx.comm, step, 0);
  return step_or_error(ctx.process_index, step);
}

//! Every rank's batch of the step: its message received (Note [One message per step]) and its leaves viewed in it,
//! `size[me]` rows each; with a slice function, the description broadcast and rank 0's cut parts scattered as
//! objects. Counts the tensor bytes received and those a broadcast of the whole global batch would have cost.
template <class Batch, class Slice>
Batch dispatch_transport(const PrepareContext& ctx, DispatchPayload<Batch>& payload, std::int64_t& capacity,
                         std::int64_t& bytes_received, std::int64_t& bytes_broadcast, const Slice& slice) {
  const int me = ctx.process_index, N = ctx.num_processes;
  auto& step = payload.step;
  const auto& global = payload.global;
  if constexpr (!std::is_same_v<Slice, NoSlice>) {
    // A slice function: rank 0 cuts the global batch with it and every rank receives its part, serialised
    // (any serialisable batch: tensors, strings, numbers, described structs).
    if (!receive_step(ctx, step)) return Batch{};
    std::vector<Batch> parts;
    if (me == 0)
      for (int r = 0; r < N; ++r)
        parts.push_back(slice(*global, step.begin[std::size_t(r)], step.size[std::size_t(r)]));
    if (ctx.comm && N > 1) return scatter_object(ctx.comm, parts, 0);
    return parts.at(std::size_t(me));
  } else if constexpr (TensorStructure<Batch>) {
    const auto received = receive_message(ctx, payload.message, capacity);
    const at::Tensor& message = received.first;
    const std::int64_t description = received.second;
    if (me != 0) {  // rank 0 has its own description
      const at::Tensor bytes = message.narrow(0, MessageLayout::header, description).cpu();
      std::span<const std::uint8_t> in(bytes.data_ptr<std::uint8_t>(), std::size_t(description));
      step = DispatchStep{};
      accel::deserialize(step, in);
    }
    if (!step_or_error(me, step)) return Batch{};
    const auto layout = MessageLayout::of(step, description, N);
    accel::detail::require(layout.length == message.numel(),
                           "accel: dispatched loading: a message from rank 0 is " + std::to_string(message.numel()) +
                               " bytes, its description says " + std::to_string(layout.length));
    const std::int64_t total = std::accumulate(step.size.begin(), step.size.end(), std::int64_t{0});
    Batch out{};
    if (me == 0 && global) out = *global;
    std::size_t leaf = 0;
    for_each_tensor(out, [&](at::Tensor& t) {
      const std::size_t l = leaf++;
      accel::detail::require(l < step.dtypes.size(),
                             "accel: dispatched loading: the batch's structure differs between ranks");
      bytes_received += layout.rows * layout.row_bytes[l];
      bytes_broadcast += total * layout.row_bytes[l];
      t = MessageLayout::leaf(message, layout, step, l, layout.rows).narrow(0, 0, step.size[std::size_t(me)]);
    });
    accel::detail::require(leaf == step.dtypes.size(),
                           "accel: dispatched loading: the batch's structure differs between ranks");
    return out;
  } else {
    static_assert(
        !std::is_same_v<Slice, NoSlice>,
        "accel::loading::dispatched cuts batches by their tensors: every leaf of the batch must be a tensor; for "
        "other fields pass a slice function to prepare_data_loader, or use loading::sharded");
    return Batch{};  // the slice-function branch above has returned already
  }
}

}  // namespace detail

//! What the sources and the loader core ask of a transport (the table above).
template <class T>
concept StepTransport = requires(int rank) {
  { T::single_reader } -> std::convertible_to<bool>;
  { T::reader_of(rank) } -> std::same_as<int>;
  { T::reads_on(rank) } -> std::same_as<bool>;
  typename T::template payload_type<int>;
};

//! Sharded loading: the source fetched (and placed) this rank's own batch; nothing moves.
struct LocalTransport {
  //! Every rank reads its own batches (from its own plan, or its own shard).
  static constexpr bool single_reader = false;
  static constexpr int reader_of(int rank) noexcept { return rank; }
  static constexpr bool reads_on(int) noexcept { return true; }
  //! The step is this rank's batch, fetched and placed.
  template <class Batch>
  using payload_type = Batch;

  template <class Core, class Batch>
  void pack(const Core&, detail::Fetched<Batch>&) const {}
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
  //! Rank 0 reads every rank's rows (it alone samples); every rank runs rank 0's steps.
  static constexpr bool single_reader = true;
  static constexpr int reader_of(int) noexcept { return 0; }
  static constexpr bool reads_on(int rank) noexcept { return rank == 0; }
  //! The step as rank 0 describes it, and on rank 0 the global batch and every rank's message.
  template <class Batch>
  using payload_type = detail::DispatchPayload<Batch>;

  Slice slice;
  //! On the worker that fetched the step: rank 0 packs every rank's message (not with a slice function).
  template <class Core, class Batch>
  void pack(const Core& k, detail::Fetched<detail::DispatchPayload<Batch>>& f) const {
    if constexpr (std::is_same_v<Slice, NoSlice> && TensorStructure<Batch>)
      if (reads_on(k.ctx.process_index)) detail::pack_step(k.ctx, f.payload);
  }
  template <class Core, class Batch>
  std::optional<Batch> deliver(Core& k, detail::Fetched<detail::DispatchPayload<Batch>>& f) const {
    auto& step = f.payload.step;
    Batch out = detail::dispatch_transport(k.ctx, f.payload, k.dispatch_capacity, k.bytes_received,
                                           k.bytes_broadcast_equivalent, slice);
    if (!step.has_step) return std::nullopt;
    if (!f.view.plans) f.view = {.end_of_dataloader = step.end, .direct = {step.size, step.real}};
    return k.placement()(std::move(out));
  }
};

//! Every rank reads its own batch, which is what the step carries (sharded loading).
template <class T, class Batch>
concept EveryRankReads =
    StepTransport<T> && !T::single_reader && std::same_as<typename T::template payload_type<Batch>, Batch>;
//! One rank reads every rank's rows and describes the step to the others (dispatched loading).
template <class T, class Batch>
concept OneRankReads = StepTransport<T> && T::single_reader &&
    std::same_as<typename T::template payload_type<Batch>, detail::DispatchPayload<Batch>>;

static_assert(EveryRankReads<LocalTransport, int> && OneRankReads<DispatchTransport<>, int>);

}  // namespace accel::pipeline
