#pragma once
//! \file
//! `LoaderCore`: the state a prepared loader shares between its copies and iterators, and its epoch state machine
//! (which epoch runs next, what to skip, the generator to restore on resume, the RNG synchronisation and the draw
//! of the epoch's order, where the running epoch stands for `state_dict()`). Also where a loader runs
//! (`PrepareContext`) and how a batch is fetched from a map-style dataset.

#include <accel/comm/communicator.hpp>
#include <accel/comm/rng.hpp>
#include <accel/core/generator_state.hpp>
#include <accel/data/dataset.hpp>
#include <accel/data/options.hpp>
#include <accel/data/prefetcher.hpp>
#include <accel/data/loader_state.hpp>
#include <accel/data/placement.hpp>
#include <accel/data/sampler.hpp>
#include <accel/plan/plan.hpp>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <vector>

namespace accel::data {

//! Where a prepared loader runs: its rank among `num_processes`, the communicator (nullptr: one process, or
//! ranks simulated in one process as Accelerate's `prepare_data_loader(num_processes=, process_index=)`), and
//! the device batches go to.
struct PrepareContext {
  int num_processes = 1;
  int process_index = 0;
  comm::Communicator* comm = nullptr;
  c10::Device device = c10::Device(c10::kCPU);
  //! The context of a process state (`ProcessState`, or anything with its four accessors).
  template <class State>
  static PrepareContext of(const State& s) {
    return {s.num_processes(), s.process_index(), s.comm(), s.device()};
  }
};

namespace detail {

//! Fetches the samples at `indices`: one `get_batch` when the dataset has it, else `get` per sample and the
//! collate function.
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

//! The first line of an exception's message (LibTorch appends a backtrace).
inline std::string first_line(const std::exception& e) {
  std::string msg = e.what();
  if (const auto cut = msg.find("\nException raised from"); cut != std::string::npos) msg.resize(cut);
  return msg;
}

//! Where a batch is prepared, for the error that says which one failed: "rank R: loading batch 4 of epoch 0
//! (first sample 16)".
//! Plain values only: building a site costs nothing on the loop's path; the message is composed on failure.
struct BatchSite {
  const char* action;  // "loading batch", "collating step", ...
  std::int64_t step, epoch;
  int rank;
  std::optional<std::int64_t> first_sample = std::nullopt;  // a map-style batch's first index
  bool stream = false;                                       // a stream's batch or step
};
//! `make()`, with a failure rethrown as an `Error` naming `site`, followed by the original message's first line.
template <class Make>
auto at_site(const BatchSite& site, Make&& make) {
  try {
    return make();
  } catch (const std::exception& e) {
    throw Error("accel: rank " + std::to_string(site.rank) + ": " + site.action + " " + std::to_string(site.step) + " of epoch " +
                std::to_string(site.epoch) +
                (site.first_sample ? " (first sample " + std::to_string(*site.first_sample) + ")" : std::string()) +
                (site.stream ? " of the stream" : "") + " failed: " + first_line(e));
  }
}

//! `fetch`, with a failure reported as which batch of which epoch on which rank, and the original message.
template <class Dataset, class Collate>
auto fetch_batch(const Dataset& ds, const Collate& collate, std::span<const std::int64_t> indices, std::int64_t batch,
                 std::int64_t epoch, int rank) {
  const auto first = indices.empty() ? std::nullopt : std::optional<std::int64_t>(indices.front());
  return at_site({"loading batch", batch, epoch, rank, first}, [&] { return fetch(ds, collate, indices); });
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

//! The state a prepared loader shares between its copies and iterators.
template <class Dataset, class Collate, class Config>
struct LoaderCore {
  using Batch = batch_t<Dataset, Collate>;
  using dataset_type = Dataset;
  using config = Config;
  std::shared_ptr<const Dataset> dataset;
  Collate collate;
  DataLoaderOptions options;
  PrepareContext ctx;
  std::shared_ptr<ShuffledOrders> orders;  // shuffled loaders (shared by skip_first_batches copies, like the sampler)
  std::int64_t epoch = 0;                // the epoch the next iteration runs (Accelerate's `iteration`)
  std::int64_t skip = 0;                 // batches to skip at the start of the next epoch
  std::optional<std::vector<std::uint8_t>> restore;  // generator state to restore at the next epoch start
  bool global_restored_elsewhere = false;
  // The epoch in progress, for state_dict().
  bool running = false;
  std::int64_t handed = 0, total = 0;
  std::vector<std::uint8_t> epoch_start_state;
  std::int64_t bytes_received = 0, bytes_broadcast_equivalent = 0;  // dispatched loading's transport
  bool publish = true;  // registers with GradientState (prepared loaders do; the user's own loader does not)
  std::int64_t order_length = -1;  // the user sampler's last epoch length (-1: the dataset's size)
  // A user batch sampler's batches, asked for once per epoch (by `size()` or by the epoch itself).
  std::optional<std::pair<std::int64_t, std::shared_ptr<const std::vector<std::vector<std::int64_t>>>>> sampled;

  //! This loader's spec for rank `rank` (the batch sampler's batches vary in size: `plan::varying`).
  [[nodiscard]] plan::ShardSpec spec(int rank) const {
    return {.batch_size = options.batch_sampler ? plan::varying : options.batch_size, .drop_last = options.drop_last,
            .num_processes = ctx.num_processes, .process_index = rank, .split_batches = Config::split_batches,
            .even_batches = Config::even_batches};
  }
  [[nodiscard]] Placement<typename Config::place> placement() const { return Placement<typename Config::place>(ctx.device, options.pin_memory); }

  //! Rank `rank`'s closed-form plan of an epoch of the current length (empty for an unsized stream).
  [[nodiscard]] plan::BatchPlan plan_of(int rank) const {
    if constexpr (MapDataset<Dataset>)
      return plan::loader_plan(spec(rank), order_length >= 0 ? order_length : dataset->size(),
                               Config::dispatch ? plan::Loading::dispatched : plan::Loading::sharded);
    else if constexpr (std::ranges::sized_range<const Dataset>)
      return plan::loader_plan(spec(rank), std::int64_t(std::ranges::size(*dataset)),
                               Config::dispatch ? plan::Loading::dispatched
                               : ctx.num_processes == 1 ? plan::Loading::sharded : plan::Loading::iterable);
    else
      return {};
  }

  //! The user batch sampler's batches of the epoch `epoch` will run (asked once per epoch), indices checked.
  [[nodiscard]] std::shared_ptr<const std::vector<std::vector<std::int64_t>>> sampler_batches() {
    if (sampled && sampled->first == epoch) return sampled->second;
    auto batches = std::make_shared<const std::vector<std::vector<std::int64_t>>>(options.batch_sampler(epoch));
    for (const auto& b : *batches) check_indices(b, "batch sampler");
    sampled.emplace(epoch, batches);
    return batches;
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
  //! Marks the epoch as running, with `first` batches already handed out and `count` more to come
  //! (`unknown_count` for a stream).
  void run_epoch(std::int64_t first, std::int64_t count) {
    skip = 0;
    running = true;
    handed = first;
    total = count == unknown_count ? unknown_count : first + count;
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
  void load(const LoaderState& s, GlobalGenerator g) {
    accel::detail::require(s.epoch >= 0 && s.batches >= 0, "accel: load_state_dict: a negative epoch or batch count");
    global_restored_elsewhere = g == GlobalGenerator::restored_by_caller;
    epoch = s.epoch;
    skip = s.batches;
    if (!s.generator_state.empty()) restore = s.generator_state;
  }

 private:
  // Every index a user's sampler or batch sampler returned must name a sample of the dataset.
  void check_indices(const std::vector<std::int64_t>& indices, const char* who) const {
    const std::int64_t n = std::int64_t(dataset->size());
    for (auto i : indices)
      accel::detail::require(i >= 0 && i < n, "accel: the " + std::string(who) + " of epoch " + std::to_string(epoch) +
                                                  " returned index " + std::to_string(i) + ", outside the dataset's " +
                                                  std::to_string(n) + " samples");
  }
  IndexOrder draw_order() {
    if constexpr (MapDataset<Dataset>) {
      if (options.sampler) {
        auto order = options.sampler(epoch);
        check_indices(order, "sampler");
        order_length = std::int64_t(order.size());
        return IndexOrder::of(std::move(order));
      }
      return orders ? orders->next(epoch) : IndexOrder::sequential(dataset->size());
    } else {
      return IndexOrder{};
    }
  }
};

}  // namespace detail
}  // namespace accel::data
