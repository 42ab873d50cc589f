#pragma once
//! \file
//! The definitions of `RandomSampler::next_epoch` and `settle` (data/sampler.hpp, included at its end), kept out of
//! user code under ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]) for their cost:
//! std::async's machinery, 11 MB of g++'s 2,000 per translation unit (benchmarks/README.md, "Separate compilation").

#include <accel/data/sampler.hpp>

namespace accel::data {

ACCEL_DECL IndexOrder RandomSampler::next_epoch() {
  settle();
  const auto opts = at::TensorOptions().dtype(at::kLong);
  if (!replacement_ && n_ > 0 && num_samples_ == n_) {
    // The usual case, without copies: one permutation. PyTorch's sampler then draws one more permutation
    // when the epoch is consumed to the end (and drops it); that only advances the generator, so it runs on
    // a clone in the background and its state is taken over before the generator is next used.
    at::Tensor perm = at::randperm(n_, generator_, opts);
    if (!advance_) return IndexOrder::of(perm);
    at::Generator clone = generator_.clone();
    const std::int64_t n = n_;
    pending_ = std::async(std::launch::async, [clone, n]() mutable {
      (void)at::randperm(n, clone, at::TensorOptions().dtype(at::kLong));
      return clone;
    });
    return IndexOrder::of(perm);
  }
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(num_samples_));
  auto append = [&](const at::Tensor& t) {
    auto v = detail::to_vector(t);
    out.insert(out.end(), v.begin(), v.end());
  };
  if (replacement_) {
    for (std::int64_t i = 0; i < num_samples_ / 32; ++i) append(at::randint(n_, {32}, generator_, opts));
    append(at::randint(n_, {num_samples_ % 32}, generator_, opts));
  } else if (n_ > 0) {
    for (std::int64_t i = 0; i < num_samples_ / n_; ++i) append(at::randperm(n_, generator_, opts));
    auto tail = detail::to_vector(at::randperm(n_, generator_, opts));
    out.insert(out.end(), tail.begin(), tail.begin() + num_samples_ % n_);
  }
  return IndexOrder::of(std::move(out));
}

ACCEL_DECL void RandomSampler::settle() {
  if (!pending_.valid()) return;
  at::Generator advanced = pending_.get();
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_state(advanced.get_state());
}

}  // namespace accel::data
