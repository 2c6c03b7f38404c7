// The decoder's copy of the model's weights (see decoder.h): which models it can run, and the walk
// over the parameters (lay_out) that first measures and then fills its few allocations, each matrix
// on a 64-byte line: the norms and biases in fp32, and each weight matrix as the step multiplies it:
// the blocks' in fp32 or bf16 panels, the embeddings and the head in rows (fp32, or bf16 under
// autocast), or quantized, to int8 rows or (the blocks', with int4) to int4 tiles.
#include "model/fast/decoder.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "model/fast/decode_attention.h"
#include "model/fast/dot.h"

namespace nanogpt::model {

bool decoder_supports(const GPTImpl& model) {
  if (model.is_training() || torch::GradMode::is_enabled()) return false;
  if (at::autocast::is_autocast_enabled(at::kCPU) && at::autocast::get_autocast_dtype(at::kCPU) != at::kBFloat16)
    return false;
  for (const auto& p : model.parameters())
    if (!p.device().is_cpu() || p.scalar_type() != torch::kFloat) return false;
  return true;
}

Decoder::Decoder(GPTImpl& model, Quantize quantize)
    : config_(model.config()),
      C_(config_.n_embd),
      hs_(config_.head_size()),
      nkv_(config_.kv_heads()),
      qkv_width_((config_.n_head + 2 * config_.kv_heads()) * config_.head_size()),
      fc_out_(config_.mlp == "swiglu" ? 2 * config_.mlp_hidden() : config_.mlp_hidden()),
      hidden_(config_.mlp_hidden()),
      rms_(config_.norm == "rmsnorm"),
      activation_(config_.mlp == "swiglu"      ? Activation::swiglu
                   : config_.mlp == "relu2"     ? Activation::relu2
                   : config_.mlp == "gelu_tanh" ? Activation::gelu_tanh
                                            : Activation::gelu),
      bf16_(at::autocast::is_autocast_enabled(at::kCPU)),
      quantize_(quantize),
      kv_int8_(quantize != Quantize::none && int8_kv_supported(config_.head_size())),
      unit_(quantize == Quantize::int4                                        ? kInt4Tile
            : quantize == Quantize::none && (!bf16_ || bf16_panels_supported()) ? kPanel
                                                                                 : kRowBlock) {
  if (!decoder_supports(model))
    throw std::invalid_argument(
        "[model] the hand-written decoder needs an fp32 model on the CPU in eval mode, without autograd, and CPU "
        "autocast off or in bf16");
  torch::NoGradGuard no_grad;
  lay_out(model);  // measures
  packed_ = torch::empty({packed_size_}, torch::kFloat);
  if (packed_bf16_size_ > 0) packed_bf16_ = torch::empty({packed_bf16_size_}, torch::kBFloat16);
  if (packed_int8_size_ > 0) packed_int8_ = torch::empty({packed_int8_size_}, torch::kByte);
  packed_size_ = packed_bf16_size_ = packed_int8_size_ = 0;
  lay_out(model);  // copies
  if (config_.pos_encoding == "sinusoidal") sinusoid_ = sinusoidal_table(config_.block_size, C_);
  if (config_.pos_encoding == "rope") rope_ = std::make_unique<Rope>(config_.block_size, hs_, config_.rope_base);
}

namespace {

// Places t, flattened and converted to `buffer`'s dtype by LibTorch's copy (its rounding, as
// autocast's cast), at element `size` of `buffer`, and moves `size` on to the next 64-byte line.
// While measuring (buffer undefined) it only counts and returns nullptr; nullptr for an undefined t.
void* place(torch::Tensor& buffer, int64_t& size, const torch::Tensor& t, torch::ScalarType dtype) {
  if (!t.defined()) return nullptr;
  const int64_t offset = size, n = t.numel(), line = 64 / static_cast<int64_t>(c10::elementSize(dtype));
  size += (n + line - 1) / line * line;  // every matrix starts on a 64-byte line
  if (!buffer.defined()) return nullptr;
  auto dst = buffer.narrow(0, offset, n);
  dst.copy_(t.detach().reshape({-1}));
  return dst.data_ptr();
}

}  // namespace

const float* Decoder::pack(const torch::Tensor& t) {
  return static_cast<const float*>(place(packed_, packed_size_, t, torch::kFloat));
}

Decoder::Matrix Decoder::pack_matrix(const torch::Tensor& t, bool in_block) {
  if (quantize_ == Quantize::int4 && in_block) {
    if (!t.defined()) return {};
    const int64_t rows = t.size(0), cols = t.size(1);
    if (!packed_int8_.defined()) {  // measuring
      packed_int8_size_ += int4_bytes(rows, cols);  // whole 64-byte lines (kInt4GroupBytes is)
      return {};
    }
    const auto w = t.detach().to(torch::kFloat).contiguous();
    Matrix m;
    m.int4 = {packed_int8_.data_ptr<uint8_t>() + packed_int8_size_, rows, cols};
    quantize_int4(w.data_ptr<float>(), rows, cols, packed_int8_.data_ptr<uint8_t>() + packed_int8_size_);
    packed_int8_size_ += int4_bytes(rows, cols);
    return m;
  }
  if (quantize_ != Quantize::none) {
    if (!t.defined()) return {};
    if (!packed_int8_.defined()) {  // measuring: the bytes, and a scale a row
      place(packed_int8_, packed_int8_size_, t, torch::kByte);
      place(packed_, packed_size_, t.select(1, 0), torch::kFloat);
      return {};
    }
    const auto w = t.detach().to(torch::kFloat).contiguous();
    auto q = torch::empty(w.sizes(), torch::kByte);
    auto scale = torch::empty({w.size(0)}, torch::kFloat);
    quantize_rows_int8(w.data_ptr<float>(), w.size(0), w.size(1), q.data_ptr<uint8_t>(), scale.data_ptr<float>());
    Matrix m;
    m.int8.q = static_cast<const uint8_t*>(place(packed_int8_, packed_int8_size_, q, torch::kByte));
    m.int8.scale = static_cast<const float*>(place(packed_, packed_size_, scale, torch::kFloat));
    return m;
  }
  Matrix m;
  if (!bf16_ && in_block && t.defined()) {  // panels of kPanel rows (dot.h's F32Panels)
    const int64_t rows = t.size(0), cols = t.size(1), padded = (rows + kPanel - 1) / kPanel * kPanel;
    if (!packed_.defined()) {  // measuring: only the size (an untouched allocation)
      place(packed_, packed_size_, torch::empty({padded, cols}, torch::kFloat), torch::kFloat);
      return m;
    }
    auto w = torch::zeros({padded, cols}, torch::kFloat);
    w.narrow(0, 0, rows).copy_(t.detach());
    const auto panels = w.view({padded / kPanel, kPanel, cols}).permute({0, 2, 1}).contiguous();
    m.panels = {static_cast<const float*>(place(packed_, packed_size_, panels, torch::kFloat)), rows, cols};
    return m;
  }
  if (bf16_ && in_block && t.defined() && bf16_panels_supported()) {  // dot.h's Bf16Panels
    const int64_t rows = t.size(0), cols = t.size(1), padded = (rows + kPanel - 1) / kPanel * kPanel;
    const int64_t npairs = bf16_panel_pairs(cols);
    if (!packed_bf16_.defined()) {  // measuring: only the size (an untouched allocation)
      place(packed_bf16_, packed_bf16_size_, torch::empty({padded * 2 * npairs}, torch::kBFloat16), torch::kBFloat16);
      return m;
    }
    auto w = torch::zeros({padded, 2 * npairs}, torch::kFloat);
    w.narrow(0, 0, rows).narrow(1, 0, cols).copy_(t.detach());
    // (panel, pair, row in the panel, column of the pair), rounded as autocast rounds the weights
    const auto panels = w.to(torch::kBFloat16).view({padded / kPanel, kPanel, npairs, 2}).permute({0, 2, 1, 3}).contiguous();
    m.bf16_panels = {static_cast<const uint16_t*>(place(packed_bf16_, packed_bf16_size_, panels, torch::kBFloat16)),
                     rows, cols};
    return m;
  }
  if (!bf16_) m.f32 = pack(t);
  else m.bf16 = static_cast<const uint16_t*>(place(packed_bf16_, packed_bf16_size_, t, torch::kBFloat16));
  return m;
}

void Decoder::lay_out(GPTImpl& model) {
  const auto params = model.named_parameters();
  auto get = [&](const std::string& name) {
    const auto* t = params.find(name);
    return t ? *t : torch::Tensor();
  };
  auto cat = [&](const std::string& prefix, const std::string& what) {  // [q; k; v] as the general path
    auto q = get(prefix + "q_proj." + what);
    return q.defined() ? torch::cat({q, get(prefix + "k_proj." + what), get(prefix + "v_proj." + what)}) : q;
  };
  wte_ = pack_matrix(get("wte.weight"));
  wpe_ = pack_matrix(get("wpe.weight"));
  layers_.assign(config_.n_layer, Layer{});
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const std::string p = fmt::format("h.{}.", i);
    Layer& l = layers_[i];
    l.ln_1_w = pack(get(p + "ln_1.weight"));
    l.ln_1_b = pack(get(p + "ln_1.bias"));
    l.qkv_w = pack_matrix(cat(p + "attn.", "weight"), true);
    l.qkv_b = pack(cat(p + "attn.", "bias"));
    l.o_w = pack_matrix(get(p + "attn.c_proj.weight"), true);
    l.o_b = pack(get(p + "attn.c_proj.bias"));
    l.ln_2_w = pack(get(p + "ln_2.weight"));
    l.ln_2_b = pack(get(p + "ln_2.bias"));
    const auto fc = get(p + "mlp.c_fc.weight");
    if (activation_ == Activation::swiglu) {  // two matrices: each thread's rows of both halves
      l.fc_w = pack_matrix(fc.narrow(0, 0, hidden_), true);
      l.fc_up_w = pack_matrix(fc.narrow(0, hidden_, hidden_), true);
    } else {
      l.fc_w = pack_matrix(fc, true);
    }
    l.fc_b = pack(get(p + "mlp.c_fc.bias"));
    l.proj_w = pack_matrix(get(p + "mlp.c_proj.weight"), true);
    l.proj_b = pack(get(p + "mlp.c_proj.bias"));
  }
  ln_f_w_ = pack(get("ln_f.weight"));
  ln_f_b_ = pack(get("ln_f.bias"));
  auto lm_head = get("lm_head.weight");
  head_ = lm_head.defined() ? pack_matrix(lm_head) : wte_;  // tied: the head is wte
}

}  // namespace nanogpt::model
