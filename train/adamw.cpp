// Flat AdamW (see adamw.h).
#include "train/adamw.h"

#include <fmt/format.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "train/config.h"
#include "train/muon.h"

namespace nanogpt::train {
namespace {

std::vector<std::pair<std::string, torch::Tensor>> named_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : module.named_parameters()) named.emplace_back(item.key(), item.value());
  return named;
}

}  // namespace

FlatAdamW::FlatAdamW(const torch::nn::Module& module, Options options) : FlatAdamW(named_parameters(module), options) {}

FlatAdamW::FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& named_params, Options options)
    : options_(options) {
  groups_[0].weight_decay = options.weight_decay;
  groups_[1].weight_decay = 0.0;
  groups_[2].weight_decay = 0.0;  // Muon: none (its updates have a fixed scale, not the weights')
  for (const auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;
    const bool matrix_in_block = p.dim() == 2 && name.rfind("h.", 0) == 0;
    auto& group = groups_[options.muon && matrix_in_block ? 2 : p.dim() >= 2 ? 0 : 1];
    group.names.push_back(name);
    group.params.push_back(p);
    if (!options_of_params_) options_of_params_ = p.options();
  }
  if (!options_of_params_)
    throw std::runtime_error("[train] the optimizer was given no trainable parameters (is every parameter frozen?)");
  for (auto& group : groups_) flatten(group);
  fused_ = options.fused.value_or(options_of_params_->device().is_cuda());
  const auto f32 = options_of_params_->dtype(torch::kFloat);
  lr_ = torch::zeros({}, f32);
  step_count_ = torch::zeros({}, f32);  // exact to 2^24 steps
}

void FlatAdamW::flatten(Group& group) {
  // Every buffer takes the parameters' device and dtype, an empty group's too: a CPU float32 empty
  // buffer beside CUDA (or float64) parameters breaks the clipping and the loss scaler's kernels.
  const auto options = group.params.empty() ? *options_of_params_ : group.params.front().options();
  if (group.params.empty()) {
    group.flat = group.grad = group.exp_avg = group.exp_avg_sq = torch::empty({0}, options);
    return;
  }
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
  if (on_cpu_fp32()) {  // one dot product per group; the host already holds the answer, so no sync to avoid
    auto norm = (groups_[0].grad.dot(groups_[0].grad) + groups_[1].grad.dot(groups_[1].grad) +
                 groups_[2].grad.dot(groups_[2].grad))
                    .sqrt();
    const double coef = max_norm / (norm.item<double>() + 1e-6);
    if (max_norm > 0.0 && coef < 1.0)
      for (auto& g : groups_) g.grad.mul_(coef);
    return norm;
  }
  auto sq = groups_[0].grad.pow(2).sum() + groups_[1].grad.pow(2).sum() + groups_[2].grad.pow(2).sum();
  auto norm = sq.sqrt();
  if (max_norm > 0.0) {
    auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);  // 0-d, stays on device
    for (auto& g : groups_) g.grad.mul_(coef);
  }
  return norm;
}

void FlatAdamW::set_lr(double lr) {
  lr_value_ = lr;
  lr_.fill_(lr);
}

torch::Tensor FlatAdamW::clip_divisor(double max_norm) const {
  torch::NoGradGuard no_grad;
  auto sq = groups_[0].grad.pow(2).sum() + groups_[1].grad.pow(2).sum() + groups_[2].grad.pow(2).sum();
  // 1 / clip_grad_norm's factor min(1, max_norm / (norm + 1e-6)): the same clipping, as a divisor
  return ((sq.sqrt() + 1e-6) / max_norm).clamp_min(1.0).to(torch::kFloat);
}

int64_t FlatAdamW::steps() const {
  return fused_ ? static_cast<int64_t>(step_count_.item<float>()) : step_;
}

void FlatAdamW::step(double lr) {
  set_lr(lr);
  step(std::nullopt, std::nullopt);
}

void FlatAdamW::step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf) {
  torch::NoGradGuard no_grad;
  if (!fused_) {
    if (found_inf && found_inf->item<float>() != 0.0f) return;  // host read: the unfused update has no flag
    if (grad_scale)
      for (auto& g : groups_) g.grad.div_(*grad_scale);
    loop_step(lr_value_);
    return;
  }
  // ATen's step counts live on the device: counted before the kernel (it reads the count for the
  // bias corrections), and taken back after it where found_inf skipped the step, as PyTorch's
  // optimizers do. Both groups read the one counter.
  step_count_.add_(1);
  Group& muon = groups_[2];
  if (muon.flat.numel() > 0 && !(found_inf && found_inf->item<float>() != 0.0f)) {  // Muon: the flag read here
    if (grad_scale) muon.grad.div_(*grad_scale);
    muon_step(muon, lr_value_ * options_.muon_lr_scale);
  }
  for (int i = 0; i < 2; ++i) {  // the AdamW groups, one flat tensor each
    Group& g = groups_[i];
    if (g.flat.numel() == 0) continue;
    at::_fused_adamw_({g.flat}, {g.grad}, {g.exp_avg}, {g.exp_avg_sq}, /*max_exp_avg_sqs=*/{}, {step_count_}, lr_,
                      options_.beta1, options_.beta2, g.weight_decay, options_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, grad_scale, found_inf);
  }
  if (found_inf) step_count_.sub_(found_inf->reshape({}));
}

void FlatAdamW::loop_step(double lr) {
  ++step_;
  const double bias1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_));
  const double bias2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_));
  if (groups_[2].flat.numel() > 0) muon_step(groups_[2], lr * options_.muon_lr_scale);
  for (int i = 0; i < 2; ++i) {  // the AdamW groups
    Group& g = groups_[i];
    if (g.flat.numel() == 0) continue;
    if (on_cpu_fp32()) {
      fused_step_cpu(g, lr, bias1, bias2);
      continue;
    }
    if (g.weight_decay != 0.0) g.flat.mul_(1.0 - lr * g.weight_decay);   // decoupled weight decay
    g.exp_avg.lerp_(g.grad, 1.0 - options_.beta1);                      // m = β1 m + (1-β1) g
    g.exp_avg_sq.mul_(options_.beta2).addcmul_(g.grad, g.grad, 1.0 - options_.beta2);  // v = β2 v + (1-β2) g²
    auto denom = (g.exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(options_.eps);
    g.flat.addcdiv_(g.exp_avg, denom, -lr / bias1);                     // θ -= lr m̂ / (√v̂ + ε)
  }
}

bool FlatAdamW::on_cpu_fp32() const {
  const auto& flat = groups_[0].flat.numel() > 0 ? groups_[0].flat : groups_[1].flat;
  return flat.device().is_cpu() && flat.scalar_type() == torch::kFloat;
}

namespace {

struct AdamWScalars {
  float decay, b2, one_minus_b1, one_minus_b2, inv_sqrt_bias2, eps, step_size;
};

// Plain loop over restrict pointers: the compiler vectorizes it (-fno-math-errno lets sqrt in).
void adamw_range(float* __restrict theta, const float* __restrict grad, float* __restrict m, float* __restrict v,
                 int64_t begin, int64_t end, const AdamWScalars s) {
  for (int64_t i = begin; i < end; ++i) {
    const float gi = grad[i];
    const float mi = m[i] + s.one_minus_b1 * (gi - m[i]);        // m = β1 m + (1-β1) g
    const float vi = v[i] * s.b2 + s.one_minus_b2 * gi * gi;     // v = β2 v + (1-β2) g²
    const float denom = std::sqrt(vi) * s.inv_sqrt_bias2 + s.eps;  // √v̂ + ε
    theta[i] = theta[i] * s.decay + s.step_size * mi / denom;   // decoupled decay, θ -= lr m̂ / (√v̂ + ε)
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

// The update above as one pass over memory: each value of θ, g, m and v is read once and written
// once, where the kernel-per-operation version streams the buffers eight times. Same formulas.
void FlatAdamW::fused_step_cpu(Group& g, double lr, double bias1, double bias2) {
  float* theta = g.flat.data_ptr<float>();
  const float* grad = g.grad.data_ptr<float>();
  float* m = g.exp_avg.data_ptr<float>();
  float* v = g.exp_avg_sq.data_ptr<float>();
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - lr * g.weight_decay);
  s.b2 = static_cast<float>(options_.beta2);
  s.one_minus_b1 = static_cast<float>(1.0 - options_.beta1);
  s.one_minus_b2 = static_cast<float>(1.0 - options_.beta2);
  s.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  s.eps = static_cast<float>(options_.eps);
  s.step_size = static_cast<float>(-lr / bias1);
  at::parallel_for(0, g.flat.numel(), 1 << 15,
                   [&](int64_t begin, int64_t end) { adamw_range(theta, grad, m, v, begin, end, s); });
}

// Muon (train/muon.h): m = β m + (1-β) g; the Nesterov update u = (1-β) g + β m, orthogonalised
// matrix by matrix (same-shaped ones batched) and scaled by sqrt(max(1, rows / cols)); θ -= lr u.
void FlatAdamW::muon_step(Group& g, double lr) {
  const double beta = options_.muon_momentum;
  g.exp_avg.lerp_(g.grad, 1.0 - beta);
  auto update = g.grad.lerp(g.exp_avg, beta);  // (numel,)
  std::vector<torch::Tensor> updates, weights;  // each parameter's (rows, cols) view of each
  int64_t offset = 0;
  for (const auto& p : g.params) {
    updates.push_back(update.narrow(0, offset, p.numel()).view(p.sizes()));
    weights.push_back(g.flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  const auto orthogonal = orthogonalize_all(updates, options_.muon_dtype);
  for (size_t i = 0; i < weights.size(); ++i) {
    const double rows = static_cast<double>(weights[i].size(0)), cols = static_cast<double>(weights[i].size(1));
    weights[i].add_(orthogonal[i], -lr * std::sqrt(std::max(1.0, rows / cols)));
  }
}

std::vector<torch::Tensor> FlatAdamW::buffers() const {
  std::vector<torch::Tensor> all;
  for (const auto& g : groups_)
    for (const auto* t : {&g.flat, &g.grad, &g.exp_avg, &g.exp_avg_sq}) all.push_back(*t);
  return all;
}

void FlatAdamW::zero_grad() {
  for (auto& g : groups_) g.grad.zero_();
}

std::vector<std::pair<std::string, torch::Tensor>> FlatAdamW::state() const {
  std::vector<std::pair<std::string, torch::Tensor>> state = {{"step", torch::tensor(steps())}};
  const char* tags[2] = {"decay", "no_decay"};
  for (int i = 0; i < 2; ++i) {
    state.emplace_back(std::string("exp_avg.") + tags[i], groups_[i].exp_avg);
    state.emplace_back(std::string("exp_avg_sq.") + tags[i], groups_[i].exp_avg_sq);
  }
  if (groups_[2].flat.numel() > 0) state.emplace_back("momentum.muon", groups_[2].exp_avg);
  return state;
}

void FlatAdamW::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  auto find = [&](const std::string& name) {
    for (const auto& [key, tensor] : state)
      if (key == name && tensor.defined()) return tensor;
    throw std::runtime_error("[ckpt] optimizer state '" + name + "' is missing");
  };
  const torch::Tensor step = find("step");
  if (step.numel() != 1 || step.is_floating_point() || step.scalar_type() == torch::kBool || step.item<int64_t>() < 0)
    throw std::runtime_error("[ckpt] optimizer state 'step' is malformed (expected one non-negative integer)");
  const char* tags[2] = {"decay", "no_decay"};
  std::vector<std::pair<std::string, torch::Tensor*>> expected;
  for (int i = 0; i < 2; ++i) {
    expected.emplace_back(std::string("exp_avg.") + tags[i], &groups_[i].exp_avg);
    expected.emplace_back(std::string("exp_avg_sq.") + tags[i], &groups_[i].exp_avg_sq);
  }
  const bool has_muon = std::any_of(state.begin(), state.end(), [](const auto& kv) { return kv.first == "momentum.muon"; });
  if (has_muon != (groups_[2].flat.numel() > 0))
    throw std::runtime_error(has_muon ? "[ckpt] the checkpoint was trained with optimizer: muon (set it to resume)"
                                      : "[ckpt] the checkpoint was trained with optimizer: adamw (set it to resume)");
  if (has_muon) expected.emplace_back("momentum.muon", &groups_[2].exp_avg);
  std::vector<std::pair<torch::Tensor, torch::Tensor*>> checked;  // all checked before any is copied
  for (auto [name, dst] : expected) {
    const torch::Tensor t = find(name);
    if (t.numel() != dst->numel())
      throw std::runtime_error(fmt::format(
          "[ckpt] optimizer state '{}' has {} values, expected {} (architecture changed?)", name, t.numel(),
          dst->numel()));
    if (!t.is_floating_point()) throw std::runtime_error("[ckpt] optimizer state '" + name + "' is not floating point");
    checked.emplace_back(t, dst);
  }
  torch::NoGradGuard no_grad;
  for (auto& [t, dst] : checked) dst->copy_(t.reshape({-1}));
  step_ = step.item<int64_t>();
  step_count_.fill_(static_cast<double>(step_));
}

FlatAdamW::Options optimizer_options(const TrainConfig& config) {
  FlatAdamW::Options opt;
  opt.weight_decay = config.weight_decay;
  opt.beta1 = config.beta1;
  opt.beta2 = config.beta2;
  opt.muon = config.optimizer == "muon";
  opt.muon_lr_scale = config.muon_learning_rate / config.learning_rate;
  opt.muon_momentum = config.muon_momentum;
  // float16 runs are GPUs without fast bf16: their Newton–Schulz runs in fp32 too
  opt.muon_dtype = config.autocast_dtype() == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat;
  return opt;
}

}  // namespace nanogpt::train
