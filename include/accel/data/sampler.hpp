#pragma once
//! \file
//! Samplers: the order in which one epoch visits a dataset of `n` samples.
//!
//! | accel                    | PyTorch / Accelerate                                   |
//! |--------------------------|--------------------------------------------------------|
//! | `IndexOrder::sequential` | `SequentialSampler`                                    |
//! | `RandomSampler`          | `RandomSampler(generator=...)`                         |
//! | `SeedableRandomSampler`  | `accelerate.data_loader.SeedableRandomSampler`         |
//! | `synchronized_generator` | the generator `prepare_data_loader` attaches to a RandomSampler |
//!
//! With the same torch version (the one accel links) and the same seed, the permutations are bit-identical
//! to Python's: the same kernels (`randperm`, `randint`) run on the same generator algorithm.

#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randperm.h>

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace accel::data {

//! One epoch's sampling order: `order[i]` is the dataset index visited i-th. Either the identity (no
//! allocation) or a shared, immutable list drawn by a random sampler. Cheap to copy.
class IndexOrder {
 public:
  IndexOrder() = default;
  //! The identity order of `n` indices (no allocation).
  static IndexOrder sequential(std::int64_t n) { return IndexOrder(n, nullptr); }
  //! The order `indices`, shared.
  static IndexOrder of(std::vector<std::int64_t> indices) {
    auto list = std::make_shared<const std::vector<std::int64_t>>(std::move(indices));
    const auto* p = list->data();
    return IndexOrder(static_cast<std::int64_t>(list->size()), std::shared_ptr<const std::int64_t>(list, p));
  }
  //! A 1-d int64 tensor of indices, kept alive and read in place (no copy).
  static IndexOrder of(at::Tensor indices) {
    indices = indices.contiguous();
    auto keep = std::make_shared<const at::Tensor>(indices);
    return IndexOrder(indices.numel(), std::shared_ptr<const std::int64_t>(keep, indices.data_ptr<std::int64_t>()));
  }
  //! The number of indices.
  [[nodiscard]] std::int64_t size() const noexcept { return n_; }
  //! The dataset index visited `i`-th.
  [[nodiscard]] std::int64_t operator[](std::int64_t i) const noexcept { return list_ ? list_.get()[i] : i; }
  //! Whether this is the identity order.
  [[nodiscard]] bool is_sequential() const noexcept { return list_ == nullptr; }
  //! The drawn indices, or nullptr for the identity.
  [[nodiscard]] const std::int64_t* data() const noexcept { return list_.get(); }

 private:
  IndexOrder(std::int64_t n, std::shared_ptr<const std::int64_t> list) : n_(n), list_(std::move(list)) {}
  std::int64_t n_ = 0;
  std::shared_ptr<const std::int64_t> list_;  // aliases the owner (a vector or a tensor)
};

namespace detail {
inline std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  const auto c = t.contiguous();
  const auto* p = c.data_ptr<std::int64_t>();
  return {p, p + c.numel()};
}
}  // namespace detail

//! A CPU generator seeded with `seed` (Python: `g = torch.Generator(); g.manual_seed(seed)`).
inline at::Generator make_generator(std::uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// [accelerate:data_loader.py prepare_data_loader] (the `sampler.generator is None` branch)
//! The generator `prepare_data_loader` creates for a RandomSampler that has none: seeded with an int64 drawn
//! from the global CPU generator (`torch.empty((), dtype=torch.int64).random_()`), so it follows the job's
//! seed. Synchronising it across ranks at each epoch (rng::generator) keeps every rank on one permutation.
inline at::Generator synchronized_generator() {
  const std::int64_t seed = at::empty({}, at::kLong).random_().item<std::int64_t>();
  return make_generator(static_cast<std::uint64_t>(seed));
}

//! `RandomSampler`'s settings (PyTorch's `replacement`, `num_samples`).
struct RandomSamplerOptions {
  bool replacement = false;                 //!< draw with replacement
  std::optional<std::int64_t> num_samples;  //!< default: the dataset's length
  //! Advance the generator past the end of each epoch like PyTorch's lazy sampler does (needed when the
  //! generator lives on to the next epoch; pointless for a generator used for one epoch only).
  bool advance_after_epoch = true;
};

// [torch:utils/data/sampler.py RandomSampler.__iter__]
//! `RandomSampler(n, replacement, num_samples, generator)`: draws one epoch's order from `generator`,
//! advancing it exactly as PyTorch does (so consecutive epochs differ and match Python's).
class RandomSampler {
 public:
  using Options = RandomSamplerOptions;  //!< the options struct
  //! A sampler of `n` indices drawing from `generator`.
  RandomSampler(std::int64_t n, at::Generator generator, Options options = {})
      : n_(n),
        num_samples_(options.num_samples.value_or(n)),
        replacement_(options.replacement),
        advance_(options.advance_after_epoch),
        generator_(std::move(generator)) {
    accel::detail::require(n >= 0, "accel::data::RandomSampler: the dataset length is negative");
    accel::detail::require(num_samples_ >= 0, "accel::data::RandomSampler: num_samples must be 0 or more");
    accel::detail::require(n > 0 || num_samples_ == 0,
                           "accel::data::RandomSampler: cannot draw samples from an empty dataset");
  }
  RandomSampler(const RandomSampler&) = delete;
  RandomSampler& operator=(const RandomSampler&) = delete;
  ~RandomSampler() { settle(); }

  //! Indices per epoch (`num_samples`).
  [[nodiscard]] std::int64_t size() const noexcept { return num_samples_; }
  //! The generator, with every draw of the epochs so far applied.
  [[nodiscard]] const at::Generator& generator() {
    settle();
    return generator_;
  }

  //! The next epoch's order (advances the generator).
  ACCEL_DECL IndexOrder next_epoch();

 private:
  ACCEL_DECL void settle();
  std::int64_t n_, num_samples_;
  bool replacement_, advance_;
  at::Generator generator_;
  std::future<at::Generator> pending_;
};

// [accelerate:data_loader.py SeedableRandomSampler]
//! A random sampler whose order depends only on `(initial_seed, epoch)`: epoch e draws a RandomSampler
//! order from a generator seeded with `initial_seed + e`. `initial_seed` is the `data_seed` if given,
//! else the global generator's current seed when the sampler is made (Accelerate's rule).
class SeedableRandomSampler {
 public:
  //! A sampler of `n` indices seeded with `data_seed` (unset: the global generator's current seed).
  SeedableRandomSampler(std::int64_t n, std::optional<std::uint64_t> data_seed = std::nullopt,
                        RandomSampler::Options options = {})
      : n_(n),
        options_(options),
        initial_seed_(data_seed ? *data_seed : at::detail::getDefaultCPUGenerator().current_seed()) {}

  //! Sets the epoch the next order is drawn for.
  void set_epoch(std::int64_t epoch) noexcept { epoch_ = epoch; }
  //! The epoch of the next order.
  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  //! The seed of epoch 0.
  [[nodiscard]] std::uint64_t initial_seed() const noexcept { return initial_seed_; }
  //! Indices per epoch (`num_samples`).
  [[nodiscard]] std::int64_t size() const noexcept { return options_.num_samples.value_or(n_); }

  //! The order of the current epoch (does not advance the epoch: the loader calls `set_epoch`).
  [[nodiscard]] IndexOrder order() const {
    auto once = options_;
    once.advance_after_epoch = false;
    RandomSampler sampler(n_, make_generator(initial_seed_ + static_cast<std::uint64_t>(epoch_)), once);
    return sampler.next_epoch();
  }

 private:
  std::int64_t n_;
  RandomSampler::Options options_;
  std::uint64_t initial_seed_;
  std::int64_t epoch_ = 0;
};

}  // namespace accel::data

namespace accel::data {

//! How a prepared, shuffled loader draws its epochs.
enum class Shuffle {
  synchronized,  //!< Accelerate's default: one generator, seeded from the job's seed and kept equal on every rank
  seedable,      //!< `use_seedable_sampler=True`: epoch e is seeded with `initial_seed + e`
};

// [accelerate:data_loader.py prepare_data_loader] + [torch:utils/data/dataloader.py _BaseDataLoaderIter]
//! The random order of each epoch of a loader made with `shuffle=true` and prepared for `num_processes`
//! processes, drawn exactly as Python does with the same seed:
//! - `Shuffle::seedable`: `SeedableRandomSampler`.
//! - `Shuffle::synchronized`, several processes: `prepare_data_loader` gives the sampler a generator seeded
//!   from the global generator (drawn at construction, like `prepare()`); each epoch draws from it.
//! - `Shuffle::synchronized`, one process: nothing is sharded and the sampler has no generator, so every epoch
//!   PyTorch draws the loader's base seed and then a fresh sampler seed from the global generator.
//! Epochs must be drawn in order, 0, 1, 2, ... (the generators advance).
class ShuffledOrders {
 public:
  //! `seed`: the sampler's own generator seed (PyTorch's `generator=`); then it is used on every number of
  //! processes, as when a user gives a DataLoader a generator.
  ShuffledOrders(std::int64_t n, int num_processes, Shuffle mode, std::optional<std::uint64_t> data_seed = {},
                 RandomSamplerOptions options = {}, std::optional<std::uint64_t> seed = {})
      : n_(n), options_(options) {
    if (mode == Shuffle::seedable)
      seedable_.emplace(n, data_seed, options);
    else if (seed)
      sampler_.emplace(n, make_generator(*seed), options);
    else if (num_processes > 1)
      sampler_.emplace(n, synchronized_generator(), options);
  }

  //! The order of the next epoch, `epoch` being its number (used by the seedable sampler).
  IndexOrder next(std::int64_t epoch) {
    if (seedable_) {
      seedable_->set_epoch(epoch);
      return seedable_->order();
    }
    if (sampler_) return sampler_->next_epoch();
    (void)at::empty({}, at::kLong).random_();  // the DataLoader iterator's base seed
    auto once = options_;
    once.advance_after_epoch = false;
    return RandomSampler(n_, synchronized_generator(), once).next_epoch();
  }

  //! One epoch's order drawn from `g` (left where the draw leaves it) by the rule of another number of processes:
  //! `global_rule`, as a one-process loader without a sampler generator draws from the global generator (a loader
  //! seed, then a fresh sampler seed); else as a synchronised sampler generator draws. A job resumed at another size
  //! redraws the interrupted epoch with the rule of the job that drew it.
  [[nodiscard]] IndexOrder draw_with(bool global_rule, at::Generator g) const {
    auto once = options_;
    once.advance_after_epoch = false;
    if (!global_rule) return RandomSampler(n_, std::move(g), once).next_epoch();
    (void)at::empty({}, at::kLong).random_(g);  // the DataLoader iterator's base seed
    const std::int64_t seed = at::empty({}, at::kLong).random_(g).item<std::int64_t>();
    return RandomSampler(n_, make_generator(static_cast<std::uint64_t>(seed)), once).next_epoch();
  }
  //! Advances the sampler generator past `epochs` epochs, as if they had been drawn (nothing for the other rules).
  void skip_epochs(std::int64_t epochs) {
    if (!sampler_) return;
    for (std::int64_t e = 0; e < epochs; ++e) (void)sampler_->next_epoch();
  }

  //! The generator of the synchronised sampler (what rng::generator broadcasts), if there is one.
  [[nodiscard]] std::optional<at::Generator> generator() {
    return sampler_ ? std::optional<at::Generator>(sampler_->generator()) : std::nullopt;
  }

 private:
  std::int64_t n_;
  RandomSamplerOptions options_;
  std::optional<SeedableRandomSampler> seedable_;
  std::optional<RandomSampler> sampler_;
};

}  // namespace accel::data

#if ACCEL_DEFINITIONS
#include <accel/data/impl/sampler.ipp>
#endif
