#pragma once
//! \file
//! Custom state in checkpoints (`Accelerator::register_for_checkpointing`): what an object must offer, and how it
//! is written into `custom_checkpoint_<i>.pt` and read back.
//!
//! An object is checkpointable in one of three ways, tried in this order:
//!
//! | the object has                                                            | its file holds                     |
//! |---------------------------------------------------------------------------|------------------------------------|
//! | `save(torch::serialize::OutputArchive&) const`, `load(InputArchive&)` (modules, optimizers, schedulers) | what
//! `save` writes | | `state_dict()` and `load_state_dict(s)`, the state `Serialisable` (core/serialize.hpp) | the
//! state, serialised | | nothing: the object itself is `Serialisable` (a counter, a struct with `accel_fields`, a
//! vector, a tensor) | the object, serialised |
//!
//! Each file also records the object's type, so that a job registering other objects, or the same in another
//! order, fails to load with a message naming both. Loading is two-phase: `read` parses (and may throw) without
//! touching the object; the returned `commit` restores it.

#include <accel/checkpoint/archive.hpp>
#include <accel/comm/collectives.hpp>
#include <accel/core/serialize.hpp>
#include <accel/detail/linkage.hpp>
#include <accel/error.hpp>

#include <torch/serialize/archive.h>

#include <c10/util/Type.h>

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace accel::checkpoint {

//! An object with LibTorch's archive protocol (a module, an optimizer, accel's schedulers).
template <class T>
concept ArchiveSaveable = requires(const T& c, T& m, torch::serialize::OutputArchive& out,
                                   torch::serialize::InputArchive& in) {
  c.save(out);
  m.load(in);
};
//! An object with Accelerate's protocol: `state_dict()` returns a `Serialisable` value that `load_state_dict` takes.
template <class T>
concept StateDictSaveable = requires(const T& c, T& m) {
  requires Serialisable<std::remove_cvref_t<decltype(c.state_dict())>>;
  m.load_state_dict(c.state_dict());
};
//! What `register_for_checkpointing` accepts.
template <class T>
concept Checkpointable = ArchiveSaveable<T> || StateDictSaveable<T> ||
    (Serialisable<T>&& std::is_copy_assignable_v<T>&& std::is_default_constructible_v<T>);

//! What a custom object's file holds: its `state_dict()`, or the object itself.
template <class T>
struct saved_state {
  using type = T;  //!< the object itself
};
//! An object with `state_dict()`: its file holds what `state_dict()` returns.
template <StateDictSaveable T>
struct saved_state<T> {
  using type = std::remove_cvref_t<decltype(std::declval<const T&>().state_dict())>;  //!< what `state_dict()` returns
};

//! `custom_checkpoint_0.pt`, `custom_checkpoint_1.pt`, ... (Accelerate: `custom_checkpoint_<i>.pkl`).
inline std::string custom_file(std::size_t i) { return "custom_checkpoint_" + std::to_string(i) + ".pt"; }

//! One registered object, type-erased: its type's name, how it is written, and how it is read (parse, then commit).
struct Custom {
  std::string type;        //!< its type's name, recorded in its file
  bool on_device = false;  //!< its archive's tensors are read onto the process's device (LibTorch's protocol)
  std::function<void(torch::serialize::OutputArchive&)> save;  //!< writes the object
  //! Parses its file; the result commits it.
  std::function<std::function<void()>(torch::serialize::InputArchive&, const std::string& path)> read;

  //! `obj` (kept alive by `owner`, which may be empty when the caller guarantees the object outlives the job).
  template <Checkpointable T>
  static Custom of(T& obj, std::shared_ptr<void> owner = nullptr) {
    Custom c;
    c.type = c10::demangle_type<T>();  // the readable name: "Ema", "std::vector<long, ...>"
    T* p = &obj;
    if constexpr (ArchiveSaveable<T>) {
      c.on_device = true;
      c.save = [p, owner](torch::serialize::OutputArchive& a) {
        torch::serialize::OutputArchive inner;
        p->save(inner);
        a.write("state", inner);
      };
      c.read = [p, owner](torch::serialize::InputArchive& a, const std::string& path) -> std::function<void()> {
        auto inner = std::make_shared<torch::serialize::InputArchive>();
        reading(path, [&] { a.read("state", *inner); });
        return [p, inner, path] { reading(path, [&] { p->load(*inner); }); };
      };
    } else {
      c.save = [p, owner](torch::serialize::OutputArchive& a) {
        std::vector<std::uint8_t> bytes;
        if constexpr (StateDictSaveable<T>)
          accel::serialize(p->state_dict(), bytes);
        else
          accel::serialize(*p, bytes);
        a.write("state", accel::detail::bytes_tensor(bytes, c10::Device(c10::kCPU)));
      };
      c.read = [p, owner](torch::serialize::InputArchive& a, const std::string& path) -> std::function<void()> {
        at::Tensor blob;
        reading(path, [&] { a.read("state", blob); });
        if (blob.scalar_type() != at::kByte || blob.dim() != 1 || !blob.is_contiguous() || !blob.device().is_cpu())
          throw FileError(path, "damaged custom state: 'state' is not a 1-D byte tensor");
        std::span<const std::uint8_t> in(blob.data_ptr<std::uint8_t>(), std::size_t(blob.numel()));
        using State = typename saved_state<T>::type;
        auto state = std::make_shared<State>();
        reading(path, [&] { accel::deserialize(*state, in); });
        if (!in.empty())
          throw FileError(path, "damaged custom state: " + std::to_string(in.size()) + " bytes after its end");
        return [p, state, path] {
          if constexpr (StateDictSaveable<T>)
            reading(path, [&] { p->load_state_dict(*state); });
          else
            *p = std::move(*state);
        };
      };
    }
    return c;
  }
};

//! Writes the type's name and the object's state into a custom object's archive.
inline void save_custom(const Custom& c, torch::serialize::OutputArchive& a) {
  a.write("type", c10::IValue(c.type));
  c.save(a);
}

//! Parses a custom object's archive for `c` (registered at position `i`); returns what restores it.
inline std::function<void()> read_custom(const Custom& c, std::size_t i, torch::serialize::InputArchive& a,
                                         const std::string& path) {
  c10::IValue type;
  reading(path, [&] { a.read("type", type); });
  if (!type.isString()) throw FileError(path, "damaged custom state: 'type' is not a string");
  if (type.toStringRef() != c.type)
    throw InvalidArgument(
        "accel::load_state: custom object #" + std::to_string(i) + " of the checkpoint (" + path + ") is a " +
        type.toStringRef() + ", this job registered a " + c.type +
        " there; register_for_checkpointing the same objects, in the same order, as the job that saved it");
  return c.read(a, path);
}

}  // namespace accel::checkpoint
