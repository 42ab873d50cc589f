#pragma once
//! \file
//! `LoaderCore`: the state a prepared loader shares between its copies and iterators, and its epoch state machine
//! (which epoch runs next, what to skip, the generator to restore on resume, the RNG synchronisation and the draw
//! of the epoch's order, where the running epoch stands for `state_dict()`). Also how a batch is fetched from a
//! map-style dataset. What depends on the loading path (which ranks read, and so which plan a rank follows, who
//! samples, whether the RNGs are synchronised) it asks of its transport (transport.hpp), never of the configuration.

#include <accel/comm/rng.hpp>
#include <accel/core/generator_state.hpp>
#include <accel/data/dataset.hpp>
#include <accel/data/loader_state.hpp>
#include <accel/data/options.hpp>
#include <accel/data/prepare_context.hpp>
#include <accel/data/sampler.hpp>
#include <accel/pipeline/placement.hpp>
#include <accel/pipeline/prefetcher.hpp>
#include <accel/plan/plan.hpp>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <vector>

namespace accel::pipeline {

namespace detail {

//! Fetches the samples at `indices`: one `get_batch` when the dataset has it, else `get` per sample and the
//! collate function.
template <class Dataset, class Collate>
auto fetch(const Dataset& ds, const Collate& collate, std::span<const std::int64_t> indices) {
  if constexpr (data::BatchedDataset<Dataset>) {
    return ds.get_batch(indices);
  } else {
    std::vector<data::sample_t<Dataset>> samples;
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
  bool stream = false;                                      // a stream's batch or step
};
//! `make()`, with a failure rethrown as an `Error` naming `site`, followed by the original message's first line.
template <class Make>
auto at_site(const BatchSite& site, Make&& make) {
  try {
    return make();
  } catch (const std::exception& e) {
    throw Error("accel: rank " + std::to_string(site.rank) + ": " + site.action + " " + std::to_string(site.step) +
                " of epoch " + std::to_string(site.epoch) +
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
  using type =
      decltype(fetch(std::declval<const Dataset&>(), std::declval<const Collate&>(), std::span<const std::int64_t>{}));
};
template <data::IterableDataset Dataset, class Collate>
struct batch_of<Dataset, Collate> {
  using type = std::remove_cvref_t<decltype(std::declval<const Collate&>()(
      std::declval<const std::vector<std::ranges::range_value_t<const Dataset>>&>()))>;
};
template <class Dataset, class Collate>
using batch_t = typename batch_of<Dataset, Collate>::type;

//! The state a prepared loader shares between its copies and iterators.
//! `Transport` (transport.hpp) says which rank reads for which: the core's plans, sampling and RNG synchronisation
//! follow it.
template <class Dataset, class Collate, class Config, class Transport>
struct LoaderCore {
  using Batch = batch_t<Dataset, Collate>;
  using dataset_type = Dataset;
  using config = Config;
  using transport = Transport;
  std::shared_ptr<const Dataset> dataset;
  Collate collate;
  data::DataLoaderOptions options;
  data::PrepareContext ctx;
  std::shared_ptr<data::ShuffledOrders>
      orders;                 // shuffled loaders (shared by skip_first_batches copies, like the sampler)
  std::int64_t epoch = 0;     // the epoch the next iteration runs (Accelerate's `iteration`)
  std::int64_t skip = 0;      // batches to skip at the start of the next epoch
  std::int64_t start = 0;     // position of the epoch's order the next (or running) epoch starts at (a resume)
  std::int64_t drawn_by = 0;  // processes whose rule drew the resumed epoch's order (0: this job's rule)
  std::int64_t resumed =
      0;  // batches of the resumed epoch before `start` (the saved count, or this size's steps to it)
  std::optional<std::vector<std::uint8_t>> restore;  // generator state to restore at the next epoch start
  bool global_restored_elsewhere = false;
  // The epoch in progress, for state_dict().
  bool running = false;
  std::int64_t handed = 0, total = 0;
  std::vector<std::uint8_t> epoch_start_state;
  std::int64_t bytes_received = 0, bytes_broadcast_equivalent = 0;  // dispatched loading's transport
  std::int64_t dispatch_capacity = 0;  // dispatched loading's message size, the same on every rank (transport.hpp)
  bool publish = true;             // registers with GradientState (prepared loaders do; the user's own loader does not)
  std::int64_t order_length = -1;  // the user sampler's last epoch length (-1: the dataset's size)
  // A user batch sampler's batches, asked for once per epoch (by `size()` or by the epoch itself).
  std::optional<std::pair<std::int64_t, std::shared_ptr<const std::vector<std::vector<std::int64_t>>>>> sampled;

  //! This loader's spec for rank `rank` (the batch sampler's batches vary in size: `plan::varying`).
  [[nodiscard]] plan::ShardSpec spec(int rank) const {
    return {.batch_size = options.batch_sampler ? plan::varying : options.batch_size,
            .drop_last = options.drop_last,
            .num_processes = ctx.num_processes,
            .process_index = rank,
            .split_batches = Config::split_batches,
            .even_batches = Config::even_batches};
  }
  [[nodiscard]] Placement<typename Config::place> placement() const {
    return Placement<typename Config::place>(ctx.device, options.pin_memory);
  }

  //! Rank `rank`'s closed-form plan of an epoch of the current length, from `start` on (empty for an unsized stream).
  [[nodiscard]] plan::BatchPlan plan_of(int rank) const {
    if constexpr (data::MapDataset<Dataset>)
      return plan::loader_plan(spec(rank), order_length >= 0 ? order_length : dataset->size(),
                               Transport::single_reader ? plan::Loading::dispatched : plan::Loading::sharded, start);
    else if constexpr (std::ranges::sized_range<const Dataset>)
      return plan::loader_plan(spec(rank), std::int64_t(std::ranges::size(*dataset)),
                               Transport::single_reader ? plan::Loading::dispatched
                               : ctx.num_processes == 1 ? plan::Loading::sharded
                                                        : plan::Loading::iterable,
                               start);
    else
      return {};
  }

  //! The loading path, for the state's description.
  [[nodiscard]] data::LoaderKind kind() const {
    if constexpr (data::MapDataset<Dataset>)
      return options.batch_sampler      ? data::LoaderKind::batch_sampler
             : Transport::single_reader ? data::LoaderKind::dispatched
                                        : data::LoaderKind::sharded;
    else
      return Transport::single_reader ? data::LoaderKind::stream_dispatched : data::LoaderKind::stream_sharded;
  }
  //! The dataset's length (-1: a stream of unknown length).
  [[nodiscard]] std::int64_t dataset_length() const {
    if constexpr (data::MapDataset<Dataset>)
      return dataset->size();
    else if constexpr (std::ranges::sized_range<const Dataset>)
      return std::int64_t(std::ranges::size(*dataset));
    else
      return -1;
  }
  //! Units of the epoch's order one step consumes (`LoaderState::position`): the samples of a global batch, or N
  //! whole batches of a user's batch sampler.
  [[nodiscard]] std::int64_t step_units() const {
    return options.batch_sampler ? ctx.num_processes
                                 : plan::per_step({.batch_size = options.batch_size,
                                                   .num_processes = ctx.num_processes,
                                                   .split_batches = Config::split_batches});
  }
  //! Units of the running (or next) epoch's order, -1 where not known yet (a batch sampler not asked, a stream).
  [[nodiscard]] std::int64_t epoch_units() const {
    if constexpr (data::MapDataset<Dataset>) {
      if (options.batch_sampler) return sampled && sampled->first == epoch ? std::int64_t(sampled->second->size()) : -1;
      return order_length >= 0 ? order_length : dataset->size();
    } else {
      return dataset_length();
    }
  }
  //! The global position after `steps` steps of the epoch (from `start`).
  [[nodiscard]] std::int64_t position_after(std::int64_t steps) const {
    const std::int64_t p = start + steps * step_units(), units = epoch_units();
    return units >= 0 ? std::min(p, units) : p;
  }
  //! What differs between the loader that saved `s` and this one ("" when nothing does): a state resumes only into
  //! a loader of the same path, dataset length and batch size (format-2 states record none of it).
  [[nodiscard]] std::string mismatch(const data::LoaderState& s) const {
    if (s.processes == 0) return {};
    auto length = [](std::int64_t n) {
      return n < 0 ? std::string("a stream of unknown length") : std::to_string(n) + " samples";
    };
    if (s.kind != std::int64_t(kind()))
      return "was saved by " + data::kind_name(s.kind) + ", this loader uses " + data::kind_name(std::int64_t(kind()));
    if (s.split != Config::split_batches)
      return std::string("was saved under ") + (s.split ? "batches::split" : "batches::per_process") +
             ", this loader runs under " + (Config::split_batches ? "batches::split" : "batches::per_process");
    if (s.samples != dataset_length())
      return "was saved for a dataset of " + length(s.samples) + ", this loader's has " + length(dataset_length());
    if (s.batch_size != options.batch_size)
      return "was saved with batch_size " + std::to_string(s.batch_size) + ", this loader's is " +
             std::to_string(options.batch_size);
    return {};
  }
  //! Whether the position and batch count of `s` (a state of this loader's path, length and batch size) are ones
  //! that a job reaches, and its generator state one this loader can restore ("" when they are). A job of N
  //! processes advances the position by `per_step` units a step (N under a batch sampler) from where it started,
  //! itself such a position of an earlier job: so the position is a multiple of the batch size (of 1 under a
  //! batch sampler) up to the epoch's end, where a skip past the end leaves it, and the batch count is the steps
  //! that reach it at the saving job's size (more only at the end). A user's sampler or batch sampler may return
  //! another number of units than the dataset's length: there the end is not known before its epoch is drawn.
  [[nodiscard]] std::string unreachable(const data::LoaderState& s) const {
    if (s.position < 0) return {};  // format 2: resumed after its batches
    const bool batch_sampler = s.kind == std::int64_t(data::LoaderKind::batch_sampler);
    std::int64_t units = dataset_length();  // of the epoch, where known now
    if constexpr (data::MapDataset<Dataset>)
      if (options.sampler || options.batch_sampler) units = -1;
    const std::string where = "is at position " + std::to_string(s.position) + (batch_sampler ? " (batches)" : "");
    if (units >= 0 && s.position > units)
      return where + ", past the end of its epoch's " + std::to_string(units) +
             (batch_sampler ? " batches" : " samples");
    const bool end = units < 0 || s.position == units;
    if (!batch_sampler && !end && s.position % s.batch_size != 0)
      return where + ", which no job of batch_size " + std::to_string(s.batch_size) +
             " reaches (a multiple of it, or the epoch's end)";
    std::int64_t step = s.batch_size;  // units of one step of the saving job (plan::per_step)
    if (batch_sampler)
      step = s.processes;
    else if (!s.split && __builtin_mul_overflow(s.batch_size, s.processes, &step))
      return "was saved by " + std::to_string(s.processes) + " processes, more than any job has";
    const std::int64_t reached = s.position / step + (s.position % step != 0);
    if (s.batches < reached || (s.batches > reached && !end))
      return where + " after " + std::to_string(s.batches) + " batches; a job of " + std::to_string(s.processes) +
             " process(es) reaches it in " + std::to_string(reached) + " (" + std::to_string(step) + " a step)";
    if (s.generator_state.empty() && epoch_generator())
      return "was saved without a generator state, and this loader shuffles: its order would not be the saved one";
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
  // Whether a job of `processes` processes draws this loader's shuffled order from the global generator (one
  // process without a sampler generator of its own; a transport with one reader, which alone samples: dispatched
  // loading) rather than from a synchronised sampler generator.
  [[nodiscard]] bool draws_from_global(std::int64_t processes) const {
    return orders && !options.seedable && !options.seed && (Transport::single_reader || processes == 1);
  }
  // Starts an epoch: restore (resume), synchronise, draw the order. When the order comes from the global
  // generator (one process, no sampler generator), the resumed epoch was under way, and the global generator was
  // restored by a checkpoint of its own, the restore only rewinds it for the draw: afterwards it goes back to the
  // checkpoint's state, so its later draws (dropout, ...) continue from there rather than from the epoch's start.
  // An epoch resumed from a job of another size whose rule drew the order differently (one process: the global
  // generator; several: the sampler generator) is redrawn by that rule from a copy of the saved state, and this
  // loader's sampler generator is moved past the epoch, where a fresh job of this size has it.
  data::IndexOrder begin_epoch() {
    auto gen = epoch_generator();
    std::optional<std::vector<std::uint8_t>> resume_after;
    std::optional<data::IndexOrder> redrawn;
    if (restore && gen) {
      const bool saved_global = draws_from_global(drawn_by ? drawn_by : ctx.num_processes);
      if (saved_global != draws_from_global(ctx.num_processes)) {
        if (start > 0) {  // the interrupted epoch: its order as the saving job drew it
          at::Generator copy = data::make_generator(0);
          set_generator_bytes(copy, *restore);
          redrawn = orders->draw_with(saved_global, copy);
          orders->skip_epochs(epoch + 1);
        } else {  // an epoch not begun: this job's own, as a fresh job of this size draws it
          orders->skip_epochs(epoch);
          drawn_by = 0;
        }
      } else {
        if (!orders->generator() && (skip > 0 || start > 0) && global_restored_elsewhere)
          resume_after = generator_bytes(*gen);
        set_generator_bytes(*gen, *restore);
      }
    }
    if constexpr (!Transport::single_reader) {  // one reader samples alone: nothing to synchronise
      std::optional<at::Generator> sync = orders && !options.seedable ? orders->generator() : std::nullopt;
      synchronize_rng_states<typename Config::rng>(ctx.comm, sync);
    }
    epoch_start_state = redrawn ? *restore : gen ? generator_bytes(*gen) : std::vector<std::uint8_t>{};
    restore.reset();
    data::IndexOrder order = redrawn ? std::move(*redrawn) : draw_order();
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
    start = 0;
    drawn_by = 0;
    resumed = 0;
    ++epoch;
  }
  [[nodiscard]] data::LoaderState state() const {
    const std::int64_t N = ctx.num_processes;
    data::LoaderState s{.processes = N,
                        .drawn_by = N,
                        .samples = dataset_length(),
                        .batch_size = options.batch_size,
                        .kind = std::int64_t(kind()),
                        .split = Config::split_batches};
    auto gen = epoch_generator();
    if (running && handed < total) {
      s.epoch = epoch;
      s.batches = resumed + handed;
      s.position = position_after(handed);
      s.generator_state = epoch_start_state;
      if (drawn_by) s.drawn_by = drawn_by;
    } else if (running) {  // the epoch is over: the next one, from its start
      s.epoch = epoch + 1;
      s.position = 0;
      s.generator_state = gen ? generator_bytes(*gen) : std::vector<std::uint8_t>{};
    } else {  // not started: what it will run (a loaded state, skip_first_batches)
      s.epoch = epoch;
      s.batches = resumed + skip;
      s.position = position_after(skip);
      s.generator_state = restore ? *restore : gen ? generator_bytes(*gen) : std::vector<std::uint8_t>{};
      if (restore && drawn_by) s.drawn_by = drawn_by;
    }
    return s;
  }
  //! Resumes from `s`: at its global position when it records one (any number of processes), else (format 2)
  //! after its batches (the same number of processes).
  void load(const data::LoaderState& s, data::GlobalGenerator g) {
    accel::detail::require(s.epoch >= 0 && s.batches >= 0 && s.position >= -1,
                           "accel: load_state_dict: a negative epoch, batch count or position");
    if (const auto what = mismatch(s); !what.empty())
      throw InvalidArgument("accel: load_state_dict: the loader state " + what +
                            "; resume with the loader that saved it");
    if (const auto what = unreachable(s); !what.empty())
      throw InvalidArgument("accel: load_state_dict: the loader state " + what +
                            ": it is damaged, or not this loader's");
    global_restored_elsewhere = g == data::GlobalGenerator::restored_by_caller;
    epoch = s.epoch;
    start = std::max<std::int64_t>(s.position, 0);
    skip = s.position >= 0 ? 0 : s.batches;
    drawn_by = s.drawn_by > 0 && s.drawn_by != ctx.num_processes ? s.drawn_by : 0;
    // Batches before the position: the saved count at the same size, else this size's steps that reach it.
    const std::int64_t units = step_units();
    resumed = s.position < 0                     ? 0
              : s.processes == ctx.num_processes ? s.batches
                                                 : (start + units - 1) / std::max<std::int64_t>(units, 1);
    restore.reset();
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
  data::IndexOrder draw_order() {
    if constexpr (data::MapDataset<Dataset>) {
      if (options.sampler) {
        auto order = options.sampler(epoch);
        check_indices(order, "sampler");
        order_length = std::int64_t(order.size());
        return data::IndexOrder::of(std::move(order));
      }
      return orders ? orders->next(epoch) : data::IndexOrder::sequential(dataset->size());
    } else {
      return data::IndexOrder{};
    }
  }
};

}  // namespace detail
}  // namespace accel::pipeline
