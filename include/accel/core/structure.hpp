#pragma once
//! \file
//! Nested structures of tensors, as the collectives see them: a tensor, `torch::data::Example<>`, or a
//! `std::tuple`/`std::pair`, `std::vector`, `std::array`, `std::map`/`std::unordered_map` (values), `std::optional` of
//! structures, or a struct that describes itself with an `accel_fields` overload found by ADL:
//!
//! \code
//! struct Batch { at::Tensor data, target; };
//! auto accel_fields(Batch& b) { return std::tie(b.data, b.target); }
//! auto accel_fields(const Batch& b) { return std::tie(b.data, b.target); }
//! \endcode

#include <ATen/core/Tensor.h>
#include <torch/data/example.h>

#include <array>
#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace accel {

//! Whether `T` is a tuple or a pair (a structure's node).
template <class T>
struct is_tuple_like : std::false_type {};
//! A tuple.
template <class... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};
//! A pair.
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
//! Whether `T` is a vector or an array (a structure's node).
template <class T>
struct is_vector_like : std::false_type {};
//! A vector.
template <class T, class A>
struct is_vector_like<std::vector<T, A>> : std::true_type {};
//! An array.
template <class T, std::size_t N>
struct is_vector_like<std::array<T, N>> : std::true_type {};
//! Whether `T` is a map (a structure's node, keyed).
template <class T>
struct is_map_like : std::false_type {};
//! A map.
template <class K, class V, class... R>
struct is_map_like<std::map<K, V, R...>> : std::true_type {};
//! An unordered map.
template <class K, class V, class... R>
struct is_map_like<std::unordered_map<K, V, R...>> : std::true_type {};
//! Whether `T` is an optional (a structure's node: empty or one value).
template <class T>
struct is_optional : std::false_type {};
//! An optional.
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
//! Whether `T` is LibTorch's `Example` (data and target).
template <class T>
struct is_example : std::false_type {};
//! LibTorch's `Example<>`.
template <>
struct is_example<torch::data::Example<>> : std::true_type {};

//! A struct that lists its members with `accel_fields(x)` (a tuple of references).
template <class T>
concept Described = requires(T& x) {
  accel_fields(x);
};

//! Whether every leaf of `T` is a tensor (what the tensor collectives accept).
template <class T>
constexpr bool all_tensor_leaves() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::same_as<U, at::Tensor> || is_example<U>::value)
    return true;
  else if constexpr (is_tuple_like<U>::value)
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (all_tensor_leaves<std::tuple_element_t<I, U>>() && ...);
    }
  (std::make_index_sequence<std::tuple_size_v<U>>{});
  else if constexpr (is_vector_like<U>::value ||
                     is_optional<U>::value) return all_tensor_leaves<typename U::value_type>();
  else if constexpr (is_map_like<U>::value) return all_tensor_leaves<typename U::mapped_type>();
  else if constexpr (Described<U>) return all_tensor_leaves<decltype(accel_fields(std::declval<U&>()))>();
  else return false;
}

//! A nested structure whose leaves are all tensors (tensors, vectors, arrays, maps, optionals, tuples, `Example`s and
//! described structs of them): what the collectives take.
template <class T>
concept TensorStructure = all_tensor_leaves<T>();

//! Calls `f(tensor)` on every leaf, depth first, in a fixed order (the same on every rank).
template <class T, class F>
void for_each_tensor(T&& x, F&& f) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::same_as<U, at::Tensor>)
    f(x);
  else if constexpr (is_example<U>::value)
    f(x.data), f(x.target);
  else if constexpr (is_tuple_like<U>::value)
    std::apply([&](auto&&... e) { (for_each_tensor(e, f), ...); }, x);
  else if constexpr (is_vector_like<U>::value)
    for (auto&& e : x) for_each_tensor(e, f);
  else if constexpr (is_map_like<U>::value)
    for (auto&& [k, v] : x) for_each_tensor(v, f);
  else if constexpr (is_optional<U>::value) {
    if (x) for_each_tensor(*x, f);
  } else if constexpr (Described<U>)
    for_each_tensor(accel_fields(x), f);
  else
    static_assert(sizeof(U) == 0,
                  "accel: this collective needs a tensor at every leaf; use broadcast_object / "
                  "gather_object for other values");
}

//! The same structure with every tensor replaced by `f(tensor)`; the input is not modified.
template <class T, class F>
std::remove_cvref_t<T> map_tensors(const T& x, F&& f) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::same_as<U, at::Tensor>)
    return f(x);
  else if constexpr (is_example<U>::value)
    return U{f(x.data), f(x.target)};
  else if constexpr (is_tuple_like<U>::value)
    return std::apply([&](const auto&... e) { return U{map_tensors(e, f)...}; }, x);
  else if constexpr (is_vector_like<U>::value) {
    U out = x;
    for (auto& e : out) e = map_tensors(e, f);
    return out;
  } else if constexpr (is_map_like<U>::value) {
    U out;
    for (const auto& [k, v] : x) out.emplace(k, map_tensors(v, f));
    return out;
  } else if constexpr (is_optional<U>::value) {
    return x ? U(map_tensors(*x, f)) : U();
  } else if constexpr (Described<U>) {
    U out = x;
    auto dst = accel_fields(out);
    auto src = accel_fields(x);
    [&]<std::size_t... I>(std::index_sequence<I...>) { ((std::get<I>(dst) = map_tensors(std::get<I>(src), f)), ...); }
    (std::make_index_sequence<std::tuple_size_v<decltype(src)>>{});
    return out;
  } else {
    static_assert(sizeof(U) == 0,
                  "accel: this collective needs a tensor at every leaf; use broadcast_object / "
                  "gather_object for other values");
  }
}

//! What each rank holds in one batch: `size[r]` rows, of which the first `real[r]` are real samples (the
//! plans of `accel/plan/plan.hpp` give both for every rank without communicating; `gather_for_metrics` keeps
//! exactly the real rows).
struct GatherLayout {
  std::vector<std::int64_t> size;  //!< rows each rank holds
  std::vector<std::int64_t> real;  //!< of which real (the first ones)
};

}  // namespace accel
