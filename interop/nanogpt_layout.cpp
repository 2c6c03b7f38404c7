// The nanoGPT layout mapping (see nanogpt_layout.h).
#include "interop/nanogpt_layout.h"
#include "interop/imported_run.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "io/text.h"

namespace nanogpt::interop {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kTorchCompilePrefix = "_orig_mod.";  // torch.compile's wrapper, in nanoGPT's state_dict keys

std::string shape_str(torch::IntArrayRef shape) {
  std::ostringstream o;
  o << shape;
  return o.str();
}

}  // namespace

NanoLayout::NanoLayout(model::GPT& gpt) {
  for (const auto& item : gpt->named_parameters()) {
    Slot slot{item.key(), "transformer." + item.key(), -1, item.value().sizes().vec()};
    for (int part = 0; part < 3; ++part) {
      const std::string proj = std::string(".attn.") + "qkv"[part] + "_proj.";
      const auto at = slot.ours.find(proj);
      if (at == std::string::npos) continue;
      slot.nano = "transformer." + slot.ours.substr(0, at) + ".attn.c_attn." + slot.ours.substr(at + proj.size());
      slot.part = part;
    }
    const auto [it, fresh] = nano_shape_.emplace(slot.nano, slot.shape);
    if (fresh)
      nano_.push_back(slot.nano);
    else
      it->second[0] += slot.shape[0];  // c_attn: q, k and v stacked along the rows
    slots_.push_back(slot);
  }
}

std::vector<std::string> NanoLayout::state_dict_keys() const {
  std::vector<std::string> keys = nano_;
  keys.push_back(kNanoHead);
  return keys;
}

std::vector<std::string> NanoLayout::optimizer_order() const {
  std::vector<std::string> order;
  for (const bool decayed : {true, false})
    for (const auto& name : nano_)
      if ((nano_shape_.at(name).size() >= 2) == decayed) order.push_back(name);
  return order;
}

torch::Tensor NanoLayout::piece(const Slot& slot, const torch::Tensor& whole, const torch::Tensor& order) const {
  if (slot.part >= 0) return whole.narrow(0, slot.part * slot.shape[0], slot.shape[0]);  // nanoGPT: q, k, v = split(C)
  if (slot.nano == kNanoEmbedding && order.defined()) return whole.index_select(0, order);
  return whole;
}

template <typename Ours>
torch::Tensor NanoLayout::assemble(const std::string& nano, const Ours& ours) const {
  std::vector<torch::Tensor> parts;
  for (const auto& slot : slots_)
    if (slot.nano == nano) parts.push_back(ours(slot));
  return (parts.size() == 1 ? parts[0] : torch::cat(parts, 0)).contiguous();
}

void NanoLayout::load_weights(model::GPT& gpt, const std::map<std::string, torch::Tensor>& tensors,
                              const torch::Tensor& order) const {
  std::map<std::string, torch::Tensor> nano;
  for (const auto& [name, tensor] : tensors) {
    if (name.rfind("model:", 0) != 0) continue;
    std::string key = name.substr(std::strlen("model:"));
    if (key.rfind(kTorchCompilePrefix, 0) == 0) key = key.substr(std::strlen(kTorchCompilePrefix));
    if (ends_with(key, ".attn.bias") && !nano_shape_.count(key)) continue;  // the causal mask of the non-flash path
    nano[key] = tensor;
  }
  for (const auto& [key, tensor] : nano) {
    const auto shape = nano_shape_.find(key == kNanoHead ? kNanoEmbedding : key);
    if (shape == nano_shape_.end())
      throw import_error("the checkpoint has '" + key + "', which this model_args does not make (a modified model.py?)");
    if (tensor.sizes() != torch::IntArrayRef(shape->second))
      throw import_error("'" + key + "' has shape " + shape_str(tensor.sizes()) + ", model_args implies " +
                         shape_str(shape->second));
    if (!tensor.is_floating_point()) throw import_error("'" + key + "' is not floating point");
  }
  for (const auto& key : nano_)
    if (!nano.count(key)) throw import_error("the checkpoint lacks '" + key + "' (model_args bias is " +
                                             (nano_shape_.count("transformer.ln_f.bias") ? "true" : "false") + ")");
  if (nano.count(kNanoHead) && !torch::equal(nano.at(kNanoHead), nano.at(kNanoEmbedding)))
    throw import_error("lm_head.weight differs from transformer.wte.weight: an untied output head, which nanoGPT's "
                       "model.py and nanogpt-cpp do not have");
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& item : gpt->named_parameters()) {
    const Slot& slot = slots_[i++];
    item.value().copy_(piece(slot, nano.at(slot.nano), order));
  }
}

void NanoLayout::save_weights(model::GPT& gpt, std::vector<std::pair<std::string, torch::Tensor>>& tensors) const {
  std::map<std::string, torch::Tensor> ours;
  for (const auto& item : gpt->named_parameters()) ours[item.key()] = item.value().detach().to(torch::kCPU, torch::kFloat);
  for (const auto& key : nano_)
    tensors.emplace_back("model:" + key, assemble(key, [&](const Slot& slot) { return ours.at(slot.ours); }));
}

bool NanoLayout::load_moments(train::FlatAdamW& optimizer, const Json& state,
                              const std::map<std::string, torch::Tensor>& tensors, const torch::Tensor& order,
                              std::vector<std::string>& notes) const {
  auto skip = [&](const std::string& why) {
    notes.push_back("AdamW state not carried over (" + why + "): the optimizer starts afresh");
    return false;
  };
  if (!state.is_object()) return skip("the checkpoint has none");
  const Json groups = state.value("param_groups", Json());
  const Json steps = state.value("steps", Json());
  if (!groups.is_array() || groups.size() != 2 || !steps.is_object())
    return skip("expected nanoGPT's two parameter groups (decayed weights, the rest)");
  const std::vector<std::string> names = optimizer_order();
  const size_t decayed = static_cast<size_t>(std::count_if(
      names.begin(), names.end(), [&](const std::string& name) { return nano_shape_.at(name).size() >= 2; }));
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> moments;  // nanoGPT's parameter -> (m, v)
  std::optional<double> step;
  size_t next = 0;
  for (size_t g = 0; g < 2; ++g) {
    const Json params = groups[g].is_object() ? groups[g].value("params", Json()) : Json();
    if (!params.is_array() || params.size() != (g == 0 ? decayed : names.size() - decayed))
      return skip("its parameter groups are not the decayed weights and the rest of this model_args");
    for (const Json& id : params) {
      if (!id.is_number_integer()) return skip("a parameter id is not an integer");
      const std::string& name = names[next++];
      const std::string pid = id.dump();
      const auto m = tensors.find("optimizer:" + pid + ":exp_avg"), v = tensors.find("optimizer:" + pid + ":exp_avg_sq");
      if (m == tensors.end() || v == tensors.end()) return skip("parameter " + pid + " has no exp_avg and exp_avg_sq");
      const torch::IntArrayRef shape(nano_shape_.at(name));
      if (m->second.sizes() != shape || v->second.sizes() != shape || !m->second.is_floating_point() ||
          !v->second.is_floating_point())
        return skip("the moments of parameter " + pid + " have shape " + shape_str(m->second.sizes()) + ", " + name +
                    " has " + shape_str(shape));
      const Json count = steps.value(pid, Json());
      if (!count.is_number() || (step && *step != count.get<double>()))
        return skip("the parameters do not share one step count");
      step = count.get<double>();
      moments[name] = {m->second.to(torch::kFloat), v->second.to(torch::kFloat)};
    }
  }
  if (!step || *step < 0 || *step != std::floor(*step)) return skip("the step count is not a whole number");

  std::map<std::string, const Slot*> slot_of;
  for (const auto& slot : slots_) slot_of[slot.ours] = &slot;
  auto flat = [&](const std::vector<std::string>& ours, bool second) {
    std::vector<torch::Tensor> parts;
    for (const auto& name : ours) {
      const Slot& slot = *slot_of.at(name);
      const auto& [m, v] = moments.at(slot.nano);
      parts.push_back(piece(slot, second ? v : m, order).reshape({-1}));
    }
    return parts.empty() ? torch::zeros({0}) : torch::cat(parts);
  };
  optimizer.load_state({{"step", torch::tensor(static_cast<int64_t>(*step))},
                        {"exp_avg.decay", flat(optimizer.decay_names(), false)},
                        {"exp_avg_sq.decay", flat(optimizer.decay_names(), true)},
                        {"exp_avg.no_decay", flat(optimizer.no_decay_names(), false)},
                        {"exp_avg_sq.no_decay", flat(optimizer.no_decay_names(), true)}});
  return true;
}

Json NanoLayout::save_moments(const train::FlatAdamW& optimizer, const train::TrainConfig& config,
                              std::vector<std::pair<std::string, torch::Tensor>>& tensors) const {
  std::map<std::string, torch::Tensor> flat;
  for (const auto& [name, tensor] : optimizer.state()) flat[name] = tensor.to(torch::kCPU, torch::kFloat);
  std::map<std::string, const Slot*> slot_of;
  for (const auto& slot : slots_) slot_of[slot.ours] = &slot;
  std::map<std::string, std::pair<torch::Tensor, torch::Tensor>> ours;  // our parameter -> (m, v), shaped
  for (const auto& [names, group] : {std::pair{&optimizer.decay_names(), "decay"}, {&optimizer.no_decay_names(), "no_decay"}}) {
    int64_t offset = 0;
    for (const auto& name : *names) {
      const auto& shape = slot_of.at(name)->shape;
      const int64_t n = c10::multiply_integers(shape);
      ours[name] = {flat.at(std::string("exp_avg.") + group).narrow(0, offset, n).view(shape),
                    flat.at(std::string("exp_avg_sq.") + group).narrow(0, offset, n).view(shape)};
      offset += n;
    }
  }
  const std::vector<std::string> names = optimizer_order();
  Json decayed = Json::array(), rest = Json::array(), steps = Json::object();
  for (size_t id = 0; id < names.size(); ++id) {
    const std::string pid = std::to_string(id);
    tensors.emplace_back("optimizer:" + pid + ":exp_avg", assemble(names[id], [&](const Slot& s) { return ours.at(s.ours).first; }));
    tensors.emplace_back("optimizer:" + pid + ":exp_avg_sq", assemble(names[id], [&](const Slot& s) { return ours.at(s.ours).second; }));
    steps[pid] = optimizer.steps();
    (nano_shape_.at(names[id]).size() >= 2 ? decayed : rest).push_back(id);
  }
  auto group = [&](const Json& params, double weight_decay) {
    return Json{{"params", params}, {"lr", config.learning_rate}, {"betas", Json::array({config.beta1, config.beta2})},
                {"eps", train::FlatAdamW::Options{}.eps}, {"weight_decay", weight_decay}};
  };
  return Json{{"param_groups", Json::array({group(decayed, config.weight_decay), group(rest, 0.0)})}, {"steps", steps}};
}

}  // namespace nanogpt::interop
