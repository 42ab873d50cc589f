#pragma once
//! \file
//! The definition of `DistributedModule::ready` (model/distributed_module.hpp, included at its end): the gradient hook,
//! the one function that needs the autograd engine's header (its callback queue), which stays out of user code under
//! ACCEL_SEPARATE_COMPILATION (detail/linkage.hpp, Note [Separate compilation]).

#include <accel/model/distributed_module.hpp>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include <memory>
#include <mutex>

namespace accel {

// A parameter's gradient is accumulated (its post-accumulate-grad hook): the first queues the end-of-backward
// callback, and its bucket starts once complete.
ACCEL_DECL void DistributedModule::ready(const std::shared_ptr<State>& sp, std::size_t index) {
  auto& s = *sp;
  std::lock_guard<std::mutex> lock(s.mu);
  s.keep_graph = torch::autograd::get_current_graph_task_keep_graph();
  if (!s.entered && needs_door(s))
    throw InvalidArgument(
        "accel: a backward through the prepared model followed a forward that did not go through it "
        "(model->forward(x), "
        "or a submodule called directly): the prepared model brackets its forward as DDP does, broadcasting rank 0's "
        "buffers (BatchNorm's running statistics) first, and without it the processes' buffers drift apart. Call the "
        "prepared model itself, model(x), for every forward; or set Options::broadcast_buffers = false to keep each "
        "process's own buffers");
  ++s.hook_calls;
  if (!s.callback_queued) {  // once per backward: the end of backward (finalize) closes the door again
    s.callback_queued = true;
    std::weak_ptr<State> weak = sp;
    torch::autograd::Engine::get_default_engine().queue_callback([weak] {
      if (auto st = weak.lock()) end_of_backward(*st);
    });
  }
  auto& p = s.params[index];
  if (s.full && !s.sync) return s.full->ready(index, false);  // the unit is freed once complete
  if (!s.sync) return;
  if (p.ready) return;  // a parameter used twice in the graph fires once per accumulation
  p.ready = true;
  if (s.zero) return s.zero->ready(index);
  if (s.full) return s.full->ready(index, true);
  ++s.buckets[p.bucket].ready;
  launch_ready(s);
}

}  // namespace accel
