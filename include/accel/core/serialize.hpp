#pragma once
//! \file
//! Typed serialisation for `broadcast_object` / `gather_object`: no pickling of arbitrary objects. Supported:
//! arithmetic types and enums, `std::string`, `std::vector`, `std::array`, `std::pair`/`std::tuple`,
//! `std::map`/`std::unordered_map`, `std::optional`, tensors (dtype, shape and bytes; read from the CPU),
//! `torch::data::Example`, and structs with `accel_fields` (see structure.hpp).
//! Host byte order: every process of a job runs the same binary on the same kind of machine.

#include <accel/core/structure.hpp>
#include <accel/error.hpp>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel {

template <class T>
void serialize(const T& x, std::vector<std::uint8_t>& out);
template <class T>
void deserialize(T& x, std::span<const std::uint8_t>& in);

//! Whether `serialize` / `deserialize` accept `T` (every leaf checked).
template <class T>
constexpr bool serialisable() {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::same_as<U, at::Tensor> || is_example<U>::value || std::is_arithmetic_v<U> || std::is_enum_v<U> ||
                std::same_as<U, std::string>)
    return true;
  else if constexpr (is_tuple_like<U>::value)
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (serialisable<std::tuple_element_t<I, U>>() && ...);
    }
  (std::make_index_sequence<std::tuple_size_v<U>>{});
  else if constexpr (is_vector_like<U>::value || is_optional<U>::value) return serialisable<typename U::value_type>();
  else if constexpr (is_map_like<U>::value) return serialisable<typename U::key_type>() &&
      serialisable<typename U::mapped_type>();
  else if constexpr (Described<U>) return serialisable<decltype(accel_fields(std::declval<U&>()))>();
  else return false;
}
//! A value `serialize` / `deserialize` accept: `broadcast_object`, `gather_object`, checkpointed custom state.
template <class T>
concept Serialisable = serialisable<T>();

namespace detail {
inline void put_size(std::size_t n, std::vector<std::uint8_t>& out) {
  const auto v = static_cast<std::uint64_t>(n);
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}
inline std::size_t get_size(std::span<const std::uint8_t>& in) {
  std::uint64_t v = 0;
  detail::require(in.size() >= sizeof v, "accel: broadcast_object: truncated data (do all ranks use the same type?)");
  std::memcpy(&v, in.data(), sizeof v);
  in = in.subspan(sizeof v);
  return static_cast<std::size_t>(v);
}

// The fewest bytes one serialised T takes. A count read from the data is checked against what is left before
// anything is allocated for it, so damaged bytes (a checkpoint's record) cannot ask for 2^62 elements.
template <class T>
constexpr std::size_t min_bytes() {
  if constexpr (std::same_as<T, at::Tensor>)
    return 1;
  else if constexpr (is_example<T>::value)
    return 2;
  else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>)
    return sizeof(T);
  else if constexpr (std::same_as<T, std::string> || is_vector_like<T>::value || is_map_like<T>::value)
    return 8;
  else if constexpr (is_tuple_like<T>::value)
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (std::size_t{0} + ... + min_bytes<std::tuple_element_t<I, T>>());
    }
  (std::make_index_sequence<std::tuple_size_v<T>>{});
  // optionals (their flag) and described structs: at least one byte (a field's own check catches the rest)
  else return 1;
}
inline std::size_t get_count(std::span<const std::uint8_t>& in, std::size_t element_bytes) {
  const auto n = get_size(in);
  detail::require(n <= in.size() / std::max<std::size_t>(element_bytes, 1),
                  "accel: broadcast_object: a count of " + std::to_string(n) + " elements, more than the " +
                      std::to_string(in.size()) + " bytes left can hold (damaged data?)");
  return n;
}
// The element types a serialised tensor may declare: an unknown code is damage, not a dtype to guess at.
inline bool serialisable_dtype(std::int8_t code) {
  switch (at::ScalarType(code)) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kHalf:
    case at::kFloat:
    case at::kDouble:
    case at::kComplexHalf:
    case at::kComplexFloat:
    case at::kComplexDouble:
    case at::kBool:
    case at::kBFloat16:
      return true;
    default:
      return false;
  }
}
}  // namespace detail

//! Appends `x`'s bytes to `out`: tensors, numbers, strings, containers, tuples and structs with `accel_fields`.
template <class T>
void serialize(const T& x, std::vector<std::uint8_t>& out) {
  if constexpr (std::same_as<T, at::Tensor>) {
    const at::Tensor t = x.defined() ? x.contiguous().cpu() : at::Tensor();
    serialize(static_cast<std::int8_t>(t.defined() ? std::int8_t(t.scalar_type()) : std::int8_t(-1)), out);
    if (!t.defined()) return;
    serialize(t.sizes().vec(), out);
    const auto* p = static_cast<const std::uint8_t*>(t.data_ptr());
    out.insert(out.end(), p, p + t.numel() * std::int64_t(t.element_size()));
  } else if constexpr (is_example<T>::value) {
    serialize(x.data, out);
    serialize(x.target, out);
  } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&x);
    out.insert(out.end(), p, p + sizeof x);
  } else if constexpr (std::same_as<T, std::string>) {
    detail::put_size(x.size(), out);
    out.insert(out.end(), x.begin(), x.end());
  } else if constexpr (is_tuple_like<T>::value) {
    std::apply([&](const auto&... e) { (serialize(e, out), ...); }, x);
  } else if constexpr (is_vector_like<T>::value || is_map_like<T>::value) {
    detail::put_size(x.size(), out);
    for (const auto& e : x) serialize(e, out);
  } else if constexpr (is_optional<T>::value) {
    serialize(static_cast<std::uint8_t>(x.has_value()), out);
    if (x) serialize(*x, out);
  } else if constexpr (Described<T>) {
    std::apply([&](const auto&... e) { (serialize(e, out), ...); }, accel_fields(x));
  } else {
    static_assert(sizeof(T) == 0,
                  "accel::broadcast_object: this type cannot be serialised; use arithmetic types, "
                  "strings, containers, or give your struct an accel_fields overload");
  }
}

//! Reads `x` from the front of `in` and advances it past what it read (what `serialize` wrote; damage is an error).
template <class T>
void deserialize(T& x, std::span<const std::uint8_t>& in) {
  if constexpr (std::same_as<T, at::Tensor>) {
    std::int8_t dtype = -1;
    deserialize(dtype, in);
    if (dtype < 0) {
      x = at::Tensor();
      return;
    }
    detail::require(detail::serialisable_dtype(dtype),
                    "accel: broadcast_object: unknown tensor dtype code " + std::to_string(dtype));
    std::vector<std::int64_t> shape;
    deserialize(shape, in);
    // The size is checked against the bytes left before the tensor is allocated.
    std::size_t bytes = c10::elementSize(at::ScalarType(dtype));
    for (const auto d : shape) {
      detail::require(d >= 0, "accel: broadcast_object: a negative tensor dimension");
      detail::require(d == 0 || bytes <= in.size() / std::size_t(d), "accel: broadcast_object: truncated tensor data");
      bytes *= std::size_t(d);
    }
    detail::require(in.size() >= bytes, "accel: broadcast_object: truncated tensor data");
    x = at::empty(shape, at::TensorOptions().dtype(at::ScalarType(dtype)));
    if (bytes) std::memcpy(x.data_ptr(), in.data(), bytes);
    in = in.subspan(bytes);
  } else if constexpr (is_example<T>::value) {
    deserialize(x.data, in);
    deserialize(x.target, in);
  } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
    detail::require(in.size() >= sizeof x, "accel: broadcast_object: truncated data (do all ranks use the same type?)");
    std::memcpy(&x, in.data(), sizeof x);
    in = in.subspan(sizeof x);
  } else if constexpr (std::same_as<T, std::string>) {
    const auto n = detail::get_size(in);
    detail::require(in.size() >= n, "accel: broadcast_object: truncated string");
    x.assign(reinterpret_cast<const char*>(in.data()), n);
    in = in.subspan(n);
  } else if constexpr (is_tuple_like<T>::value) {
    std::apply([&](auto&... e) { (deserialize(e, in), ...); }, x);
  } else if constexpr (is_vector_like<T>::value && requires { x.resize(0); }) {
    x.resize(detail::get_count(in, detail::min_bytes<typename T::value_type>()));
    for (auto& e : x) deserialize(e, in);
  } else if constexpr (is_vector_like<T>::value) {  // std::array
    detail::require(detail::get_size(in) == x.size(), "accel: broadcast_object: array size differs between ranks");
    for (auto& e : x) deserialize(e, in);
  } else if constexpr (is_map_like<T>::value) {
    const auto n =
        detail::get_count(in, detail::min_bytes<typename T::key_type>() + detail::min_bytes<typename T::mapped_type>());
    x.clear();
    for (std::size_t i = 0; i < n; ++i) {
      std::pair<typename T::key_type, typename T::mapped_type> kv;
      deserialize(kv, in);
      x.emplace(std::move(kv));
    }
  } else if constexpr (is_optional<T>::value) {
    std::uint8_t has = 0;
    deserialize(has, in);
    if (has) {
      typename T::value_type v{};
      deserialize(v, in);
      x = std::move(v);
    } else {
      x.reset();
    }
  } else if constexpr (Described<T>) {
    std::apply([&](auto&... e) { (deserialize(e, in), ...); }, accel_fields(x));
  } else {
    static_assert(sizeof(T) == 0, "accel::broadcast_object: this type cannot be serialised");
  }
}

}  // namespace accel
