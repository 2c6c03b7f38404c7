// Flat AdamW (see adamw.h).
#include "train/adamw.h"

#include <cmath>
#include <stdexcept>

namespace nanogpt::train {

FlatAdamW::FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& named_params, Options options)
    : options_(options) {
  groups_[0].weight_decay = options.weight_decay;
  groups_[1].weight_decay = 0.0;
  for (const auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;
    auto& group = groups_[p.dim() >= 2 ? 0 : 1];
    group.names.push_back(name);
    group.params.push_back(p);
  }
  for (auto& group : groups_) flatten(group);
}

void FlatAdamW::flatten(Group& group) {
  if (group.params.empty()) {
    group.flat = group.grad = group.exp_avg = group.exp_avg_sq = torch::empty({0});
    return;
  }
  const auto options = group.params.front().options();
  int64_t total = 0;
  for (const auto& p : group.params) total += p.numel();
  torch::NoGradGuard no_grad;
  group.flat = torch::empty({total}, options);
  group.grad = torch::zeros({total}, options);
  int64_t offset = 0;
  for (auto& p : group.params) {
    const int64_t n = p.numel();
    auto slot = group.flat.narrow(0, offset, n);
    slot.copy_(p.reshape({n}));
    p.set_data(slot.view(p.sizes()));                                // the parameter now lives in `flat`
    p.mutable_grad() = group.grad.narrow(0, offset, n).view(p.sizes());  // autograd accumulates in place
    offset += n;
  }
  group.exp_avg = torch::zeros_like(group.flat);
  group.exp_avg_sq = torch::zeros_like(group.flat);
}

torch::Tensor FlatAdamW::clip_grad_norm(double max_norm) {
  torch::NoGradGuard no_grad;
  auto sq = groups_[0].grad.pow(2).sum() + groups_[1].grad.pow(2).sum();
  auto norm = sq.sqrt();
  if (max_norm > 0.0) {
    auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);  // 0-d, stays on device
    for (auto& g : groups_) g.grad.mul_(coef);
  }
  return norm;
}

void FlatAdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  for (auto& g : groups_) {
    if (g.flat.numel() == 0) continue;
    if (g.weight_decay != 0.0) g.flat.mul_(1.0 - lr * g.weight_decay);   // decoupled weight decay
    g.exp_avg.lerp_(g.grad, 1.0 - options_.beta1);                      // m = β1 m + (1-β1) g
    g.exp_avg_sq.mul_(options_.beta2).addcmul_(g.grad, g.grad, 1.0 - options_.beta2);  // v = β2 v + (1-β2) g²
    auto denom = (g.exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(options_.eps);
    g.flat.addcdiv_(g.exp_avg, denom, -lr / bias1);                     // θ -= lr m̂ / (√v̂ + ε)
  }
}

void FlatAdamW::zero_grad() {
  for (auto& g : groups_) g.grad.zero_();
}

void FlatAdamW::save(torch::serialize::OutputArchive& archive) const {
  archive.write("step", torch::tensor(step_));
  const char* tags[2] = {"decay", "no_decay"};
  for (int i = 0; i < 2; ++i) {
    archive.write(std::string("exp_avg.") + tags[i], groups_[i].exp_avg);
    archive.write(std::string("exp_avg_sq.") + tags[i], groups_[i].exp_avg_sq);
  }
}

void FlatAdamW::load(torch::serialize::InputArchive& archive) {
  torch::Tensor step;
  archive.read("step", step);
  if (!step.defined() || step.numel() != 1) throw std::runtime_error("[ckpt] optimizer 'step' is missing or malformed");
  const char* tags[2] = {"decay", "no_decay"};
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 2; ++i)
    for (auto [name, dst] : {std::pair<std::string, torch::Tensor*>{std::string("exp_avg.") + tags[i], &groups_[i].exp_avg},
                             {std::string("exp_avg_sq.") + tags[i], &groups_[i].exp_avg_sq}}) {
      torch::Tensor t;
      archive.read(name, t);
      if (t.numel() != dst->numel())
        throw std::runtime_error("[ckpt] optimizer state '" + name + "' has " + std::to_string(t.numel()) +
                                 " values, expected " + std::to_string(dst->numel()) + " (architecture changed?)");
      dst->copy_(t.reshape({-1}));
    }
  step_ = step.item<int64_t>();
}

}  // namespace nanogpt::train
