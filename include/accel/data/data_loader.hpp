#pragma once
//! \file
//! `DataLoader`: the user's loader (a dataset, PyTorch's DataLoader arguments, a collate function), usable as
//! it is in one process and what `prepare()` turns into a prepared loader (data/prepare.hpp).
//!
//! \code
//! accel::data::DataLoader loader(accel::data::TensorDataset(x, y), {.batch_size = 64, .shuffle = true, .workers = 2});
//! for (const auto& batch : loader) ...;    // one process, as PyTorch's DataLoader
//! \endcode

#include <accel/data/collate.hpp>
#include <accel/data/dataset.hpp>
#include <accel/data/options.hpp>
#include <accel/error.hpp>
#include <accel/plan/plan.hpp>

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel::data {

//! A map-style or an iterable dataset.
template <class D>
concept LoaderDataset = MapDataset<D> || IterableDataset<D>;

//! A dataset (map-style or iterable) plus loader options and a collate function.
template <LoaderDataset Dataset, class Collate = DefaultCollate>
class DataLoader {
 public:
  //! The loader of `dataset` with `options` (`batch_size` at least 1) and a collate function.
  DataLoader(Dataset dataset, DataLoaderOptions options = {}, Collate collate = {})
      : dataset_(std::make_shared<const Dataset>(std::move(dataset))), options_(options), collate_(std::move(collate)) {
    accel::detail::require(options_.batch_size >= 1, "accel::data::DataLoader: batch_size must be at least 1 (got " +
                                                         std::to_string(options_.batch_size) + ")");
    accel::detail::require(options_.workers >= 0, "accel::data::DataLoader: workers must be 0 or more");
  }
  //! The dataset, shared with the loaders prepared from this one.
  [[nodiscard]] const std::shared_ptr<const Dataset>& dataset() const noexcept { return dataset_; }
  //! The loader's settings.
  [[nodiscard]] const DataLoaderOptions& options() const noexcept { return options_; }
  //! The collate function.
  [[nodiscard]] const Collate& collate() const noexcept { return collate_; }
  //! Batches of one epoch in one process (PyTorch's `len(loader)`); map-style datasets only.
  [[nodiscard]] std::int64_t size() const requires MapDataset<Dataset> {
    return plan::batch_plan(options_.batch_size, options_.drop_last, dataset_->size()).size();
  }
  //! Iterates the loader as it is, in one process (PyTorch's DataLoader: a shuffled epoch draws its seed
  //! from the global generator). Defined in data/prepare.hpp: it is a one-process prepared loader.
  [[nodiscard]] auto begin() const;
  //! The end of an epoch.
  [[nodiscard]] std::default_sentinel_t end() const noexcept { return {}; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  Collate collate_;
};

}  // namespace accel::data

#include <accel/data/prepare.hpp>  // DataLoader::begin
