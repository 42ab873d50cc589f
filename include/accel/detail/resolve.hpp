#pragma once
// Policies... -> one policy per slot. Boost.Hana stays in this file: no Hana type reaches a public
// signature (config.hpp turns the result into the plain `Config`).

#include <accel/policy/slots.hpp>

#include <boost/hana/filter.hpp>
#include <boost/hana/front.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <cstddef>
#include <type_traits>

namespace accel::detail {

namespace hana = boost::hana;

template <class Slot, class... Ps>
constexpr auto in_slot() {
  return hana::filter(hana::tuple_t<Ps...>,
                      [](auto t) { return hana::bool_c<std::is_same_v<slot_of_t<typename decltype(t)::type>, Slot>>; });
}

//! How many of `Ps...` fill `Slot`.
template <class Slot, class... Ps>
inline constexpr std::size_t count_in_slot = decltype(hana::length(in_slot<Slot, Ps...>()))::value;

//! The first of `Ps...` that fills `Slot`, or `Default` when none does. (A duplicate is diagnosed
//! separately; picking the first keeps the rest of the build free of follow-up errors.)
template <class Slot, class Default, class... Ps>
struct pick {
  using type = Default;
};
template <class Slot, class Default, class... Ps>
requires(count_in_slot<Slot, Ps...> > 0) struct pick<Slot, Default, Ps...> {
  using type = typename decltype(+hana::front(in_slot<Slot, Ps...>()))::type;
};
template <class Slot, class Default, class... Ps>
using pick_t = typename pick<Slot, Default, Ps...>::type;

//! Whether every one of `Ps...` is a policy.
template <class... Ps>
inline constexpr bool all_policies = (Policy<Ps> && ...);

}  // namespace accel::detail
