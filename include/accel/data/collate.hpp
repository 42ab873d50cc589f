#pragma once
//! \file
//! Default collation: a list of samples -> one batch, structure by structure. Tensors are stacked along a new
//! first dimension; numbers become a 1-d tensor; `torch::data::Example`, tuples, `std::vector`, and structs
//! with `accel_fields` (comm/structure.hpp) are collated member by member. Anything else needs a collate
//! function of the user's (`DataLoader(dataset, options, my_collate)`).

#include <accel/core/structure.hpp>
#include <accel/error.hpp>

#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <torch/data/example.h>

#include <type_traits>
#include <vector>

namespace accel::data {

template <class S>
auto collate(const std::vector<S>& samples);

namespace detail {
template <class S, class Get>
auto collate_member(const std::vector<S>& samples, Get get) {
  using M = std::remove_cvref_t<decltype(get(samples.front()))>;
  std::vector<M> column;
  column.reserve(samples.size());
  for (const auto& s : samples) column.push_back(get(s));
  return collate(column);
}
}  // namespace detail

//! Collates samples into one batch (PyTorch's `default_collate`): tensors stacked, numbers made a tensor, `Example`s,
//! tuples and described structs collated field by field.
template <class S>
auto collate(const std::vector<S>& samples) {
  accel::detail::require(!samples.empty(), "accel::data::collate: a batch needs at least one sample");
  if constexpr (std::same_as<S, at::Tensor>) {
    return at::stack(samples, 0);
  } else if constexpr (std::is_arithmetic_v<S>) {
    return at::tensor(std::vector<std::conditional_t<std::is_floating_point_v<S>, double, std::int64_t>>(
        samples.begin(), samples.end()));
  } else if constexpr (std::same_as<S, torch::data::Example<>>) {
    return torch::data::Example<>{detail::collate_member(samples, [](const S& s) { return s.data; }),
                                  detail::collate_member(samples, [](const S& s) { return s.target; })};
  } else if constexpr (is_tuple_like<S>::value) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::make_tuple(detail::collate_member(samples, [](const S& s) { return std::get<I>(s); })...);
    }
    (std::make_index_sequence<std::tuple_size_v<S>>{});
  } else if constexpr (Described<S>) {
    S out = samples.front();
    auto dst = accel_fields(out);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((std::get<I>(dst) = detail::collate_member(samples, [](const S& s) { return std::get<I>(accel_fields(s)); })),
       ...);
    }
    (std::make_index_sequence<std::tuple_size_v<decltype(dst)>>{});
    return out;
  } else {
    static_assert(sizeof(S) == 0,
                  "accel::data::collate: no default collation for this sample type; pass a collate "
                  "function to DataLoader, or give the struct an accel_fields overload");
  }
}

//! The default collate function object.
struct DefaultCollate {
  //! Collates `samples` with `collate`.
  template <class S>
  auto operator()(const std::vector<S>& samples) const {
    return collate(samples);
  }
};

}  // namespace accel::data
