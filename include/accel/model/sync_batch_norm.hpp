#pragma once
//! \file
//! `SyncBatchNorm`: batch normalisation with the statistics of the global batch, across the processes (what
//! `torch.nn.SyncBatchNorm` does; LibTorch has none), and `convert_sync_batchnorm`.
//!
//! - Training: each rank's count, mean and sum of squared deviations are all-gathered (one collective) and merged
//!   (Chan's parallel formula, in double), so per-rank batch sizes may differ; the output is normalised with the
//!   global mean and variance; the running statistics are updated as PyTorch's (`momentum`, or the cumulative
//!   average when unset; the unbiased variance).
//! - Backward: the per-channel sums of `dy` and `dy * (x - mean)` are all-reduced (one collective), which is the
//!   gradient through the global statistics; weight and bias gradients stay local (the prepared model averages
//!   them, as DDP does).
//! - Eval mode (with running statistics) is local, as PyTorch's. One process, or no communicator: BatchNorm.
//!
//! The communicator is the prepared model's: `Accelerator::prepare` hands it to every `SyncBatchNorm` in the model
//! (a `CollectiveModule`). Not part of `<accel/accel.hpp>` (its LibTorch headers cost every translation unit
//! about a second): include `<accel/model/sync_batch_norm.hpp>` where you use it.
//!
//! \code
//! auto net = accel::convert_sync_batchnorm(torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8)));
//! auto model = acc.prepare(net);  // its BatchNorm1d is a SyncBatchNorm now
//! \endcode

#include <accel/comm/communicator.hpp>
#include <accel/error.hpp>
#include <accel/model/distributed_module.hpp>

#include <ATen/ops/cat.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accel {

//! `SyncBatchNorm`'s options: PyTorch's `BatchNorm`'s arguments and defaults.
struct SyncBatchNormOptions {
  std::int64_t num_features = 0;         //!< the channels (C of N, C, ...)
  double eps = 1e-5;                     //!< added to the variance
  std::optional<double> momentum = 0.1;  //!< unset: the cumulative average, as PyTorch's `momentum=None`
  bool affine = true;                    //!< learnable weight and bias
  bool track_running_stats = true;       //!< keep running mean and variance (eval mode uses them)
};

namespace detail {

// The normalisation with given (global) statistics, and its backward through them.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static std::vector<std::int64_t> shape(const at::Tensor& x) {  // [1, C, 1, ...]
    std::vector<std::int64_t> s(std::size_t(x.dim()), 1);
    s[1] = x.size(1);
    return s;
  }
  static std::vector<std::int64_t> dims(const at::Tensor& x) {  // every dimension but the channels
    std::vector<std::int64_t> d{0};
    for (std::int64_t i = 2; i < x.dim(); ++i) d.push_back(i);
    return d;
  }
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& weight, const at::Tensor& bias,
                                                const at::Tensor& mean, const at::Tensor& invstd, std::int64_t count,
                                                std::int64_t comm) {
    const auto s = shape(x);
    at::Tensor y = (x - mean.view(s)) * invstd.view(s);
    if (weight.defined()) y = y * weight.view(s) + bias.view(s);
    ctx->save_for_backward({x, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["comm"] = comm;
    return {y};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const double n = double(ctx->saved_data["count"].toInt());
    auto* comm = reinterpret_cast<comm::Communicator*>(ctx->saved_data["comm"].toInt());
    const at::Tensor& dy = grads[0];
    const auto s = shape(x);
    const auto d = dims(x);
    const at::Tensor xmu = x - mean.view(s);
    const at::Tensor sum_dy = dy.sum(d), sum_dy_xmu = (dy * xmu).sum(d);
    at::Tensor grad_weight, grad_bias;
    if (weight.defined()) grad_weight = sum_dy_xmu * invstd, grad_bias = sum_dy;  // local: the model averages them
    at::Tensor sums = at::cat({sum_dy, sum_dy_xmu});
    comm->all_reduce(sums);  // the gradient through the global statistics
    const std::int64_t C = x.size(1);
    const at::Tensor mean_dy = sums.narrow(0, 0, C) / n, mean_dy_xmu = sums.narrow(0, C, C) / n;
    at::Tensor dx = (dy - mean_dy.view(s) - xmu * (invstd * invstd * mean_dy_xmu).view(s)) * invstd.view(s);
    if (weight.defined()) dx = dx * weight.view(s);
    return {dx, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace detail

//! Batch normalisation with the statistics of the global batch (PyTorch's `SyncBatchNorm`): counts, means and squared
//! deviations all-gathered in one collective, gradients through them in one all-reduce; local in eval mode and in one
//! process. Use it through its holder, `SyncBatchNorm`.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl>, public CollectiveModule {
 public:
  //! A layer with options `o`.
  explicit SyncBatchNormImpl(SyncBatchNormOptions o) : options(o) { reset(); }  // NOLINT
  //! A layer of `num_features` channels, PyTorch's defaults.
  explicit SyncBatchNormImpl(std::int64_t num_features)
      : SyncBatchNormImpl(SyncBatchNormOptions{.num_features = num_features}) {}

  //! (Re)creates the parameters and buffers: weight 1, bias 0, running mean 0, variance 1.
  void reset() override {
    if (options.affine) {
      weight = register_parameter("weight", torch::ones({options.num_features}));
      bias = register_parameter("bias", torch::zeros({options.num_features}));
    }
    if (options.track_running_stats) {
      running_mean = register_buffer("running_mean", torch::zeros({options.num_features}));
      running_var = register_buffer("running_var", torch::ones({options.num_features}));
      num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
    }
  }

  //! The processes whose batches make the statistics (set by `Accelerator::prepare`; none: local BatchNorm).
  void set_communicator(comm::Communicator* c) noexcept override { comm_ = c; }

  //! Normalises `x` (N, C, ...) with the global batch's statistics in training, the running ones in eval mode.
  at::Tensor forward(const at::Tensor& x) {
    detail::require(x.dim() >= 2 && x.size(1) == options.num_features,
                    "accel::SyncBatchNorm: expected an input of shape [batch, " + std::to_string(options.num_features) +
                        ", ...], got " + std::to_string(x.dim()) + " dimensions" +
                        (x.dim() >= 2 ? " with " + std::to_string(x.size(1)) + " channels" : std::string()));
    const bool batch_stats = is_training() || !options.track_running_stats;
    if (!batch_stats || !comm_ || comm_->size() == 1) {
      double momentum = options.momentum.value_or(0.0);
      if (is_training() && options.track_running_stats) {
        torch::NoGradGuard g;
        num_batches_tracked += 1;
        if (!options.momentum) momentum = 1.0 / num_batches_tracked.item<double>();
      }
      return torch::nn::functional::detail::batch_norm(x, running_mean, running_var, weight, bias, batch_stats,
                                                       momentum, options.eps);
    }
    // [torch:nn/modules/_functions.py SyncBatchNorm.forward] The global statistics, from every rank's
    // (count, mean, M2).
    const std::int64_t C = options.num_features;
    at::Tensor mean, var;
    std::int64_t count = 0;
    {
      torch::NoGradGuard g;
      const auto d = detail::SyncBatchNormFunction::dims(x);
      const std::int64_t n = x.numel() / C;
      const at::Tensor xd = x.to(at::kDouble);
      at::Tensor local = at::zeros({1 + 2 * C}, at::TensorOptions().dtype(at::kDouble).device(x.device()));
      local[0] = double(n);
      if (n > 0) {
        const at::Tensor m = xd.mean(d);
        local.narrow(0, 1, C).copy_(m);
        local.narrow(0, 1 + C, C).copy_((xd - m.view(detail::SyncBatchNormFunction::shape(x))).pow(2).sum(d));
      }
      // Merged on the device (Chan): one read of the total count is the only wait for it.
      const at::Tensor all = at::stack(comm_->all_gather(local));  // [ranks, 1 + 2C]
      const at::Tensor counts = all.select(1, 0).unsqueeze(1), means = all.narrow(1, 1, C),
                       m2s = all.narrow(1, 1 + C, C);
      const double total = counts.sum().item<double>();
      detail::require(total > 0, "accel::SyncBatchNorm: no rank has a sample in this batch");
      const at::Tensor total_mean = (means * (counts / total)).sum(0);
      const at::Tensor m2 = (m2s + (means - total_mean).pow(2) * counts).sum(0);
      count = std::int64_t(total);
      mean = total_mean.to(x.scalar_type());
      var = (m2 / total).to(x.scalar_type());
      if (is_training() && options.track_running_stats) {
        num_batches_tracked += 1;
        const double m = options.momentum ? *options.momentum : 1.0 / num_batches_tracked.item<double>();
        running_mean.mul_(1 - m).add_(mean.to(running_mean.scalar_type()) * m);
        const double unbiased = total > 1 ? total / (total - 1) : 1.0;
        running_var.mul_(1 - m).add_((m2 / total * unbiased).to(running_var.scalar_type()) * m);
      }
    }
    const at::Tensor invstd = (var + options.eps).rsqrt();
    return detail::SyncBatchNormFunction::apply(x, weight, bias, mean, invstd, count,
                                                std::int64_t(reinterpret_cast<std::intptr_t>(comm_)))[0];
  }

  SyncBatchNormOptions options;  //!< the layer's settings
  //!@{
  //! The parameters and buffers, PyTorch's BatchNorm's names.
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  //!@}

 private:
  comm::Communicator* comm_ = nullptr;
};
//! The module holder of `SyncBatchNormImpl` (LibTorch's `TORCH_MODULE`), the name a model declares, as it declares
//! `torch::nn::BatchNorm2d`.
TORCH_MODULE(SyncBatchNorm);

namespace detail {
template <class BN>
std::shared_ptr<torch::nn::Module> sync_of(const std::shared_ptr<torch::nn::Module>& m) {
  auto* bn = dynamic_cast<BN*>(m.get());
  if (!bn) return nullptr;
  const auto& o = bn->options;
  auto sync = std::make_shared<SyncBatchNormImpl>(SyncBatchNormOptions{.num_features = o.num_features(),
                                                                       .eps = o.eps(),
                                                                       .momentum = o.momentum(),
                                                                       .affine = o.affine(),
                                                                       .track_running_stats = o.track_running_stats()});
  torch::NoGradGuard g;
  if (o.affine()) sync->weight.copy_(bn->weight), sync->bias.copy_(bn->bias);
  if (o.track_running_stats())
    sync->running_mean.copy_(bn->running_mean), sync->running_var.copy_(bn->running_var),
        sync->num_batches_tracked.copy_(bn->num_batches_tracked);
  sync->train(bn->is_training());
  return sync;
}
}  // namespace detail

// [torch:nn/modules/batchnorm.py SyncBatchNorm.convert_sync_batchnorm]
//! `m` with every BatchNorm1d/2d/3d replaced by a `SyncBatchNorm` holding its weights and statistics: a BatchNorm
//! itself, or containers (`Sequential`, `ModuleList`) of them, to any depth. LibTorch cannot swap a module that
//! another module holds as a member, so a BatchNorm inside a module of your own is an error naming it: declare it
//! as `accel::SyncBatchNorm` there (with one process it is BatchNorm).
inline std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(const std::shared_ptr<torch::nn::Module>& m,
                                                                 const std::string& path = "model") {
  if (auto s = detail::sync_of<torch::nn::BatchNorm1dImpl>(m)) return s;
  if (auto s = detail::sync_of<torch::nn::BatchNorm2dImpl>(m)) return s;
  if (auto s = detail::sync_of<torch::nn::BatchNorm3dImpl>(m)) return s;
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(m.get())) {
    auto out = std::make_shared<torch::nn::SequentialImpl>();
    const auto children = seq->named_children();
    for (std::size_t i = 0; i < seq->size(); ++i) {
      const auto& name = children[i].key();
      auto converted = convert_sync_batchnorm(seq->ptr(i), path + "." + name);
      if (converted == seq->ptr(i))
        out->push_back(name, *(seq->begin() + std::ptrdiff_t(i)));  // the same module
      else if (auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(converted))
        out->push_back(name, torch::nn::AnyModule(sync));
      else
        throw InvalidArgument("accel::convert_sync_batchnorm: " + path + "." + name +
                              " cannot be rebuilt inside a Sequential");
    }
    out->train(seq->is_training());
    return out;
  }
  if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(m.get())) {
    auto out = std::make_shared<torch::nn::ModuleListImpl>();
    for (std::size_t i = 0; i < list->size(); ++i)
      out->push_back(convert_sync_batchnorm(list->ptr(i), path + "." + std::to_string(i)));
    out->train(list->is_training());
    return out;
  }
  for (const auto& c : m->named_modules(path, /*include_self=*/false)) {
    const auto& sub = c.value();
    if (dynamic_cast<torch::nn::BatchNorm1dImpl*>(sub.get()) || dynamic_cast<torch::nn::BatchNorm2dImpl*>(sub.get()) ||
        dynamic_cast<torch::nn::BatchNorm3dImpl*>(sub.get()))
      throw InvalidArgument("accel::convert_sync_batchnorm: " + c.key() +
                            " is a BatchNorm held by a module of your own (" + m->name() +
                            "), which LibTorch cannot swap; declare it as accel::SyncBatchNorm in that module (it is "
                            "BatchNorm in one process), or build the model from Sequential/ModuleList containers");
  }
  return m;  // nothing to convert
}
//! The same for a module holder (`torch::nn::Sequential`, ...): the converted module, as a shared pointer.
template <class Holder>
requires requires(const Holder& h) { h.ptr(); }
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(const Holder& h) {
  return convert_sync_batchnorm(std::static_pointer_cast<torch::nn::Module>(h.ptr()));
}

}  // namespace accel
