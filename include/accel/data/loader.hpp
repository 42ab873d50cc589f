#pragma once
//! \file
//! `DataLoader` (the user's loader, usable as it is) and the prepared loaders `ShardedLoader` and
//! `DispatchedLoader` (Accelerate's `DataLoaderShard` and `DataLoaderDispatcher`).
//!
//! \code
//! accel::data::DataLoader loader(accel::data::TensorDataset(x, y), {.batch_size = 64, .shuffle = true, .workers = 2});
//! accel::ProcessState state;
//! auto sharded = accel::data::prepare_data_loader<Acc::config>(loader, state);   // ShardedLoader or DispatchedLoader
//! for (int epoch = 0; epoch < 3; ++epoch) {
//!   sharded.set_epoch(epoch);
//!   for (const auto& batch : sharded) ...;             // batch.data, batch.target on state.device()
//! }
//! auto checkpoint = sharded.state_dict();              // resume later with load_state_dict(checkpoint)
//! \endcode
//!
//! Both prepared loaders are cheap, copyable range handles over shared state (copies iterate the same
//! loader), single-pass per epoch, sized. Every batch is computed from the epoch's plan (data/plan.hpp), so
//! `end_of_dataloader`, the padding rows of every rank (`GradientState::layout`, for gather_for_metrics),
//! skipping and resuming need no look-ahead and no extra fetches; with workers, the next batches are prepared
//! while the loop runs.

#include <accel/comm/collectives.hpp>
#include <accel/comm/rng.hpp>
#include <accel/data/batch_sampler_shard.hpp>
#include <accel/comm/serialize.hpp>
#include <accel/config.hpp>
#include <accel/data/collate.hpp>
#include <accel/data/dataset.hpp>
#include <accel/data/placement.hpp>
#include <accel/data/plan.hpp>
#include <accel/data/plan_view.hpp>
#include <accel/data/pass_iterator.hpp>
#include <accel/data/prefetcher.hpp>
#include <accel/data/sampler.hpp>
#include <accel/data/gradient_state.hpp>
#include <accel/data/iterable_shard.hpp>
#include <accel/state/process_state.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <ranges>
#include <vector>

namespace accel::data {

//! The user's loader settings (PyTorch's DataLoader arguments, plus the seedable sampler of Accelerate).
struct DataLoaderOptions {
  std::int64_t batch_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  int workers = 0;             //!< threads preparing batches (0: on the loop's thread)
  int prefetch = 2;            //!< batches prepared ahead, per worker
  bool seedable = false;       //!< Accelerate's use_seedable_sampler: epoch e is seeded with seed + e
  std::optional<std::uint64_t> data_seed;
  //! PyTorch's `generator=`: the shuffling generator's seed. Unset: drawn from the global generator when the
  //! loader is prepared (Accelerate's rule). Either way it is synchronised across ranks at every epoch.
  std::optional<std::uint64_t> seed;
  //! Stage batches in pinned (page-locked) memory before they are copied to a GPU (`place::device`), so the copy
  //! can run without an extra staging copy. No effect for CPU runs; `place::async` always pins.
  bool pin_memory = false;
  //! A sampler of the user's: the order of epoch e (indices into the dataset, any length); replaces `shuffle`.
  std::function<std::vector<std::int64_t>(std::int64_t epoch)> sampler;
  //! A batch sampler of the user's: the batches of epoch e, of any sizes (bucketing by length, max-tokens...);
  //! replaces `batch_size`, `shuffle` and `sampler`. Sharded as Accelerate's BatchSamplerShard does (whole
  //! batches per process; `drop_last` drops an incomplete round). Needs `batches::per_process`.
  std::function<std::vector<std::vector<std::int64_t>>(std::int64_t epoch)> batch_sampler;
};

//! What a loader's checkpoint holds: enough for a fresh process to yield exactly the remaining batches.
struct LoaderState {
  std::int64_t epoch = 0;                      //!< the epoch in progress (or the next one)
  std::int64_t batches = 0;                    //!< batches of that epoch already handed to the loop
  std::vector<std::uint8_t> generator_state;   //!< the sampling generator's state at the start of that epoch
};
inline auto accel_fields(LoaderState& s) { return std::tie(s.epoch, s.batches, s.generator_state); }
inline auto accel_fields(const LoaderState& s) { return std::tie(s.epoch, s.batches, s.generator_state); }

//! Who puts the global generator where a resumed job needs it, when a one-process loader draws its order
//! from it: the loader (rewinding it to the resumed epoch's start) or the caller (`Accelerator::load_state`).
enum class GlobalGenerator { rewound_by_loader, restored_by_caller };

//! A map-style or an iterable dataset.
template <class D>
concept LoaderDataset = MapDataset<D> || IterableDataset<D>;

//! A dataset (map-style or iterable) plus loader options and a collate function.
template <LoaderDataset Dataset, class Collate = DefaultCollate>
class DataLoader {
 public:
  DataLoader(Dataset dataset, DataLoaderOptions options = {}, Collate collate = {})
      : dataset_(std::make_shared<const Dataset>(std::move(dataset))), options_(options), collate_(std::move(collate)) {
    accel::detail::require(options_.batch_size >= 1, "accel::data::DataLoader: batch_size must be at least 1 (got " +
                                                        std::to_string(options_.batch_size) + ")");
    accel::detail::require(options_.workers >= 0, "accel::data::DataLoader: workers must be 0 or more");
  }
  [[nodiscard]] const std::shared_ptr<const Dataset>& dataset() const noexcept { return dataset_; }
  [[nodiscard]] const DataLoaderOptions& options() const noexcept { return options_; }
  [[nodiscard]] const Collate& collate() const noexcept { return collate_; }
  [[nodiscard]] std::int64_t size() const
    requires MapDataset<Dataset>
  {
    return plan::batch_plan(options_.batch_size, options_.drop_last, dataset_->size()).size();
  }
  //! Iterates the loader as it is, in one process (PyTorch's DataLoader: a shuffled epoch draws its seed
  //! from the global generator). Defined below, after the prepared loaders.
  [[nodiscard]] auto begin() const;
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  Collate collate_;
};

//! Where a prepared loader runs: its rank among `num_processes`, the communicator (nullptr: one process, or
//! ranks simulated in one process as Accelerate's `prepare_data_loader(num_processes=, process_index=)`), and
//! the device batches go to.
struct PrepareContext {
  int num_processes = 1;
  int process_index = 0;
  comm::Communicator* comm = nullptr;
  c10::Device device = c10::Device(c10::kCPU);
  static PrepareContext of(const ProcessState& s) {
    return {s.num_processes(), s.process_index(), s.comm(), s.device()};
  }
};

namespace detail {

//! Fetches the samples of positions of a plan: one `get_batch` when the dataset has it, else `get` per
//! sample and the collate function. Errors name the sample.
template <class Dataset, class Collate>
auto fetch(const Dataset& ds, const Collate& collate, std::span<const std::int64_t> indices) {
  if constexpr (BatchedDataset<Dataset>) {
    return ds.get_batch(indices);
  } else {
    std::vector<sample_t<Dataset>> samples;
    samples.reserve(indices.size());
    for (auto i : indices) samples.push_back(ds.get(i));
    return collate(samples);
  }
}
//! `fetch`, with a failure reported as which batch of which epoch on which rank, and the original message.
template <class Dataset, class Collate>
auto fetch_batch(const Dataset& ds, const Collate& collate, std::span<const std::int64_t> indices, std::int64_t batch,
                 std::int64_t epoch, int rank) {
  try {
    return fetch(ds, collate, indices);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (const auto cut = msg.find("\nException raised from"); cut != std::string::npos) msg.resize(cut);
    std::string first = indices.empty() ? "" : " (first sample " + std::to_string(indices.front()) + ")";
    throw Error("accel: rank " + std::to_string(rank) + ": loading batch " + std::to_string(batch) + " of epoch " +
                std::to_string(epoch) + first + " failed: " + msg);
  }
}
template <class Dataset, class Collate>
struct batch_of {
  using type = decltype(fetch(std::declval<const Dataset&>(), std::declval<const Collate&>(), std::span<const std::int64_t>{}));
};
template <IterableDataset Dataset, class Collate>
struct batch_of<Dataset, Collate> {
  using type = std::remove_cvref_t<decltype(std::declval<const Collate&>()(
      std::declval<const std::vector<std::ranges::range_value_t<const Dataset>>&>()))>;
};
template <class Dataset, class Collate>
using batch_t = typename batch_of<Dataset, Collate>::type;

inline std::vector<std::uint8_t> generator_bytes(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  const at::Tensor s = g.get_state();
  return {s.data_ptr<std::uint8_t>(), s.data_ptr<std::uint8_t>() + s.numel()};
}
inline void set_generator_bytes(at::Generator g, const std::vector<std::uint8_t>& bytes) {
  at::Tensor s = at::empty({std::int64_t(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), s.data_ptr<std::uint8_t>());
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(s);
}

//! The state a prepared loader shares between its copies and iterators.
template <class Dataset, class Collate, class Config>
struct LoaderCore {
  using Batch = batch_t<Dataset, Collate>;
  using config = Config;
  std::shared_ptr<const Dataset> dataset;
  Collate collate;
  DataLoaderOptions options;
  PrepareContext ctx;
  std::shared_ptr<ShuffledOrders> orders;  // shuffled loaders (shared by skip_first_batches copies, like the sampler)
  std::int64_t epoch = 0;                // the epoch the next iteration runs (Accelerate's `iteration`)
  std::int64_t skip = 0;                 // batches to skip at the start of the next epoch
  std::optional<std::vector<std::uint8_t>> restore;  // generator state to restore at the next epoch start
  // The epoch in progress, for state_dict().
  bool running = false;
  std::int64_t handed = 0, total = 0;
  std::vector<std::uint8_t> epoch_start_state;
  std::int64_t bytes_received = 0, bytes_broadcast_equivalent = 0;  // dispatched loading's transport
  bool publish = true;  // registers with GradientState (prepared loaders do; the user's own loader does not)

  [[nodiscard]] plan::ShardSpec spec(int rank) const {
    return {.batch_size = options.batch_size, .drop_last = options.drop_last, .num_processes = ctx.num_processes,
            .process_index = rank, .split_batches = Config::split_batches, .even_batches = Config::even_batches};
  }
  std::int64_t order_length = -1;  // the user sampler's last epoch length (-1: the dataset's size)
  [[nodiscard]] plan::BatchPlan plan_of(int rank) const {
    if constexpr (MapDataset<Dataset>)
      return plan::loader_plan(spec(rank), order_length >= 0 ? order_length : dataset->size(),
                               Config::dispatch ? plan::Loading::dispatched : plan::Loading::sharded);
    else if constexpr (std::ranges::sized_range<const Dataset>)
      return plan::loader_plan(spec(rank), std::int64_t(std::ranges::size(*dataset)),
                               ctx.num_processes == 1 ? plan::Loading::sharded : plan::Loading::iterable);
    else
      return {};
  }
  // The generator the epoch's order is drawn from: the synchronised sampler generator, or (one process, no
  // sampler generator) the global one. None for sequential and seedable loaders.
  [[nodiscard]] std::optional<at::Generator> epoch_generator() const {
    if (!orders || options.seedable) return std::nullopt;
    if (auto g = orders->generator()) return g;
    return at::detail::getDefaultCPUGenerator();
  }
  // Starts an epoch: restore (resume), synchronise, draw the order. When the order comes from the global
  // generator (one process, no sampler generator), the resumed epoch was under way, and the global generator was
  // restored by a checkpoint of its own, the restore only rewinds it for the draw: afterwards it goes back to the
  // checkpoint's state, so its later draws (dropout, ...) continue from there rather than from the epoch's start.
  IndexOrder begin_epoch() {
    auto gen = epoch_generator();
    std::optional<std::vector<std::uint8_t>> resume_after;
    if (restore && gen) {
      if (!orders->generator() && skip > 0 && global_restored_elsewhere) resume_after = generator_bytes(*gen);
      set_generator_bytes(*gen, *restore);
    }
    restore.reset();
    if constexpr (!Config::dispatch) {
      std::optional<at::Generator> sync = orders && !options.seedable ? orders->generator() : std::nullopt;
      synchronize_rng_states<typename Config::rng>(ctx.comm, sync);
    }
    epoch_start_state = gen ? generator_bytes(*gen) : std::vector<std::uint8_t>{};
    IndexOrder order = draw_order();
    if (resume_after) set_generator_bytes(*gen, *resume_after);
    return order;
  }
  IndexOrder draw_order() {
    if constexpr (MapDataset<Dataset>) {
      if (options.sampler) {
        auto order = options.sampler(epoch);
        for (auto i : order)
          accel::detail::require(i >= 0 && i < dataset->size(), "accel: the sampler of epoch " + std::to_string(epoch) +
                                                                    " returned index " + std::to_string(i) + ", outside the dataset's " +
                                                                    std::to_string(dataset->size()) + " samples");
        order_length = std::int64_t(order.size());
        return IndexOrder::of(std::move(order));
      }
      return orders ? orders->next(epoch) : IndexOrder::sequential(dataset->size());
    }
    else return IndexOrder{};
  }
  void end_epoch() {
    running = false;
    handed = 0;
    ++epoch;
  }
  [[nodiscard]] LoaderState state() const {
    if (running && handed < total) return {epoch, handed, epoch_start_state};
    const std::int64_t next = running ? epoch + 1 : epoch;
    auto gen = epoch_generator();
    return {next, running ? 0 : skip, restore ? *restore : gen ? generator_bytes(*gen) : std::vector<std::uint8_t>{}};
  }
  bool global_restored_elsewhere = false;
  void load(const LoaderState& s, GlobalGenerator g) {
    accel::detail::require(s.epoch >= 0 && s.batches >= 0, "accel: load_state_dict: a negative epoch or batch count");
    global_restored_elsewhere = g == GlobalGenerator::restored_by_caller;
    epoch = s.epoch;
    skip = s.batches;
    if (!s.generator_state.empty()) restore = s.generator_state;
  }
};

}  // namespace detail


//! What every prepared loader offers around its epochs: a cheap copyable handle on shared state (copies iterate
//! the same loader), the epoch counter, the checkpoint, skipping, the step size and the transport counters.
template <class Derived, class Core>
class LoaderHandle : public std::ranges::view_interface<Derived> {
 public:
  LoaderHandle() = default;
  explicit LoaderHandle(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  //! The epoch the next iteration runs (also the seedable sampler's epoch).
  void set_epoch(std::int64_t epoch) { core_->epoch = epoch; }
  [[nodiscard]] std::int64_t epoch() const noexcept { return core_->epoch; }
  //! Samples of one optimizer step across all processes (defined for every loader: Q7 fixed).
  [[nodiscard]] std::int64_t total_batch_size() const {
    return Core::config::split_batches ? core_->options.batch_size : core_->options.batch_size * core_->ctx.num_processes;
  }
  //! Where the loader stands: a fresh process that loads it yields exactly the remaining batches.
  [[nodiscard]] LoaderState state_dict() const { return core_->state(); }
  //! Resumes from `s`. `GlobalGenerator::restored_by_caller`: the caller restores the global generator itself
  //! (`Accelerator::load_state` does), so a loader drawing from it must not leave it at the epoch's start.
  void load_state_dict(const LoaderState& s, GlobalGenerator g = GlobalGenerator::rewound_by_loader) { core_->load(s, g); }
  //! The same loader without the first `k` batches (steps, when dispatched) of its next epoch: Accelerate's
  //! `skip_first_batches`. It shares the sampler and the epoch counter, and keeps the padding marks.
  [[nodiscard]] Derived skip_first_batches(std::int64_t k) const {
    accel::detail::require(k >= 0, "accel: skip_first_batches: cannot skip a negative number of batches (" + std::to_string(k) + ")");
    Derived out = static_cast<const Derived&>(*this);
    out.core_ = std::make_shared<Core>(*core_);
    out.core_->skip += k;
    return out;
  }
  //! Bytes this rank received from dispatched loading so far, and what a broadcast of every global batch
  //! (Accelerate's transport) would have sent it. Zero for sharded loading.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> transport_bytes() const {
    return {core_->bytes_received, core_->bytes_broadcast_equivalent};
  }
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }
  [[nodiscard]] const std::shared_ptr<Core>& core() const noexcept { return core_; }

 protected:
  std::shared_ptr<Core> core_;
};

// [accelerate:data_loader.py DataLoaderShard]
//! Every process reads only its own batches (positions from `plan::loader_plan`), places them, and publishes
//! `end_of_dataloader` and the padding layout to `GradientState`.
template <class Dataset, class Collate, class Config>
class ShardedLoader : public LoaderHandle<ShardedLoader<Dataset, Collate, Config>, detail::LoaderCore<Dataset, Collate, Config>> {
  using Core = detail::LoaderCore<Dataset, Collate, Config>;
  using Handle = LoaderHandle<ShardedLoader<Dataset, Collate, Config>, Core>;
  friend Handle;
  using Handle::core_;

 public:
  using Batch = typename Core::Batch;

 private:
  struct Epoch {
    Epoch(std::shared_ptr<Core> c) : core(std::move(c)), registration(core->publish ? &GradientState::instance() : nullptr) {
      auto& k = *core;
      if (k.options.batch_sampler) {
        start_batch_sampler();
        return;
      }
      const IndexOrder order = k.begin_epoch();
      auto all = std::make_shared<std::vector<plan::BatchPlan>>();
      for (int r = 0; r < k.ctx.num_processes; ++r) all->push_back(k.plan_of(r).skip(k.skip));
      plans = std::move(all);
      k.skip = 0;
      mine = (*plans)[std::size_t(k.ctx.process_index)];
      k.running = true;
      k.total = mine.size() + mine.skipped();
      k.handed = mine.skipped();
      view = planned_batches(mine, order);
      Placement<typename Config::place> place(k.ctx.device, k.options.pin_memory);
      prefetcher.emplace(mine.size(), k.options.workers, k.options.prefetch, [this, place](std::int64_t j) {
        const auto b = view[std::ptrdiff_t(j)];
        thread_local std::vector<std::int64_t> idx;  // one index buffer per thread, reused batch after batch
        b.indices_into(idx);
        return place(detail::fetch_batch(*core->dataset, core->collate, idx, j + mine.skipped(), core->epoch,
                                         core->ctx.process_index));
      });
    }
    // A user's batch sampler: every rank's batches of the epoch, from Accelerate's BatchSamplerShard.
    void start_batch_sampler() {
      auto& k = *core;
      (void)k.begin_epoch();  // RNG synchronisation, like every epoch
      const auto batches = k.options.batch_sampler(k.epoch);
      for (const auto& b : batches)
        for (auto i : b)
          accel::detail::require(i >= 0 && i < std::int64_t(k.dataset->size()),
                                 "accel: the batch sampler of epoch " + std::to_string(k.epoch) + " returned index " +
                                     std::to_string(i) + ", outside the dataset");
      for (int r = 0; r < k.ctx.num_processes; ++r) {
        std::vector<ShardBatch> out;
        for (const auto& b : BatchSamplerShard(batches, {.drop_last = k.options.drop_last, .num_processes = k.ctx.num_processes,
                                                         .process_index = r, .even_batches = Config::even_batches}))
          out.push_back(b);
        dynamic.push_back(std::move(out));
      }
      auto& mine_b = dynamic[std::size_t(k.ctx.process_index)];
      const std::int64_t skip = std::min<std::int64_t>(k.skip, std::int64_t(mine_b.size()));
      first = skip;
      k.skip = 0;
      k.running = true;
      k.total = std::int64_t(mine_b.size());
      k.handed = skip;
      j = skip;
      Placement<typename Config::place> place(k.ctx.device, k.options.pin_memory);
      prefetcher.emplace(std::int64_t(mine_b.size()) - skip, k.options.workers, k.options.prefetch, [this, place](std::int64_t q) {
        const auto& b = dynamic[std::size_t(core->ctx.process_index)][std::size_t(q + first)];
        return place(detail::fetch_batch(*core->dataset, core->collate, b.indices, q + first, core->epoch, core->ctx.process_index));
      });
    }
    ~Epoch() { prefetcher.reset(); }  // joins the workers before the plan they read goes
    void finish() { core->end_epoch(); }
    bool advance() {
      if (!dynamic.empty()) {
        const auto& mine_b = dynamic[std::size_t(core->ctx.process_index)];
        if (j >= std::int64_t(mine_b.size())) return false;
        current.emplace(prefetcher->next());
        Placement<typename Config::place>(core->ctx.device, core->options.pin_memory).hand_over(*current);
        GatherLayout layout;
        for (const auto& rank_batches : dynamic) {
          const bool has = j < std::int64_t(rank_batches.size());
          layout.size.push_back(has ? std::int64_t(rank_batches[std::size_t(j)].indices.size()) : 0);
          layout.real.push_back(has ? rank_batches[std::size_t(j)].real : 0);
        }
        registration.update(j + 1 == std::int64_t(mine_b.size()), std::move(layout));
        ++j;
        ++core->handed;
        return true;
      }
      if (j >= mine.size()) return false;
      current.emplace(prefetcher->next());
      Placement<typename Config::place>(core->ctx.device, core->options.pin_memory).hand_over(*current);
      registration.update(mine.end_of_dataloader(j), plans, j);
      ++j;
      ++core->handed;
      return true;
    }
    std::shared_ptr<Core> core;
    std::shared_ptr<const std::vector<plan::BatchPlan>> plans;
    plan::BatchPlan mine;
    PlannedBatches view;
    std::optional<detail::Prefetcher<Batch>> prefetcher;
    std::optional<Batch> current;
    std::int64_t j = 0;
    std::vector<std::vector<ShardBatch>> dynamic;  // every rank's batches, for a user's batch sampler
    std::int64_t first = 0;
    GradientState::Registration registration;
  };

 public:
  using iterator = detail::PassIterator<Epoch, Batch>;

  ShardedLoader() = default;
  explicit ShardedLoader(std::shared_ptr<Core> core) : Handle(std::move(core)) {}

  //! Starts an epoch (synchronising the RNGs of `Config::rng` first).
  [[nodiscard]] iterator begin() const { return iterator(std::make_shared<Epoch>(core_)); }
  //! Batches this process yields per epoch (the number really yielded: Q4 fixed).
  [[nodiscard]] std::size_t size() const {
    if (core_->options.batch_sampler) {  // asks the batch sampler for the next epoch's batches
      std::size_t count = 0;
      const auto& k = *core_;
      for (const auto& b : BatchSamplerShard(k.options.batch_sampler(k.epoch), {.drop_last = k.options.drop_last,
                                                                               .num_processes = k.ctx.num_processes,
                                                                               .process_index = k.ctx.process_index,
                                                                               .even_batches = Config::even_batches}))
        (void)b, ++count;
      return count - std::min<std::size_t>(count, std::size_t(k.skip));
    }
    return std::size_t(core_->plan_of(core_->ctx.process_index).skip(core_->skip).size());
  }
  [[nodiscard]] std::int64_t total_dataset_length() const { return core_->dataset->size(); }
};

//! No slice function: dispatched loading cuts every tensor along dim 0 (Accelerate's default `slice_fn`).
struct NoSlice {};

namespace detail {

//! One step of dispatched loading, as rank 0 describes it: where each rank's rows start in the global batch,
//! how many it gets and how many of those are real, whether it is the epoch's last step, and rank 0's error.
struct DispatchStep {
  bool has_step = false;
  bool end = false;
  std::vector<std::int64_t> begin, size, real;
  std::vector<std::int8_t> dtypes;
  std::vector<std::vector<std::int64_t>> shapes;  // trailing dimensions of every tensor leaf
  std::string error;
};
inline auto accel_fields(DispatchStep& s) { return std::tie(s.has_step, s.end, s.begin, s.size, s.real, s.dtypes, s.shapes, s.error); }
inline auto accel_fields(const DispatchStep& s) { return std::tie(s.has_step, s.end, s.begin, s.size, s.real, s.dtypes, s.shapes, s.error); }

//! The transport of dispatched loading: rank 0 sends the step's description (typed broadcast), then every
//! tensor leaf of the global batch is cut into per-rank chunks (padded to one size) and scattered, and every
//! rank keeps its `size[me]` rows. Returns this rank's batch; counts the bytes received and those a
//! broadcast of the whole global batch would have cost.
template <class Batch, class Slice>
Batch dispatch_transport(const PrepareContext& ctx, DispatchStep& step, const std::optional<Batch>& global,
                         std::int64_t& bytes_received, std::int64_t& bytes_broadcast, const Slice& slice) {
  const int me = ctx.process_index, N = ctx.num_processes;
  if constexpr (!std::is_same_v<Slice, NoSlice>) {
    // A slice function: rank 0 cuts the global batch with it and every rank receives its part, serialised
    // (any serialisable batch: tensors, strings, numbers, described structs).
    if (ctx.comm && N > 1) step = broadcast_object(ctx.comm, step, 0);
    if (!step.error.empty())
      throw Error(me == 0 ? step.error : "accel: rank " + std::to_string(me) + ": dispatched loading stopped: " + step.error);
    if (!step.has_step) return Batch{};
    std::vector<Batch> parts;
    if (me == 0)
      for (int r = 0; r < N; ++r) parts.push_back(slice(*global, step.begin[std::size_t(r)], step.size[std::size_t(r)]));
    if (ctx.comm && N > 1) return scatter_object(ctx.comm, parts, 0);
    return parts.at(std::size_t(me));
  }
  if constexpr (TensorStructure<Batch>) {
  if (me == 0 && global) {
    step.dtypes.clear(), step.shapes.clear();
    for_each_tensor(*global, [&](const at::Tensor& t) {
      step.dtypes.push_back(std::int8_t(t.scalar_type()));
      step.shapes.push_back(t.sizes().slice(1).vec());
    });
  }
  if (ctx.comm && N > 1) step = broadcast_object(ctx.comm, step, 0);
  if (!step.error.empty())
    throw Error(me == 0 ? step.error : "accel: rank " + std::to_string(me) + ": dispatched loading stopped: " + step.error);
  if (!step.has_step) return Batch{};
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

// [accelerate:data_loader.py DataLoaderDispatcher]
//! Rank 0 reads and collates every global batch; every rank receives only its own slice (a scatter: each
//! rank gets about 1/N of the bytes a broadcast of the whole batch would send). The batch's structure must be
//! fixed (tensors, `torch::data::Example`, tuples, structs with `accel_fields`); shapes and dtypes travel as
//! typed metadata; slice sizes come from the plan, which every rank computes alone.
template <class Dataset, class Collate, class Config, class Slice = NoSlice>
class DispatchedLoader : public LoaderHandle<DispatchedLoader<Dataset, Collate, Config, Slice>, detail::LoaderCore<Dataset, Collate, Config>> {
  using Core = detail::LoaderCore<Dataset, Collate, Config>;
  using Handle = LoaderHandle<DispatchedLoader<Dataset, Collate, Config, Slice>, Core>;
  friend Handle;
  using Handle::core_;

 public:
  using Batch = typename Core::Batch;

 private:
  struct Epoch {
    Epoch(std::shared_ptr<Core> c, std::shared_ptr<const Slice> sl)
        : core(std::move(c)), slice(std::move(sl)), registration(core->publish ? &GradientState::instance() : nullptr) {
      auto& k = *core;
      order = k.begin_epoch();
      auto all = std::make_shared<std::vector<plan::BatchPlan>>();
      for (int r = 0; r < k.ctx.num_processes; ++r) all->push_back(k.plan_of(r).skip(k.skip));
      shared_plans = all;
      plans = *all;
      k.skip = 0;
      k.running = true;
      k.total = plans[0].size() + plans[0].skipped();
      k.handed = plans[0].skipped();
    }
    void finish() { core->end_epoch(); }
    bool advance() {
      auto& k = *core;
      const int me = k.ctx.process_index;
      if (j >= plans[0].size()) return false;
      detail::DispatchStep step;
      std::optional<Batch> global;
      if (me == 0) {
        std::int64_t start = INT64_MAX, stop = 0;
        for (const auto& p : plans) {
          const auto s = p.span(j);
          if (s.size() > 0) start = std::min(start, s.begin), stop = std::max(stop, s.end);
        }
        if (start == INT64_MAX) start = stop = 0;
        step.has_step = true;
        step.end = plans[0].end_of_dataloader(j);
        for (const auto& p : plans) {
          step.begin.push_back(p.span(j).size() > 0 ? p.span(j).begin - start : 0);
          step.size.push_back(p.span(j).size());
          step.real.push_back(p.real(j));
        }
        std::vector<std::int64_t> idx;
        for (auto pos = start; pos < stop; ++pos) idx.push_back(order[plans[0].sample(pos)]);
        try {
          if (!idx.empty()) global.emplace(detail::fetch_batch(*k.dataset, k.collate, idx, j + plans[0].skipped(), k.epoch, 0));
        } catch (const std::exception& e) {
          step.error = e.what();  // sent to every rank so that all of them stop with it
        }
      }
      Batch out = detail::dispatch_transport(k.ctx, step, global, k.bytes_received, k.bytes_broadcast_equivalent, *slice);
      Placement<typename Config::place> place(k.ctx.device, k.options.pin_memory);
      current.emplace(place(std::move(out)));
      place.hand_over(*current);
      registration.update(plans[0].end_of_dataloader(j), shared_plans, j);
      ++j;
      ++k.handed;
      return true;
    }
    std::shared_ptr<Core> core;
    std::shared_ptr<const Slice> slice;
    IndexOrder order;
    std::shared_ptr<const std::vector<plan::BatchPlan>> shared_plans;
    std::vector<plan::BatchPlan> plans;
    std::optional<Batch> current;
    std::int64_t j = 0;
    GradientState::Registration registration;
  };

 public:
  using iterator = detail::PassIterator<Epoch, Batch>;

  DispatchedLoader() = default;
  explicit DispatchedLoader(std::shared_ptr<Core> core, Slice slice = {})
      : Handle(std::move(core)), slice_(std::make_shared<const Slice>(std::move(slice))) {}
  [[nodiscard]] iterator begin() const { return iterator(std::make_shared<Epoch>(core_, slice_)); }
  [[nodiscard]] std::size_t size() const { return std::size_t(core_->plan_of(0).skip(core_->skip).size()); }
  [[nodiscard]] std::int64_t total_dataset_length() const { return core_->dataset->size(); }

 private:
  std::shared_ptr<const Slice> slice_;
};

// [accelerate:data_loader.py DataLoaderShard over IterableDatasetShard]
//! An iterable dataset, sharded: every process reads the stream and keeps its part of each chunk
//! (`IterableShard`: `batch_size` samples of every `batch_size * N`, or `batch_size / N` of every `batch_size`
//! under `batches::split`), the last chunk completed from the first unless `drop_last`. One process batches the
//! stream as it comes (a short last batch). One batch of look-ahead tells `end_of_dataloader`; every rank's real
//! rows follow from the chunk. Resuming re-reads the stream and drops the batches already handed out.
template <class Dataset, class Collate, class Config>
class StreamShardedLoader : public LoaderHandle<StreamShardedLoader<Dataset, Collate, Config>, detail::LoaderCore<Dataset, Collate, Config>> {
  using Core = detail::LoaderCore<Dataset, Collate, Config>;
  using Handle = LoaderHandle<StreamShardedLoader<Dataset, Collate, Config>, Core>;
  friend Handle;
  using Handle::core_;
  using Sample = std::ranges::range_value_t<const Dataset>;
  using Source = std::ranges::ref_view<const Dataset>;

 public:
  using Batch = typename Core::Batch;

 private:
  struct Next {
    Batch batch;
    GatherLayout layout;
  };
  struct Epoch {
    Epoch(std::shared_ptr<Core> c)
        : core(std::move(c)), registration(core->publish ? &GradientState::instance() : nullptr),
          shard(Source(*core->dataset), IterableShardOptions{.batch_size = core->options.batch_size,
                                                             .drop_last = core->options.drop_last,
                                                             .num_processes = core->ctx.num_processes,
                                                             .process_index = core->ctx.process_index,
                                                             .split_batches = Config::split_batches}) {
      auto& k = *core;
      // Only one pass over the source is started: single-pass streams are read once.
      if (k.ctx.num_processes == 1) plain.emplace(std::ranges::begin(*k.dataset));
      else it.emplace(shard.begin());
      k.begin_epoch();
      k.running = true;
      k.handed = 0;
      k.total = INT64_MAX;  // unknown until the stream ends
      ahead = read();
      for (std::int64_t s = k.skip; s > 0 && ahead; --s) ahead = read(), ++k.handed;
      k.skip = 0;
    }
    // The next batch of this process, or nothing at the end of the stream.
    std::optional<Next> read() {
      auto& k = *core;
      const int N = k.ctx.num_processes;
      std::vector<Sample> samples;
      GatherLayout layout;
      if (N == 1) {
        const auto stop = std::ranges::end(*k.dataset);
        for (auto& p = *plain; p != stop && std::int64_t(samples.size()) < k.options.batch_size; ++p) samples.push_back(*p);
        if (samples.empty() || (k.options.drop_last && std::int64_t(samples.size()) < k.options.batch_size)) return std::nullopt;
        layout = {{std::int64_t(samples.size())}, {std::int64_t(samples.size())}};
      } else {
        const std::int64_t per = Config::split_batches ? k.options.batch_size / N : k.options.batch_size;
        std::int64_t chunk_real = 0;
        for (auto& i = *it; i != std::default_sentinel && std::int64_t(samples.size()) < per; ++i) {
          samples.push_back((*i).value);
          chunk_real = (*i).chunk_real;
        }
        if (samples.empty()) return std::nullopt;
        for (int q = 0; q < N; ++q) {
          layout.size.push_back(per);
          layout.real.push_back(std::clamp<std::int64_t>(chunk_real - q * per, 0, per));
        }
      }
      Placement<typename Config::place> place(k.ctx.device, k.options.pin_memory);
      try {
        return Next{place(k.collate(samples)), std::move(layout)};
      } catch (const std::exception& e) {
        throw Error("accel: rank " + std::to_string(k.ctx.process_index) + ": collating batch " + std::to_string(k.handed) +
                    " of epoch " + std::to_string(k.epoch) + " of the stream failed: " + e.what());
      }
    }
    void finish() { core->end_epoch(); }
    bool advance() {
      if (!ahead) return false;
      current.emplace(std::move(ahead->batch));
      GatherLayout layout = std::move(ahead->layout);
      ahead = read();  // look-ahead: is this the last batch?
      Placement<typename Config::place>(core->ctx.device, core->options.pin_memory).hand_over(*current);
      registration.update(!ahead.has_value(), std::move(layout));
      ++core->handed;
      return true;
    }
    std::shared_ptr<Core> core;
    GradientState::Registration registration;
    IterableShard<Source> shard;
    std::optional<std::ranges::iterator_t<IterableShard<Source>>> it;
    std::optional<std::ranges::iterator_t<const Dataset>> plain;
    std::optional<Next> ahead;
    std::optional<Batch> current;
  };

 public:
  using iterator = detail::PassIterator<Epoch, Batch>;

  StreamShardedLoader() = default;
  explicit StreamShardedLoader(std::shared_ptr<Core> core) : Handle(std::move(core)) {}
  [[nodiscard]] iterator begin() const { return iterator(std::make_shared<Epoch>(core_)); }
  //! Batches per epoch, when the stream's length is known (the number really yielded: Q5 fixed).
  [[nodiscard]] std::size_t size() const
    requires std::ranges::sized_range<const Dataset>
  {
    return std::size_t(core_->plan_of(core_->ctx.process_index).skip(core_->skip).size());
  }

};

// [accelerate:data_loader.py DataLoaderDispatcher over an iterable dataset]
//! An iterable dataset, dispatched: rank 0 alone reads the stream, in batches of `batch_size` (the user's
//! `drop_last` applies to them); a step is N of them (one under `batches::split`). Rank 0 looks one step ahead
//! to know the last one, which is re-cut evenly after appending the first N samples of the epoch when its size
//! is not a multiple of N (Accelerate's rule). Every rank receives only its slice; the step's layout travels
//! with the metadata, so no rank but rank 0 touches the stream.
template <class Dataset, class Collate, class Config, class Slice = NoSlice>
class StreamDispatchedLoader : public LoaderHandle<StreamDispatchedLoader<Dataset, Collate, Config, Slice>, detail::LoaderCore<Dataset, Collate, Config>> {
  using Core = detail::LoaderCore<Dataset, Collate, Config>;
  using Handle = LoaderHandle<StreamDispatchedLoader<Dataset, Collate, Config, Slice>, Core>;
  friend Handle;
  using Handle::core_;
  using Sample = std::ranges::range_value_t<const Dataset>;

 public:
  using Batch = typename Core::Batch;

 private:
  struct Epoch {
    Epoch(std::shared_ptr<Core> c, std::shared_ptr<const Slice> sl)
        : core(std::move(c)), slice(std::move(sl)), registration(core->publish ? &GradientState::instance() : nullptr) {
      auto& k = *core;
      k.begin_epoch();
      k.running = true;
      k.handed = 0;
      k.total = INT64_MAX;
      if (k.ctx.process_index == 0) {
        reader.emplace(std::ranges::begin(*k.dataset));
        ahead = read_step();
        for (std::int64_t s = k.skip; s > 0 && ahead; --s) ahead = read_step();
      }
      k.handed = k.skip;
      k.skip = 0;
    }
    // Rank 0: the samples of the next step, or nothing at the end of the stream.
    std::optional<std::vector<Sample>> read_step() {
      auto& k = *core;
      const std::int64_t B = k.options.batch_size;
      const int batches = Config::split_batches ? 1 : k.ctx.num_processes;
      std::vector<Sample> step;
      const auto stop = std::ranges::end(*k.dataset);
      int full = 0;
      for (int b = 0; b < batches; ++b) {
        std::vector<Sample> inner;
        for (auto& it = *reader; it != stop && std::int64_t(inner.size()) < B; ++it) inner.push_back(*it);
        if (inner.empty() || (k.options.drop_last && std::int64_t(inner.size()) < B)) break;
        step.insert(step.end(), inner.begin(), inner.end());
        ++full;
        if (std::int64_t(inner.size()) < B) break;
      }
      if (step.empty() || (k.options.drop_last && full < batches)) return std::nullopt;
      if (first.empty()) first.assign(step.begin(), step.begin() + std::min<std::size_t>(step.size(), std::size_t(k.ctx.num_processes)));
      return step;
    }
    void finish() { core->end_epoch(); }
    bool advance() {
      auto& k = *core;
      const int me = k.ctx.process_index, N = k.ctx.num_processes;
      if (ended) return false;
      detail::DispatchStep step;
      std::optional<Batch> global;
      if (me == 0 && ahead) {
        std::vector<Sample> samples = std::move(*ahead);
        ahead = read_step();
        const std::int64_t observed = std::int64_t(samples.size());
        const bool last = !ahead.has_value();
        std::int64_t per = observed / N;
        if (last && !k.options.drop_last && observed % N != 0) {
          samples.insert(samples.end(), first.begin(), first.end());
          per += 1;
        }
        const std::int64_t total = std::int64_t(samples.size());
        step.has_step = true;
        step.end = last;
        for (int r = 0; r < N; ++r) {
          const std::int64_t b = std::min(total, r * per);
          step.begin.push_back(b);
          step.size.push_back(std::min(per, total - b));
          step.real.push_back(std::clamp<std::int64_t>(observed - r * per, 0, std::min(per, total - b)));
        }
        try {
          global.emplace(k.collate(samples));
        } catch (const std::exception& e) {
          step.error = "accel: rank 0: collating step " + std::to_string(k.handed) + " of epoch " + std::to_string(k.epoch) +
                       " of the stream failed: " + e.what();
        }
      }
      Batch out = detail::dispatch_transport(k.ctx, step, global, k.bytes_received, k.bytes_broadcast_equivalent, *slice);
      if (!step.has_step) return false;
      ended = step.end;
      Placement<typename Config::place> place(k.ctx.device, k.options.pin_memory);
      current.emplace(place(std::move(out)));
      place.hand_over(*current);
      registration.update(step.end, GatherLayout{step.size, step.real});
      ++k.handed;
      return true;
    }
    std::shared_ptr<Core> core;
    std::shared_ptr<const Slice> slice;
    GradientState::Registration registration;
    std::optional<std::ranges::iterator_t<const Dataset>> reader;  // rank 0 only
    std::optional<std::vector<Sample>> ahead;
    std::vector<Sample> first;
    std::optional<Batch> current;
    bool ended = false;
  };

 public:
  using iterator = detail::PassIterator<Epoch, Batch>;

  StreamDispatchedLoader() = default;
  explicit StreamDispatchedLoader(std::shared_ptr<Core> core, Slice slice = {})
      : Handle(std::move(core)), slice_(std::make_shared<const Slice>(std::move(slice))) {}
  [[nodiscard]] iterator begin() const { return iterator(std::make_shared<Epoch>(core_, slice_)); }
  //! Steps per epoch, when the stream's length is known.
  [[nodiscard]] std::size_t size() const
    requires std::ranges::sized_range<const Dataset>
  {
    const auto n = std::int64_t(std::ranges::size(*core_->dataset));
    return std::size_t(plan::dispatch_plan(core_->spec(0), n).skip(core_->skip).size());
  }

 private:
  std::shared_ptr<const Slice> slice_;
};

// [accelerate:data_loader.py prepare_data_loader]
//! The prepared loader for `Config` (`loading::sharded` -> ShardedLoader, `loading::dispatched` ->
//! DispatchedLoader), statically typed. A shuffled loader's sampler is drawn as Accelerate draws it: a
//! generator seeded from the global one and synchronised at every epoch, or the seedable sampler.
template <class Config, class Dataset, class Collate, class Slice = NoSlice>
auto prepare_data_loader(const DataLoader<Dataset, Collate>& loader, const PrepareContext& ctx, Slice slice = {}) {
  static_assert(Config::dispatch || std::is_same_v<Slice, NoSlice>,
                "accel: a slice function only applies to loading::dispatched (rank 0 cuts the global batch with it)");
  using Core = detail::LoaderCore<Dataset, Collate, Config>;
  const auto& o = loader.options();
  accel::detail::require(ctx.num_processes >= 1 && ctx.process_index >= 0 && ctx.process_index < ctx.num_processes,
                         "accel: prepare_data_loader: process_index " + std::to_string(ctx.process_index) +
                             " is out of range for " + std::to_string(ctx.num_processes) + " processes");
  accel::detail::require(!Config::split_batches || o.batch_size % ctx.num_processes == 0,
                         "accel: under batches::split the batch size (" + std::to_string(o.batch_size) +
                             ") must be a round multiple of the number of processes (" + std::to_string(ctx.num_processes) +
                             "); use a batch size divisible by it, or batches::per_process");
  if constexpr (IterableDataset<Dataset>) {
    accel::detail::require(!o.shuffle, "accel: an iterable dataset cannot be shuffled by the loader; shuffle the stream itself");
    accel::detail::require(!o.sampler && !o.batch_sampler, "accel: an iterable dataset has no indices to sample; drop sampler/batch_sampler");
  }
  accel::detail::require(!(o.sampler && o.batch_sampler), "accel: give a sampler or a batch_sampler, not both");
  accel::detail::require(!(o.shuffle && (o.sampler || o.batch_sampler)),
                         "accel: shuffle=true with a sampler of your own: shuffle inside the sampler, or drop it");
  if (o.batch_sampler) {
    accel::detail::require(!Config::split_batches, "accel: batches::split needs a fixed batch size; a batch sampler's batches "
                                                   "vary: use batches::per_process");
    accel::detail::require(!Config::dispatch, "accel: a batch sampler with loading::dispatched is not available; use loading::sharded");
  }
  auto core = std::make_shared<Core>();
  core->dataset = loader.dataset();
  core->collate = loader.collate();
  core->options = o;
  core->ctx = ctx;
  if (o.shuffle && MapDataset<Dataset>) {
    // Under dispatch only rank 0 samples: one process's view of the sampler (no synchronisation).
    core->orders = std::make_shared<ShuffledOrders>(loader.dataset()->size(), Config::dispatch ? 1 : ctx.num_processes,
                                                    o.seedable ? Shuffle::seedable : Shuffle::synchronized, o.data_seed,
                                                    RandomSamplerOptions{}, o.seed);
  }
  if constexpr (IterableDataset<Dataset> && Config::dispatch) return StreamDispatchedLoader<Dataset, Collate, Config, Slice>(core, std::move(slice));
  else if constexpr (IterableDataset<Dataset>) return StreamShardedLoader<Dataset, Collate, Config>(core);
  else if constexpr (Config::dispatch) return DispatchedLoader<Dataset, Collate, Config, Slice>(core, std::move(slice));
  else return ShardedLoader<Dataset, Collate, Config>(core);
}

template <class Config, class Dataset, class Collate, class Slice = NoSlice>
auto prepare_data_loader(const DataLoader<Dataset, Collate>& loader, const ProcessState& state, Slice slice = {}) {
  return prepare_data_loader<Config>(loader, PrepareContext::of(state), std::move(slice));
}

namespace detail {
using UnpreparedConfig = Config<dist::none, place::none, rng::none>;
}  // namespace detail

template <LoaderDataset Dataset, class Collate>
auto DataLoader<Dataset, Collate>::begin() const {
  // A fresh one-process loader per epoch, so every epoch draws anew (the iterator keeps it alive).
  auto loader = prepare_data_loader<detail::UnpreparedConfig>(*this, PrepareContext{});
  loader.core()->publish = false;
  return loader.begin();
}

}  // namespace accel::data

template <class D, class C, class Cfg>
inline constexpr bool ranges::enable_view<accel::data::ShardedLoader<D, C, Cfg>> = true;
template <class D, class C, class Cfg, class S>
inline constexpr bool ranges::enable_view<accel::data::DispatchedLoader<D, C, Cfg, S>> = true;
template <class D, class C, class Cfg>
inline constexpr bool ranges::enable_view<accel::data::StreamShardedLoader<D, C, Cfg>> = true;
template <class D, class C, class Cfg, class S>
inline constexpr bool ranges::enable_view<accel::data::StreamDispatchedLoader<D, C, Cfg, S>> = true;
