#pragma once
//! \file
//! Datasets, as the loaders see them.
//!
//! | concept          | what it needs                                  | examples                                  |
//! |------------------|------------------------------------------------|-------------------------------------------|
//! | `MapDataset`     | `size()` and `get(i)` (one sample)             | any class; `RangeDataset` over a vector   |
//! | `BatchedDataset` | a `MapDataset` with `get_batch(indices)`       | `TensorDataset`: one `index_select` per tensor
//! | | `IterableDataset`| an input range of samples (no `get`)           | a generator, a file reader                |
//!
//! A stream's length is its own business: `size()` is optional. Without one (samples made on the fly, a file read
//! as it goes, an endless generator that the loop stops) every loading path works, cut and resumed alike; the
//! prepared loader then has no `size()` (it would have to read the stream to know).
//!
//! `TorchDataset` adapts LibTorch's `torch::data::datasets::Dataset` (MNIST, ...): `get(size_t)` and an
//! optional `size()`.

#include <accel/error.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>
#include <torch/data/example.h>

#include <concepts>
#include <cstdint>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <utility>
#include <vector>

//! The user's data vocabulary: datasets, `DataLoader` and its options, samplers, Accelerate's shards, collation, the
//! prepared loaders and their state.
namespace accel::data {

//! A map-style dataset: `size()` and `get(i)` (PyTorch's `__len__` and `__getitem__`).
template <class D>
concept MapDataset = requires(const D& d, std::int64_t i) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  d.get(i);
};

//! A map-style dataset that can also fetch a whole batch at once (`get_batch(indices)`).
template <class D>
concept BatchedDataset = MapDataset<D> && requires(const D& d, std::span<const std::int64_t> idx) {
  d.get_batch(idx);
};

//! An iterable dataset: any input range of samples that is not map-style, read as a stream.
template <class D>
concept IterableDataset = std::ranges::input_range<D> && !MapDataset<D>;

//! The sample type of a map-style dataset (what `get` returns).
template <MapDataset D>
using sample_t = std::remove_cvref_t<decltype(std::declval<const D&>().get(std::int64_t{}))>;

//! `(data, target)` tensors whose first dimension indexes the samples. A batch is gathered with one
//! `index_select` per tensor: no per-sample tensors are made.
class TensorDataset {
 public:
  using Example = torch::data::Example<>;  //!< a sample: `{data, target}`
  //! Samples are the rows of `data` and `target` (the same first dimension).
  TensorDataset(at::Tensor data, at::Tensor target) : data_(std::move(data)), target_(std::move(target)) {
    accel::detail::require(data_.dim() > 0 && target_.dim() > 0 && data_.size(0) == target_.size(0),
                           "accel::data::TensorDataset: data and target must have the same first dimension (got " +
                               std::to_string(data_.dim() ? data_.size(0) : 0) + " and " +
                               std::to_string(target_.dim() ? target_.size(0) : 0) + ")");
  }
  //! The number of samples (the first dimension).
  [[nodiscard]] std::int64_t size() const noexcept { return data_.size(0); }
  //! Sample `i`: row `i` of both tensors.
  [[nodiscard]] Example get(std::int64_t i) const {
    check(i);
    return {data_[i], target_[i]};
  }
  //! A whole batch: one `index_select` per tensor.
  [[nodiscard]] Example get_batch(std::span<const std::int64_t> indices) const {
    // A view of the caller's indices (index_select copies the rows out before it returns).
    const at::Tensor idx =
        at::from_blob(const_cast<std::int64_t*>(indices.data()), {std::int64_t(indices.size())}, at::kLong);
    return {at::index_select(data_, 0, idx), at::index_select(target_, 0, idx)};
  }
  //! The samples' tensor.
  [[nodiscard]] const at::Tensor& data() const noexcept { return data_; }
  //! The targets' tensor.
  [[nodiscard]] const at::Tensor& target() const noexcept { return target_; }

 private:
  void check(std::int64_t i) const {
    if (i < 0 || i >= size())
      throw InvalidArgument("accel::data::TensorDataset: index " + std::to_string(i) + " is out of range for " +
                            std::to_string(size()) + " samples");
  }
  at::Tensor data_, target_;
};

//! Any random-access range (a `std::vector<Sample>`, a view) as a map-style dataset. Holds a copy.
template <std::ranges::random_access_range R>
class RangeDataset {
 public:
  //! A dataset over `range` (a copy).
  explicit RangeDataset(R range) : range_(std::move(range)) {}
  //! The range's length.
  [[nodiscard]] std::int64_t size() const { return std::int64_t(std::ranges::size(range_)); }
  //! Element `i` (an index out of range is an `InvalidArgument`).
  [[nodiscard]] auto get(std::int64_t i) const {
    if (i < 0 || i >= size())
      throw InvalidArgument("accel::data::RangeDataset: index " + std::to_string(i) + " is out of range for " +
                            std::to_string(size()) + " samples");
    return std::ranges::begin(range_)[i];
  }

 private:
  R range_;
};
//! Deduces the range type (`RangeDataset(std::vector{...})`).
template <class R>
RangeDataset(R) -> RangeDataset<R>;

//! LibTorch's `torch::data::datasets::Dataset` (for example `torch::data::datasets::MNIST`) as a map-style
//! dataset. Its `size()` must be known.
template <class TorchDs>
class TorchDataset {
 public:
  //! Wraps `ds`, whose size must be known.
  explicit TorchDataset(TorchDs ds) : ds_(std::move(ds)) {
    accel::detail::require(ds_.size().has_value(),
                           "accel::data::TorchDataset: the dataset has no size; wrap it as an "
                           "iterable dataset (an input range) instead");
  }
  //! The dataset's size.
  [[nodiscard]] std::int64_t size() const { return std::int64_t(*ds_.size()); }
  //! The LibTorch dataset's example `i`.
  [[nodiscard]] auto get(std::int64_t i) const { return const_cast<TorchDs&>(ds_).get(std::size_t(i)); }

 private:
  TorchDs ds_;
};

}  // namespace accel::data
