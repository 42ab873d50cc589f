#pragma once
//! \file
//! `AutocastScope`: RAII autocast region for one device type (what `torch.autocast` does on entry and exit);
//! `Accelerator::autocast()` returns one for `Options::mixed_precision`.

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace accel {

//! An autocast region for one device type (`torch.autocast`'s `__enter__` / `__exit__`): enables autocast with `dtype`
//! on construction, restores the previous state on destruction. `Accelerator::autocast()` returns one.
class AutocastScope {
 public:
  //! Enters autocast for `device` with `dtype` when `enabled` (else changes nothing).
  AutocastScope(c10::DeviceType device, at::ScalarType dtype, bool enabled)
      : device_(device),
        previous_enabled_(at::autocast::is_autocast_enabled(device)),
        previous_dtype_(at::autocast::get_autocast_dtype(device)) {
    at::autocast::set_autocast_enabled(device, enabled);
    at::autocast::set_autocast_dtype(device, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_, previous_enabled_);
    at::autocast::set_autocast_dtype(device_, previous_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
};

}  // namespace accel
