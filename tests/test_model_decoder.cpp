// The hand-written one-token decoder (model/fast/decoder.h) against the general path
// (GPT::forward_cached): the same logits and the same cache across the architecture's switches,
// batches of 1 and 3, past block_size with RoPE; the same tokens from generate and beam search
// either way; under CPU bf16 autocast, as close to the fp32 model as the general path under
// autocast; with int8 or int4 matrices (and the int8 KV cache), within a few (int4: ten or so)
// percent; bad input rejected. And the matrix-vector product on its own, in fp32, bf16, int8 and
// int4; and the other hand-written CPU kernels whose code differs by kernel set (decode attention,
// with either cache, and GELU), which the build runs again under each narrower NANOGPT_KERNELS.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/fast/decode_attention.h"
#include "model/fast/decoder.h"
#include "model/fast/dot.h"
#include "model/fast/gelu.h"
#include "model/generate.h"
#include "runtime/device.h"

using namespace nanogpt::model;

namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 24;  // head size 12: not a multiple of the 16-float lanes, so the tails run too
  return c;
}

// Every weight perturbed (biases and norms included, which start at 0 and 1), queries and keys
// scaled up so that attention is peaked and which positions it sees matters (×3: at ×10 the scores
// are so large that fp32 rounding in them alone moves the logits by 1e-5 relative, either path).
GPT perturbed_model(const ModelConfig& c) {
  torch::manual_seed(0);
  GPT model(c);
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    p.value().add_(torch::randn_like(p.value()) * 0.1);
    if (p.key().find("q_proj") != std::string::npos || p.key().find("k_proj") != std::string::npos) p.value().mul_(3);
  }
  model->eval();
  return model;
}

// The switches, one at a time from the default (RoPE, layernorm, no bias, gelu, MHA, tied).
std::vector<std::pair<std::string, std::function<void(ModelConfig&)>>> variants() {
  return {
      {"default", [](ModelConfig&) {}},
      {"learned", [](ModelConfig& c) { c.pos_encoding = "learned"; }},
      {"sinusoidal", [](ModelConfig& c) { c.pos_encoding = "sinusoidal"; }},
      {"rmsnorm", [](ModelConfig& c) { c.norm = "rmsnorm"; }},
      {"bias", [](ModelConfig& c) { c.bias = true; }},
      {"relu2", [](ModelConfig& c) { c.mlp = "relu2"; }},
      {"swiglu", [](ModelConfig& c) { c.mlp = "swiglu"; }},
      {"qk_norm", [](ModelConfig& c) { c.qk_norm = true; }},
      {"gqa", [](ModelConfig& c) {
         c.n_head = 4;
         c.n_kv_head = 2;
       }},
      {"untied", [](ModelConfig& c) { c.tie_embeddings = false; }},
      {"softcap", [](ModelConfig& c) { c.logit_softcap = 3.0; }},
      {"wide", [](ModelConfig& c) {  // rows in many blocks of four per thread
         c.n_embd = 128;
         c.n_head = 4;
       }},
      {"everything", [](ModelConfig& c) {
         c.bias = true;
         c.norm = "rmsnorm";
         c.mlp = "swiglu";
         c.qk_norm = true;
         c.n_head = 4;
         c.n_kv_head = 1;
         c.tie_embeddings = false;
         c.logit_softcap = 5.0;
         c.n_embd = 48;  // swiglu hidden 128
       }},
  };
}

// max |a - b| <= rtol * max |b| (and a floor for all-tiny logits).
void expect_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what, double rtol = 1e-5) {
  const double err = (a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max().item<double>(),
               scale = b.to(torch::kFloat).abs().max().item<double>();
  EXPECT_LE(err, rtol * scale + rtol / 10) << what << ": max error " << err << " for logits up to " << scale;
}

}  // namespace

TEST(Decoder, LogitsAndCacheEqualTheGeneralPathAcrossTheSwitches) {
  c10::InferenceMode inference;
  for (const auto& [name, tweak] : variants()) {
    ModelConfig c = tiny_config();
    tweak(c);
    // ctest runs with one thread; here the decoder gets two (its first 16 steps alternate in pairs
    // between one thread and both, so every variant runs both ways: rows and kv heads split
    // between the threads of one parallel region, and everything on one).
    const int threads = 2;
    GPT model = perturbed_model(c);
    ASSERT_TRUE(decoder_supports(*model)) << name;
    Decoder decoder(*model);
    const bool slides = c.pos_encoding == "rope";
    for (int64_t B : {1, 3}) {
      torch::manual_seed(B);
      const int64_t prompt = 3, steps = slides ? 3 * c.block_size : c.block_size - prompt;  // RoPE: well past block_size
      auto tokens = torch::randint(c.vocab_size, {B, prompt + steps}, torch::kLong);  // (B, prompt + steps)
      KVCache general = model->make_cache(), fast = model->make_cache(), mixed = model->make_cache();
      for (auto* cache : {&general, &fast, &mixed}) model->forward_cached(tokens.narrow(1, 0, prompt), *cache);
      for (int64_t s = 0; s < steps; ++s) {
        const std::string what = name + ", B " + std::to_string(B) + ", position " + std::to_string(prompt + s);
        auto next = tokens.select(1, prompt + s);                        // (B,)
        auto want = model->forward_cached(next.unsqueeze(1), general);  // (B, V)
        at::set_num_threads(threads);
        auto got = decoder.step(next, fast);  // (B, V)
        // A cache filled by either path goes on with the other.
        auto alternating = s % 2 ? decoder.step(next, mixed) : model->forward_cached(next.unsqueeze(1), mixed);
        at::set_num_threads(1);
        ASSERT_EQ(got.sizes(), want.sizes()) << what;
        expect_close(got, want, what);
        expect_close(alternating, want, what + " (alternating)");
        ASSERT_EQ(fast.length(), general.length()) << what;
      }
      for (int64_t l = 0; l < c.n_layer; ++l) {
        expect_close(fast.k[l], general.k[l], name + " keys");
        expect_close(fast.v[l], general.v[l], name + " values");
      }
    }
  }
}

// Under CPU bf16 autocast the decoder's products take bf16 weights and x rounded to bf16 (autocast's
// inputs), summed in fp32 (matvec_rows; MatvecRows below holds it to that exactly). Over the whole
// model: its logits, and its keys and values (a bf16 cache, as autocast's), are no farther from the
// fp32 model's than those of the general path under autocast, which rounds the same inputs and
// every product's output as well (root mean square over all steps, with a margin for chance), also
// when it goes on from a cache the general path filled under autocast.
TEST(Decoder, Bf16ProductsStayAsCloseToTheFp32ModelAsAutocast) {
  c10::InferenceMode inference;
  auto copy = [](const KVCache& cache) {
    KVCache c = cache;
    for (auto* layer : {&c.k, &c.v})
      for (auto& t : *layer) t = t.clone();
    return c;
  };
  auto squared_error = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kDouble) - b.to(torch::kDouble)).square().sum().item<double>();
  };
  for (const auto& [name, tweak] : variants()) {
    ModelConfig c = tiny_config();
    tweak(c);
    GPT model = perturbed_model(c);
    std::unique_ptr<Decoder> decoder;
    {
      nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
      ASSERT_TRUE(decoder_supports(*model)) << name;
      decoder = std::make_unique<Decoder>(*model);
    }
    ASSERT_TRUE(decoder->bf16_weights()) << name;
    const int64_t B = 2, prompt = 3, steps = c.pos_encoding == "rope" ? 2 * c.block_size : c.block_size - prompt;
    torch::manual_seed(11);
    auto tokens = torch::randint(c.vocab_size, {B, prompt + steps}, torch::kLong);  // (B, prompt + steps)
    auto head = tokens.narrow(1, 0, prompt);
    KVCache exact = model->make_cache(), autocast_general = model->make_cache();
    model->forward_cached(head, exact);
    KVCache fast = copy(exact);
    {
      nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
      model->forward_cached(head, autocast_general);
    }
    KVCache continued = copy(autocast_general), continued_exact = copy(autocast_general);
    double decoder_error = 0.0, continued_error = 0.0, autocast_error = 0.0;  // sums of squares
    for (int64_t s = 0; s < steps; ++s) {
      auto next = tokens.select(1, prompt + s), next_column = next.unsqueeze(1);  // (B,), (B, 1)
      auto fp32 = model->forward_cached(next_column, exact);
      auto fp32_continued = model->forward_cached(next_column, continued_exact);
      at::set_num_threads(2);  // both ways of the decoder's thread trial, as above
      auto got = decoder->step(next, fast);
      auto got_continued = decoder->step(next, continued);
      at::set_num_threads(1);
      nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, true);
      auto general = model->forward_cached(next_column, autocast_general);  // (B, V) bf16
      decoder_error += squared_error(got, fp32);
      continued_error += squared_error(got_continued, fp32_continued);
      autocast_error += squared_error(general, fp32);
    }
    EXPECT_GT(decoder_error, 0.0) << name << ": bf16 products change the logits";
    // Measured over the variants: logits 0.66-1.04x autocast's root mean square error; one layer's
    // keys or values (a few hundred numbers, both rounded to bf16 in either cache) 0.69-1.36x.
    EXPECT_LE(std::sqrt(decoder_error), 1.5 * std::sqrt(autocast_error)) << name << ": distance from the fp32 logits";
    EXPECT_LE(std::sqrt(continued_error), 1.5 * std::sqrt(autocast_error))
        << name << ": the same, from autocast's cache";
    for (int64_t l = 0; l < c.n_layer; ++l)
      for (auto [got, want, general, what] : {std::tuple{fast.k[l], exact.k[l], autocast_general.k[l], "keys"},
                                              std::tuple{fast.v[l], exact.v[l], autocast_general.v[l], "values"}})
        EXPECT_LE(std::sqrt(squared_error(got, want)), 2.0 * std::sqrt(squared_error(general, want)))
            << name << ", layer " << l << " " << what;
  }
}

// The decoder's matrix-vector product on its own, against LibTorch in fp64: fp32 weights and x, and
// bf16 weights with x rounded to bf16 first, each product exact and the sums fp32 (to 1e-6 of the
// sum of the products' magnitudes; an unrounded x falls outside it). Row counts that leave a partial
// block of four, column counts that leave partial steps of 16 and 32 (the bf16 dot product's),
// strided x and y, a range of rows, accumulating or not. ctest runs it on each kernel the CPU has
// (NANOGPT_KERNELS).
TEST(MatvecRows, ProductsAreExactAndSumsFp32InEitherDtype) {
  torch::manual_seed(5);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {5, 33}, {13, 64}, {37, 100}, {64, 384}, {9, 1536}})
    for (int64_t B : {1, 3})
      for (bool accumulate : {false, true})
        for (bool bf16 : {false, true}) {
          const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + ", B " + std::to_string(B) +
                                   (accumulate ? ", accumulating" : "") + (bf16 ? ", bf16" : ", fp32");
          const int64_t x_stride = cols + 3, y_stride = rows + 2;
          const int64_t r0 = rows > 2 ? 1 : 0, r1 = rows > 2 ? rows - 1 : rows;
          auto w = torch::randn({rows, cols});
          if (bf16) w = w.to(torch::kBFloat16);
          auto x = torch::randn({B, x_stride});  // the first cols of each row are x
          auto y = torch::randn({B, y_stride});
          auto y0 = y.clone();
          if (bf16)
            matvec_rows(reinterpret_cast<const uint16_t*>(w.data_ptr<c10::BFloat16>()), x.data_ptr<float>(), x_stride,
                        B, cols, r0, r1, y.data_ptr<float>(), y_stride, accumulate);
          else
            matvec_rows(w.data_ptr<float>(), x.data_ptr<float>(), x_stride, B, cols, r0, r1, y.data_ptr<float>(),
                        y_stride, accumulate);
          auto xs = x.narrow(1, 0, cols), wd = w.narrow(0, r0, r1 - r0).to(torch::kDouble);  // (B, cols), (r, cols)
          auto xd = (bf16 ? xs.to(torch::kBFloat16) : xs).to(torch::kDouble);
          auto before = accumulate ? y0.narrow(1, r0, r1 - r0).to(torch::kDouble)
                                   : torch::zeros({B, r1 - r0}, torch::kDouble);  // y's rows before
          auto want = before + xd.mm(wd.t());                            // (B, r1 - r0)
          auto magnitude = before.abs() + xd.abs().mm(wd.abs().t());     // |y| + the sum of |products|
          auto got = y.narrow(1, r0, r1 - r0).to(torch::kDouble);
          EXPECT_LE(((got - want).abs() - 1e-6 * magnitude).max().item<double>(), 0.0) << what;
          // the rows outside [r0, r1) untouched
          EXPECT_TRUE(y.narrow(1, 0, r0).equal(y0.narrow(1, 0, r0))) << what;
          EXPECT_TRUE(y.narrow(1, r1, y_stride - r1).equal(y0.narrow(1, r1, y_stride - r1))) << what;
          if (bf16 && cols >= 33) {  // the test can tell: unrounded x is farther than the tolerance
            auto unrounded = before + xs.to(torch::kDouble).mm(wd.t());
            EXPECT_GT(((unrounded - want).abs() - 1e-6 * magnitude).max().item<double>(), 0.0) << what;
          }
        }
}

// The quantized products' inputs, each row of xs (B, cols) by its own max |x| / 127: the scales
// (B, 1) in fp32, as the kernels compute them, and the integers in fp64 (round half to even, as
// nearbyint).
namespace {
std::pair<torch::Tensor, torch::Tensor> int8_inputs(const torch::Tensor& xs) {
  auto scale = xs.abs().amax(1, true) / 127;
  return {scale, (xs / scale).round().to(torch::kDouble)};
}
}  // namespace

// Int8 weights, as dynamic quantization: each row of w within half its scale of the original and
// its largest weight at ±127; the product against the same arithmetic in fp64 through LibTorch
// (x quantized by its own max |x| / 127, the integer products summed, both scales applied) to fp32's
// rounding of the result; a row of x holding NaN gives NaN. ctest runs it on each kernel the CPU has
// (NANOGPT_KERNELS): the VNNI dot products and the portable loops give the same bits.
TEST(MatvecRows, Int8IsDynamicQuantizationSummedExactly) {
  torch::manual_seed(6);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {5, 33}, {13, 64}, {37, 100}, {64, 384}, {9, 1536}})
    for (int64_t B : {1, 3})
      for (bool accumulate : {false, true}) {
        const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + ", B " + std::to_string(B) +
                                 (accumulate ? ", accumulating" : "");
        const int64_t x_stride = cols + 3, y_stride = rows + 2;
        const int64_t r0 = rows > 2 ? 1 : 0, r1 = rows > 2 ? rows - 1 : rows;
        auto w = torch::randn({rows, cols});
        if (rows > 2) w[2].zero_();  // a row of zeros: scale 1, every byte 128
        auto q = torch::empty({rows, cols}, torch::kByte);
        auto scale = torch::empty({rows});
        quantize_rows_int8(w.data_ptr<float>(), rows, cols, q.data_ptr<uint8_t>(), scale.data_ptr<float>());
        auto centred = q.to(torch::kDouble) - 128;  // (rows, cols): the integers
        auto dequantized = centred * scale.to(torch::kDouble).unsqueeze(1);
        EXPECT_LE(((dequantized - w.to(torch::kDouble)).abs() - scale.to(torch::kDouble).unsqueeze(1) * 0.5001)
                      .max()
                      .item<double>(),
                  0.0)
            << what;
        auto row_max = centred.abs().amax(1);
        for (int64_t r = 0; r < rows; ++r) {
          if (rows > 2 && r == 2) {
            EXPECT_EQ(scale[r].item<float>(), 1.0f) << what;
            EXPECT_EQ(row_max[r].item<double>(), 0.0) << what;
          } else {
            EXPECT_EQ(row_max[r].item<double>(), 127.0) << what << ", row " << r;
          }
        }

        auto x = torch::randn({B, x_stride});  // the first cols of each row are x
        auto y = torch::randn({B, y_stride});
        auto y0 = y.clone();
        matvec_rows(Int8Rows{q.data_ptr<uint8_t>(), scale.data_ptr<float>()}, x.data_ptr<float>(), x_stride, B, cols,
                    r0, r1, y.data_ptr<float>(), y_stride, accumulate);
        auto xs = x.narrow(1, 0, cols);  // (B, cols)
        auto [x_scale, xq] = int8_inputs(xs);
        auto before = accumulate ? y0.narrow(1, r0, r1 - r0).to(torch::kDouble)
                                 : torch::zeros({B, r1 - r0}, torch::kDouble);
        auto sums = xq.mm(centred.narrow(0, r0, r1 - r0).t());  // (B, r1 - r0) exact integers
        auto products = sums * x_scale.to(torch::kDouble) * scale.narrow(0, r0, r1 - r0).to(torch::kDouble);
        auto want = before + products;
        auto magnitude = before.abs() + products.abs() + 1e-30;
        auto got = y.narrow(1, r0, r1 - r0).to(torch::kDouble);
        EXPECT_LE(((got - want).abs() - 1e-6 * magnitude).max().item<double>(), 0.0) << what;
        EXPECT_TRUE(y.narrow(1, 0, r0).equal(y0.narrow(1, 0, r0))) << what;
        EXPECT_TRUE(y.narrow(1, r1, y_stride - r1).equal(y0.narrow(1, r1, y_stride - r1))) << what;
        if (cols >= 33) {  // the test can tell: x not quantized lands outside the tolerance
          auto unquantized = before + xs.to(torch::kDouble).mm(dequantized.narrow(0, r0, r1 - r0).t());
          EXPECT_GT(((unquantized - want).abs() - 1e-6 * magnitude).max().item<double>(), 0.0) << what;
        }
        if (rows > 2) {  // a damaged weight is not hidden either: its row's products are NaN
          auto damaged = w.clone();
          damaged[1][0] = std::numeric_limits<float>::infinity();
          quantize_rows_int8(damaged.data_ptr<float>(), rows, cols, q.data_ptr<uint8_t>(), scale.data_ptr<float>());
          EXPECT_TRUE(std::isnan(scale[1].item<float>())) << what;
          matvec_rows(Int8Rows{q.data_ptr<uint8_t>(), scale.data_ptr<float>()}, x.data_ptr<float>(), x_stride, B,
                      cols, r0, r1, y.data_ptr<float>(), y_stride, false);
          EXPECT_TRUE(torch::isnan(y.select(1, 1)).all().item<bool>()) << what;
          EXPECT_TRUE(torch::isfinite(y.narrow(1, 2, r1 - 2)).all().item<bool>()) << what;
        }
        x[B - 1][0] = std::numeric_limits<float>::quiet_NaN();  // a non-finite input is not hidden
        matvec_rows(Int8Rows{q.data_ptr<uint8_t>(), scale.data_ptr<float>()}, x.data_ptr<float>(), x_stride, B, cols,
                    r0, r1, y.data_ptr<float>(), y_stride, false);
        EXPECT_TRUE(torch::isnan(y[B - 1].narrow(0, r0, r1 - r0)).all().item<bool>()) << what;
      }
}

// Every weight format's product gives a row of x the same bits in a batch of 9 as alone, and the same
// whichever ranges of rows it is split into (the decoder's threads take whole panels in shares that
// move with their measured speeds, and serve batches rows that were stepped alone before): the sums'
// order may depend on neither; an empty range writes nothing. And F32Panels, which the other tests reach only through the decoder,
// against LibTorch in fp64 as the rows above. ctest runs it on each kernel the CPU has.
TEST(MatvecRows, ARowGetsTheSameBitsInABatchOfAnySizeAndAnySplitOfTheRows) {
  torch::manual_seed(9);
  const int64_t rows = 37, cols = 100, B = 9;  // a partial panel, partial steps of 8, 16, 32 and 64 columns
  auto w = torch::randn({rows, cols});
  auto x = torch::randn({B, cols});
  // The formats: (w, x, B, r0, r1, y) -> y[b][r0 .. r1) = w x_b.
  using Product = std::function<void(const float*, int64_t, int64_t, int64_t, float*)>;
  auto w_bf16 = w.to(torch::kBFloat16);
  auto padded = torch::cat({w, torch::zeros({kPanel * 3 - rows, cols})});  // (48, cols): 3 panels
  auto panels = padded.view({3, kPanel, cols}).permute({0, 2, 1}).contiguous();  // (panel, col, row of panel)
  auto q = torch::empty({rows, cols}, torch::kByte);
  auto scale = torch::empty({rows});
  quantize_rows_int8(w.data_ptr<float>(), rows, cols, q.data_ptr<uint8_t>(), scale.data_ptr<float>());
  std::vector<uint8_t> int4(int4_bytes(rows, cols));
  quantize_int4(w.data_ptr<float>(), rows, cols, int4.data());
  const std::vector<std::pair<std::string, Product>> formats = {
      {"fp32 rows", [&](const float* xb, int64_t n, int64_t r0, int64_t r1, float* y) {
         matvec_rows(w.data_ptr<float>(), xb, cols, n, cols, r0, r1, y, rows, false);
       }},
      {"bf16 rows", [&](const float* xb, int64_t n, int64_t r0, int64_t r1, float* y) {
         matvec_rows(reinterpret_cast<const uint16_t*>(w_bf16.data_ptr<c10::BFloat16>()), xb, cols, n, cols, r0, r1,
                     y, rows, false);
       }},
      {"fp32 panels", [&](const float* xb, int64_t n, int64_t r0, int64_t r1, float* y) {
         matvec_rows(F32Panels{panels.data_ptr<float>(), rows, cols}, xb, cols, n, r0, r1, y, rows, false);
       }},
      {"int8 rows", [&](const float* xb, int64_t n, int64_t r0, int64_t r1, float* y) {
         matvec_rows(Int8Rows{q.data_ptr<uint8_t>(), scale.data_ptr<float>()}, xb, cols, n, cols, r0, r1, y, rows,
                     false);
       }},
      {"int4 tiles", [&](const float* xb, int64_t n, int64_t r0, int64_t r1, float* y) {
         matvec_rows(Int4Tiles{int4.data(), rows, cols}, xb, cols, n, r0, r1, y, rows, false);
       }},
  };
  for (const auto& [name, product] : formats) {
    auto together = torch::empty({B, rows}), split = torch::empty({B, rows}), alone = torch::empty({B, rows});
    product(x.data_ptr<float>(), B, 0, rows, together.data_ptr<float>());
    for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, 16}, {16, 32}, {32, rows}})  // whole panels and tiles
      product(x.data_ptr<float>(), B, r0, r1, split.data_ptr<float>());
    for (int64_t b = 0; b < B; ++b) product(x[b].data_ptr<float>(), 1, 0, rows, alone[b].data_ptr<float>());
    EXPECT_TRUE(torch::equal(together, alone)) << name << ": max difference "
                                               << (together - alone).abs().max().item<float>();
    EXPECT_TRUE(torch::equal(together, split)) << name << ": max difference "
                                               << (together - split).abs().max().item<float>();
    // A thread whose share is empty gets r0 == r1, at any row (the last one too, which is not a
    // panel's first when rows is not a multiple of kPanel): it writes nothing.
    for (const int64_t r : {int64_t{0}, int64_t{16}, int64_t{32}, rows}) {
      auto untouched = torch::full({B, rows}, std::numeric_limits<float>::quiet_NaN());
      product(x.data_ptr<float>(), B, r, r, untouched.data_ptr<float>());
      EXPECT_TRUE(torch::isnan(untouched).all().item<bool>()) << name << ": the empty range at row " << r;
    }
    if (name == "fp32 panels") {
      auto xd = x.to(torch::kDouble), wd = w.to(torch::kDouble);
      auto want = xd.mm(wd.t()), magnitude = xd.abs().mm(wd.abs().t());
      EXPECT_LE(((together.to(torch::kDouble) - want).abs() - 1e-6 * magnitude).max().item<double>(), 0.0);
    }
  }
}

// One token's attention over the cache, per head: softmax(q K^T / sqrt(hs)) V in fp64 from the
// cache's own values (the new key and value written into their slot first; with a bf16 cache q
// rounded to bf16 as the scores round it), for the head sizes with a register-held weighted sum of
// the values (16, 32, 64, 128) and one without (12), MHA and GQA, a full ring and a short one.
TEST(DecodeAttention, IsSoftmaxOfScoresTimesValues) {
  torch::manual_seed(8);
  for (int64_t hs : {12, 16, 32, 64, 128})
    for (bool bf16 : {false, true})
      for (auto [n_head, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}})
        for (int64_t pos : {5, 40}) {
          const std::string what = "hs " + std::to_string(hs) + (bf16 ? ", bf16" : ", fp32") + ", heads " +
                                   std::to_string(n_head) + "/" + std::to_string(n_kv) + ", pos " + std::to_string(pos);
          const int64_t block = 32, Tk = std::min(pos + 1, block);
          auto qkv = torch::randn({(n_head + 2 * n_kv) * hs}) * 2;
          auto k = torch::randn({n_kv, block, hs}), v = torch::randn({n_kv, block, hs});
          if (bf16) {
            k = k.to(torch::kBFloat16);
            v = v.to(torch::kBFloat16);
          }
          auto out = torch::empty({n_head * hs});
          std::vector<float> scratch(decode_attention_scratch(block, hs));
          if (bf16)
            decode_attention_groups(qkv.data_ptr<float>(), reinterpret_cast<uint16_t*>(k.data_ptr()),
                                    reinterpret_cast<uint16_t*>(v.data_ptr()), out.data_ptr<float>(), block, hs, pos,
                                    n_head, n_kv, nullptr, nullptr, 0.0, 0, n_kv, scratch.data());
          else
            decode_attention_groups(qkv.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                                    out.data_ptr<float>(), block, hs, pos, n_head, n_kv, nullptr, nullptr, 0.0, 0, n_kv,
                                    scratch.data());
          const int64_t slot = pos % block;
          for (int64_t j = 0; j < n_kv; ++j) {  // the new key and value in their slot, in the cache's dtype
            auto new_k = qkv.narrow(0, (n_head + j) * hs, hs), new_v = qkv.narrow(0, (n_head + n_kv + j) * hs, hs);
            EXPECT_TRUE(k[j][slot].to(torch::kFloat).equal(new_k.to(k.scalar_type()).to(torch::kFloat))) << what;
            EXPECT_TRUE(v[j][slot].to(torch::kFloat).equal(new_v.to(v.scalar_type()).to(torch::kFloat))) << what;
          }
          for (int64_t h = 0; h < n_head; ++h) {
            const int64_t j = h / (n_head / n_kv);
            auto q = qkv.narrow(0, h * hs, hs);
            if (bf16) q = q.to(torch::kBFloat16);
            auto keys = k[j].narrow(0, 0, Tk).to(torch::kDouble), values = v[j].narrow(0, 0, Tk).to(torch::kDouble);
            auto weights = torch::softmax(keys.mv(q.to(torch::kDouble)) / std::sqrt(static_cast<double>(hs)), 0);
            auto want = values.t().mv(weights);
            auto got = out.narrow(0, h * hs, hs).to(torch::kDouble);
            EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * values.abs().max().item<double>())
                << what << ", head " << h;
          }
        }
}

// The int8 cache (`--quantize`): each key and value kept within half a step of its row's scale
// (max|x| / 127); and one token's attention equal to softmax(q K^T / sqrt(hs)) V in fp64 over what the
// cache holds (int8_kv_read) and the query as quantize_row_int8 rounds it: the tiles, the offset
// bytes, the scales and the slots are right, whatever the integer kernel (ctest runs it on each
// NANOGPT_KERNELS: VNNI and the portable loops). Head sizes with a chunk count that is not a
// multiple of 4 (12) and each register-held weighted sum, MHA and GQA, a ring not a multiple of
// 16 slots, part filled and wrapped.
TEST(DecodeAttention, Int8CacheIsSoftmaxOfItsScoresTimesValues) {
  torch::manual_seed(9);
  for (int64_t hs : {12, 16, 32, 64, 128})
    for (auto [n_head, n_kv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}})
      for (int64_t block : {32, 20})
        for (int64_t pos : {5, 17, 45}) {
          const std::string what = "hs " + std::to_string(hs) + ", heads " + std::to_string(n_head) + "/" +
                                   std::to_string(n_kv) + ", block " + std::to_string(block) + ", pos " +
                                   std::to_string(pos);
          const int64_t Tk = std::min(pos + 1, block), slot = pos % block;
          const int64_t key_bytes = int8_keys_bytes(block, hs), value_bytes = int8_values_bytes(block, hs);
          auto keys = torch::zeros({n_kv, key_bytes}, torch::kByte);
          auto values = torch::zeros({n_kv, value_bytes}, torch::kByte);
          std::vector<int8_t> row(hs);
          auto k = torch::randn({n_kv, block, hs}) * 1.5, v = torch::randn({n_kv, block, hs});
          k[0][0].mul_(1e-3);  // a tiny row: its own scale
          for (int64_t j = 0; j < n_kv; ++j)
            for (int64_t t = 0; t < Tk; ++t)
              if (t != slot)
                int8_kv_write(keys[j].data_ptr<uint8_t>(), values[j].data_ptr<uint8_t>(), block, hs, t,
                              k[j][t].data_ptr<float>(), v[j][t].data_ptr<float>(), row.data());
          auto qkv = torch::randn({(n_head + 2 * n_kv) * hs}) * 2;
          for (int64_t j = 0; j < n_kv; ++j) {  // the new key and value: what the cache must hold at `slot`
            k[j][slot].copy_(qkv.narrow(0, (n_head + j) * hs, hs));
            v[j][slot].copy_(qkv.narrow(0, (n_head + n_kv + j) * hs, hs));
          }
          auto out = torch::empty({n_head * hs});
          std::vector<float> scratch(decode_attention_scratch(block, hs));
          decode_attention_groups_int8(qkv.data_ptr<float>(), keys.data_ptr<uint8_t>(), values.data_ptr<uint8_t>(),
                                       out.data_ptr<float>(), block, hs, pos, n_head, n_kv, nullptr, nullptr, 0.0, 0,
                                       n_kv, scratch.data());
          auto held_k = torch::empty({n_kv, Tk, hs}), held_v = torch::empty({n_kv, Tk, hs});
          for (int64_t j = 0; j < n_kv; ++j)
            for (int64_t t = 0; t < Tk; ++t) {
              int8_kv_read(keys[j].data_ptr<uint8_t>(), values[j].data_ptr<uint8_t>(), block, hs, t,
                           held_k[j][t].data_ptr<float>(), held_v[j][t].data_ptr<float>());
              for (auto [held, given, name] :
                   {std::tuple{held_k[j][t], k[j][t], "key"}, {held_v[j][t], v[j][t], "value"}}) {
                const double step = given.abs().max().item<double>() / 127;
                EXPECT_LE((held - given).abs().max().item<double>(), 0.5 * step * (1 + 1e-5))
                    << what << ", " << name << " " << t;
              }
            }
          for (int64_t h = 0; h < n_head; ++h) {
            const int64_t j = h / (n_head / n_kv);
            auto q = qkv.narrow(0, h * hs, hs).contiguous();
            std::vector<int8_t> q8(hs);
            int32_t sum = 0;
            const double sq = quantize_row_int8(q.data_ptr<float>(), hs, q8.data(), &sum);
            auto q_held = torch::tensor(std::vector<double>(q8.begin(), q8.end()), torch::kDouble) * sq;
            auto scores = held_k[j].to(torch::kDouble).mv(q_held) / std::sqrt(static_cast<double>(hs));
            auto weights = torch::softmax(scores, 0);
            auto want = held_v[j].to(torch::kDouble).t().mv(weights);
            auto got = out.narrow(0, h * hs, hs).to(torch::kDouble);
            EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * held_v[j].abs().max().item<double>())
                << what << ", head " << h;
          }
        }
}

// Int4 weights in groups: every weight within half a step of its group's range (plus bf16's rounding
// of the step and the minimum) and the ends of each range kept; the product against the same
// arithmetic in fp64 (x quantized as the int8 product's, times the stored weights d * u + m) to
// fp32's rounding; rows outside [r0, r1) untouched; NaN in a weight or in x not hidden. ctest runs
// it on each kernel the CPU has (NANOGPT_KERNELS): the VNNI kernel and the portable loops.
TEST(MatvecRows, Int4IsGroupQuantizationSummedExactly) {
  torch::manual_seed(7);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {5, 33}, {16, 64}, {37, 100}, {48, 384}, {9, 1536}})
    for (int64_t B : {1, 3})
      for (bool accumulate : {false, true}) {
        const std::string what = std::to_string(rows) + "x" + std::to_string(cols) + ", B " + std::to_string(B) +
                                 (accumulate ? ", accumulating" : "");
        const int64_t x_stride = cols + 3, y_stride = rows + 2;
        // a whole tile's start; the end at the matrix's end or at a whole tile
        const int64_t r0 = rows > kInt4Tile ? kInt4Tile : 0, r1 = rows == 48 ? 2 * kInt4Tile : rows;
        auto w = torch::randn({rows, cols}) * 0.1 + 0.02;
        if (rows > 2) w[2].fill_(0.5f);  // a constant row: step 0, every weight exact
        std::vector<uint8_t> packed(int4_bytes(rows, cols));
        quantize_int4(w.data_ptr<float>(), rows, cols, packed.data());
        const Int4Tiles tiles{packed.data(), rows, cols};
        auto stored = torch::empty({rows, cols}, torch::kDouble);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) stored[r][c] = int4_weight(tiles, r, c);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t g = 0; g * kInt4Group < cols; ++g) {
            const int64_t n = std::min(kInt4Group, cols - g * kInt4Group);
            auto group = w[r].narrow(0, g * kInt4Group, n).to(torch::kDouble);
            auto kept = stored[r].narrow(0, g * kInt4Group, n);
            const double lo = group.min().item<double>(), hi = group.max().item<double>(), step = (hi - lo) / 15;
            const double bound = 0.5 * step * 1.01 + (std::abs(lo) + 15 * step) / 256;  // bf16: 8 bits
            EXPECT_LE((kept - group).abs().max().item<double>(), bound) << what << ", row " << r << " group " << g;
            if (step > 0) {  // the range's ends are the 0th and 15th steps
              EXPECT_LE(std::abs(kept.min().item<double>() - lo), std::abs(lo) / 256 + 1e-12) << what;
              EXPECT_LE(std::abs(kept.max().item<double>() - hi), 0.5 * step) << what;
            }
          }
        if (rows > 2) {
          EXPECT_TRUE(stored[2].eq(0.5).all().item<bool>()) << what;
        }

        auto x = torch::randn({B, x_stride});
        auto y = torch::randn({B, y_stride});
        auto y0 = y.clone();
        matvec_rows(tiles, x.data_ptr<float>(), x_stride, B, r0, r1, y.data_ptr<float>(), y_stride, accumulate);
        auto xs = x.narrow(1, 0, cols);  // (B, cols)
        auto [x_scale, xq] = int8_inputs(xs);
        auto before = accumulate ? y0.narrow(1, r0, r1 - r0).to(torch::kDouble)
                                 : torch::zeros({B, r1 - r0}, torch::kDouble);
        auto w_rows = stored.narrow(0, r0, r1 - r0);
        auto products = xq.mm(w_rows.t()) * x_scale.to(torch::kDouble);
        auto want = before + products;
        auto magnitude = before.abs() + xq.abs().mm(w_rows.abs().t()) * x_scale.to(torch::kDouble) + 1e-30;
        auto got = y.narrow(1, r0, r1 - r0).to(torch::kDouble);
        EXPECT_LE(((got - want).abs() - 1e-6 * magnitude).max().item<double>(), 0.0) << what;
        EXPECT_TRUE(y.narrow(1, 0, r0).equal(y0.narrow(1, 0, r0))) << what;
        EXPECT_TRUE(y.narrow(1, r1, y_stride - r1).equal(y0.narrow(1, r1, y_stride - r1))) << what;
        if (cols >= 33) {  // the test can tell: x not quantized lands outside the tolerance
          auto unquantized = before + xs.to(torch::kDouble).mm(w_rows.t());
          EXPECT_GT(((unquantized - want).abs() - 1e-6 * magnitude).max().item<double>(), 0.0) << what;
        }
        if (rows > 2) {  // a damaged weight is not hidden: its row's products are NaN, the others not
          auto damaged = w.clone();
          damaged[r0 + 1][cols - 1] = std::numeric_limits<float>::infinity();
          quantize_int4(damaged.data_ptr<float>(), rows, cols, packed.data());
          matvec_rows(tiles, x.data_ptr<float>(), x_stride, B, r0, r1, y.data_ptr<float>(), y_stride, false);
          EXPECT_TRUE(torch::isnan(y.select(1, r0 + 1)).all().item<bool>()) << what;
          EXPECT_TRUE(torch::isfinite(y.narrow(1, r0 + 2, r1 - r0 - 2)).all().item<bool>()) << what;
          quantize_int4(w.data_ptr<float>(), rows, cols, packed.data());
        }
        x[B - 1][cols - 1] = std::numeric_limits<float>::quiet_NaN();  // a non-finite input is not hidden
        matvec_rows(tiles, x.data_ptr<float>(), x_stride, B, r0, r1, y.data_ptr<float>(), y_stride, false);
        EXPECT_TRUE(torch::isnan(y[B - 1].narrow(0, r0, r1 - r0)).all().item<bool>()) << what;
        if (B > 1) {
          EXPECT_TRUE(torch::isfinite(y[0].narrow(0, r0, r1 - r0)).all().item<bool>()) << what;
        }
      }
}

// `model`'s weight matrices replaced by the values a quantized decoder stores for them: with int8
// every matrix (its rows' int8 values), with int4 the blocks' matrices in int4 and the embeddings
// and the head in int8.
void store_quantized(GPT& model, Quantize quantize) {
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    auto& w = p.value();
    if (w.dim() != 2) continue;  // the norms' weights and the biases stay fp32
    const bool in_block = p.key().rfind("h.", 0) == 0;
    const int64_t rows = w.size(0), cols = w.size(1);
    auto values = w.contiguous();
    if (quantize == Quantize::int4 && in_block) {
      std::vector<uint8_t> packed(int4_bytes(rows, cols));
      quantize_int4(values.data_ptr<float>(), rows, cols, packed.data());
      auto out = torch::empty({rows, cols});
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[r][c] = int4_weight(Int4Tiles{packed.data(), rows, cols}, r, c);
      w.copy_(out);
    } else {
      auto q = torch::empty({rows, cols}, torch::kByte);
      auto scale = torch::empty({rows});
      quantize_rows_int8(values.data_ptr<float>(), rows, cols, q.data_ptr<uint8_t>(), scale.data_ptr<float>());
      w.copy_((q.to(torch::kFloat) - 128) * scale.unsqueeze(1));
    }
  }
}

// The decoder with int8 or int4 matrices against the fp32 model, every switch, with an fp32 and a
// bf16 cache: the logits differ (the quantization is real) by a few percent of their spread for
// int8, more for int4 (these random models' weights are Gaussian, the worst case for a scale shared
// by a row or a group; docs/perf-log.md measures what each costs a trained model's loss). Against the
// model holding the stored weights, what is left is the inputs' int8 rounding: the wiring is right.
TEST(Decoder, QuantizedLogitsStayCloseToTheFp32Model) {
  c10::InferenceMode inference;
  for (Quantize quantize : {Quantize::int8, Quantize::int4})
  for (bool autocast_on : {false, true})
    for (const auto& [name, tweak] : variants()) {
      const bool int4 = quantize == Quantize::int4;
      const std::string what =
          name + (autocast_on ? ", bf16 cache" : ", fp32 cache") + (int4 ? ", int4" : ", int8");
      ModelConfig c = tiny_config();
      tweak(c);
      GPT model = perturbed_model(c), stored = perturbed_model(c);
      store_quantized(stored, quantize);
      std::unique_ptr<Decoder> decoder;
      {
        nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, autocast_on);
        decoder = std::make_unique<Decoder>(*model, quantize);
      }
      ASSERT_EQ(decoder->quantize(), quantize) << what;
      ASSERT_FALSE(decoder->bf16_weights()) << what;
      // Every position through the decoder (a one-token prompt's way): a prefill by the general path
      // would put the fp32 weights' keys and values in its cache.
      const int64_t B = 2, steps = c.pos_encoding == "rope" ? 2 * c.block_size : c.block_size;
      torch::manual_seed(12);
      auto tokens = torch::randint(c.vocab_size, {B, steps}, torch::kLong);
      KVCache exact = model->make_cache(), as_stored = stored->make_cache(), fast = model->make_cache();
      double error = 0.0, spread = 0.0, stored_error = 0.0, stored_spread = 0.0;  // sums of squares
      for (int64_t s = 0; s < steps; ++s) {
        auto next = tokens.select(1, s);
        auto want = model->forward_cached(next.unsqueeze(1), exact).to(torch::kDouble);  // (B, V)
        auto want_stored = stored->forward_cached(next.unsqueeze(1), as_stored).to(torch::kDouble);
        at::set_num_threads(2);
        auto got = decoder->step(next, fast).to(torch::kDouble);
        at::set_num_threads(1);
        error += (got - want).square().sum().item<double>();
        spread += (want - want.mean(1, true)).square().sum().item<double>();
        stored_error += (got - want_stored).square().sum().item<double>();
        stored_spread += (want_stored - want_stored.mean(1, true)).square().sum().item<double>();
      }
      const double relative = std::sqrt(error / spread), relative_stored = std::sqrt(stored_error / stored_spread);
      EXPECT_GT(relative, 1e-4) << what << ": quantizing changes the logits";
      // Measured, int8: 0.015-0.035 over the variants, 0.066 for "wide" (128 columns a row);
      // int4: 0.11-0.30, "wide" 0.39.
      EXPECT_LE(relative, int4 ? 0.5 : 0.1) << what << ": root mean square error over the logits' spread";
      // Measured: 0.010-0.031; "wide" 0.046 with int8, 0.075 with int4 (the int8 KV cache's rounding
      // on top of the inputs'; 0.043-0.055 with a bf16 or fp32 cache).
      EXPECT_LE(relative_stored, 0.1) << what << ": against the model holding the stored weights";
    }
}

// A quantized decoder's int8 cache goes on from a cache the general path filled (fp32, or bf16
// under autocast: its filled slots quantized), within the quantized test's bound of the fp32 model;
// the general path refuses to go on from the int8 cache with one clear error instead of reading
// its bytes as numbers. With a head size that is not a multiple of 4 the cache stays the general
// path's, which then goes on from it.
TEST(Decoder, QuantizedCacheGoesOnFromTheGeneralPathsAndNotBack) {
  c10::InferenceMode inference;
  for (int64_t n_head : {2, 4})  // head sizes 12 and 6
    for (bool autocast_on : {false, true}) {
      const std::string what = "head size " + std::to_string(24 / n_head) + (autocast_on ? ", bf16" : ", fp32");
      ModelConfig c = tiny_config();
      c.n_head = n_head;
      GPT model = perturbed_model(c);
      std::unique_ptr<Decoder> decoder;
      {
        nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, autocast_on);
        decoder = std::make_unique<Decoder>(*model, Quantize::int8);
      }
      const int64_t B = 2, prompt = 3, steps = 2 * c.block_size;
      torch::manual_seed(13);
      auto tokens = torch::randint(c.vocab_size, {B, prompt + steps}, torch::kLong);
      KVCache exact = model->make_cache(), fast = model->make_cache();
      model->forward_cached(tokens.narrow(1, 0, prompt), exact);
      {
        nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, autocast_on);
        model->forward_cached(tokens.narrow(1, 0, prompt), fast);
      }
      double error = 0.0, spread = 0.0;
      for (int64_t s = 0; s < steps; ++s) {
        auto next = tokens.select(1, prompt + s);
        auto want = model->forward_cached(next.unsqueeze(1), exact).to(torch::kDouble);
        auto got = decoder->step(next, fast).to(torch::kDouble);
        error += (got - want).square().sum().item<double>();
        spread += (want - want.mean(1, true)).square().sum().item<double>();
      }
      // Measured: 0.024-0.025.
      EXPECT_LE(std::sqrt(error / spread), 0.1) << what << ": root mean square error over the logits' spread";
      auto next = tokens.select(1, prompt + steps - 1).unsqueeze(1);
      if (n_head == 2) {
        EXPECT_EQ(fast.k[0].scalar_type(), torch::kByte) << what;
        try {
          model->forward_cached(next, fast);
          ADD_FAILURE() << what << ": the general path read the int8 cache";
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos) << e.what();
        }
      } else {
        EXPECT_EQ(fast.k[0].dim(), 4) << what;
        EXPECT_NO_THROW(model->forward_cached(next, fast)) << what;
      }
    }
}

TEST(Decoder, GenerateAndBeamSearchGiveTheSameTokensEitherWay) {
  for (const std::string pos : {"rope", "learned"}) {
    ModelConfig c = tiny_config();
    c.pos_encoding = pos;
    c.bias = true;
    GPT model = perturbed_model(c);
    SamplingOptions fast, general;
    fast.temperature = general.temperature = 1.0;
    fast.top_k = general.top_k = 8;
    fast.top_p = general.top_p = 0.95;
    general.fast_decoder = false;
    for (int64_t B : {1, 3})
      for (const std::vector<int64_t>& prompt : {std::vector<int64_t>{1}, std::vector<int64_t>{1, 2}}) {
        std::mt19937_64 a(7), b(7);
        // 30 new tokens: past block_size (sliding with RoPE, re-filled windows with learned
        // positions); a one-token prompt's first step goes through the decoder too
        EXPECT_EQ(generate(model, prompt, B, 30, fast, a), generate(model, prompt, B, 30, general, b))
            << pos << " B " << B << " prompt of " << prompt.size();
      }
    BeamOptions wide, wide_general;
    wide.width = wide_general.width = 3;
    wide_general.fast_decoder = false;
    auto x = beam_search(model, {1}, 12, wide), y = beam_search(model, {1}, 12, wide_general);
    ASSERT_EQ(x.size(), y.size()) << pos;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].tokens, y[i].tokens) << pos << " beam " << i;
      EXPECT_NEAR(x[i].log_prob, y[i].log_prob, 1e-4) << pos << " beam " << i;
    }
  }
}

TEST(Decoder, RejectsBadInputAndModelsItCannotRun) {
  torch::NoGradGuard no_grad;
  ModelConfig c = tiny_config();
  c.pos_encoding = "learned";
  GPT model = perturbed_model(c);
  Decoder decoder(*model);
  KVCache cache = model->make_cache();
  model->forward_cached(torch::tensor({{1, 2}}, torch::kLong), cache);
  EXPECT_THROW(decoder.step(torch::tensor({13}, torch::kLong), cache), std::invalid_argument);  // vocab is 0..12
  EXPECT_THROW(decoder.step(torch::tensor({-1}, torch::kLong), cache), std::invalid_argument);
  EXPECT_THROW(decoder.step(torch::tensor({1.0f}), cache), std::invalid_argument);
  EXPECT_THROW(decoder.step(torch::tensor({1, 2}, torch::kLong), cache), std::invalid_argument);  // the cache holds B = 1
  for (int64_t s = 2; s < c.block_size; ++s) decoder.step(torch::tensor({1}, torch::kLong), cache);
  EXPECT_THROW(decoder.step(torch::tensor({1}, torch::kLong), cache), std::invalid_argument);  // learned positions end
  EXPECT_EQ(cache.length(), c.block_size);

  model->train();
  EXPECT_FALSE(decoder_supports(*model));
  EXPECT_THROW(Decoder{*model}, std::invalid_argument);
  model->eval();
  {
    nanogpt::runtime::AutocastGuard autocast(torch::kCPU, torch::kHalf, true);  // fp16 autocast: not this decoder's
    EXPECT_FALSE(decoder_supports(*model));
  }
  model->to(torch::kDouble);
  EXPECT_FALSE(decoder_supports(*model));
}

// GELU from fast_gelu and fast_gelu_backward against v Phi(v) and its slope Phi(v) + v phi(v) in
// fp64 (from the values the input holds), over [-12, 12] in 20,011 steps (no multiple of 16 or 32:
// the tails run too), and against LibTorch's torch::gelu and gelu_backward. fp32: within 2e-6 (A&S
// erf's 1.5e-7, times |v| <= 12, and the rounding). bf16: within one bf16 step of the exact value
// (the output's rounding; the kept slope and the product round once more in backward). Under
// NANOGPT_KERNELS=portable these are LibTorch's own ops, which must pass the same bounds.
TEST(FastGelu, IsTheExactGeluWithItsSlope) {
  torch::manual_seed(5);
  const int64_t n = 20011;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const bool bf16 = dtype == torch::kBFloat16;
    auto h = torch::linspace(-12, 12, n).to(dtype).requires_grad_(true);
    auto g = torch::randn({n}).to(dtype);
    auto y = fast_gelu(h);
    y.backward(g);
    auto v = h.detach().to(torch::kDouble), gd = g.to(torch::kDouble);
    auto cdf = 0.5 * torch::erfc(-v / std::sqrt(2.0));
    auto want_y = v * cdf;
    auto want_dh = gd * (cdf + v * torch::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI));
    const double rel = bf16 ? 1.0 / 128 : 1e-6, abs = bf16 ? 1e-6 : 2e-6;
    const auto within = [&](const torch::Tensor& got, const torch::Tensor& want, double r) {
      auto excess = (got.to(torch::kDouble) - want).abs() - (r * want.abs() + abs);
      return excess.max().item<double>();
    };
    EXPECT_LE(within(y, want_y, rel), 0.0);
    EXPECT_LE(within(h.grad(), want_dh, 2 * rel), 0.0);
    // A drop-in for LibTorch's: the same bounds against its values.
    EXPECT_LE(within(y, torch::gelu(h.detach()).to(torch::kDouble), 2 * rel), 0.0);
    EXPECT_LE(within(h.grad(), torch::gelu_backward(g, h.detach()).to(torch::kDouble), 3 * rel), 0.0);

    // Backward that recomputes: GELU(h) as the forward gives it, and g GELU'(h) rounded once.
    auto [y2, dh2] = fast_gelu_backward(h.detach(), g);
    EXPECT_TRUE(torch::equal(y2, y.detach()));
    EXPECT_EQ(dh2.scalar_type(), dtype);
    EXPECT_LE(within(dh2, want_dh, rel), 0.0);
    // Without grad, the forward alone: the same values.
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::equal(fast_gelu(h.detach()), y.detach()));
    }
    // Non-finite input stays non-finite (ours gives +inf for +inf, LibTorch's NaN); a 2-D view that
    // is not contiguous works.
    auto special = torch::tensor({std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.0f}).to(dtype);
    auto s = fast_gelu(special).to(torch::kFloat);
    EXPECT_TRUE(std::isnan(s[0].item<float>()));
    EXPECT_FALSE(std::isfinite(s[1].item<float>()));
    EXPECT_EQ(s[2].item<float>(), 0.0f);
    auto m = torch::randn({37, 40}).to(dtype).t();
    EXPECT_LE(within(fast_gelu(m), torch::gelu(m.to(torch::kDouble)), rel), 0.0);
  }
}
