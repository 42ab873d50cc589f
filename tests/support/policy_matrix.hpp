#pragma once
// The loading policies as a test matrix: every combination of batches × tail × loading that the library accepts
// (`accel::diagnose` finds no problem), generated rather than named by hand. Unit tests run over it with Catch2's
// TEMPLATE_LIST_TEST_CASE; the multi-process tests pick the cell of a golden case with `with_config`.
#include <accel/config.hpp>

#include <boost/hana/cartesian_product.hpp>
#include <boost/hana/flatten.hpp>
#include <boost/hana/transform.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include <tuple>
#include <type_traits>

namespace accel_test {
namespace hana = boost::hana;

namespace detail {
template <class... Ps>
constexpr auto cell(hana::basic_type<Ps>...) {
  if constexpr (accel::diagnose<accel::dist::gloo, Ps...>() == accel::ConfigProblem::none)
    return hana::make_tuple(hana::type_c<accel::CheckedConfig<accel::dist::gloo, Ps...>>);
  else
    return hana::make_tuple();  // a combination the library refuses at build time (tests/fail says so)
}
constexpr auto matrix(auto... axes) {
  const auto cells = hana::cartesian_product(hana::make_tuple(axes...));
  return hana::unpack(cells, [](auto... c) {
    return hana::flatten(hana::make_tuple(hana::unpack(c, [](auto... t) { return cell(t...); })...));
  });
}
template <class T>
using as_std_tuple = typename decltype(hana::unpack(
    T{}, [](auto... c) { return hana::type_c<std::tuple<typename decltype(c)::type...>>; }))::type;
}  // namespace detail

//! Every accepted configuration of the loading layer: {per_process, split} × {even, uneven} × {sharded, dispatched}
//! (dispatched with an uneven tail is refused, so 6 cells), each an `accel::CheckedConfig` on dist::gloo.
using LoaderMatrix =
    detail::as_std_tuple<decltype(detail::matrix(hana::tuple_t<accel::batches::per_process, accel::batches::split>,
                                                 hana::tuple_t<accel::tail::even, accel::tail::uneven>,
                                                 hana::tuple_t<accel::loading::sharded, accel::loading::dispatched>))>;

//! The sharded cells only (what one process can run by simulating its rank; dispatch needs real peers).
using ShardedMatrix = detail::as_std_tuple<decltype(detail::matrix(
    hana::tuple_t<accel::batches::per_process, accel::batches::split>,
    hana::tuple_t<accel::tail::even, accel::tail::uneven>, hana::tuple_t<accel::loading::sharded>))>;

//! Calls `f.template operator()<Config>()` for the cell of `Matrix` whose flags are (split, even, dispatch);
//! returns false when no cell matches (a combination the library refuses).
template <class Matrix, class F>
bool with_config(bool split, bool even, bool dispatch, F&& f) {
  return [&]<class... Cs>(std::tuple<Cs...>*) {
    return ((Cs::split_batches == split && Cs::even_batches == even && Cs::dispatch == dispatch
                 ? (f.template operator()<Cs>(), true)
                 : false) ||
            ...);
  }(static_cast<Matrix*>(nullptr));
}

}  // namespace accel_test
