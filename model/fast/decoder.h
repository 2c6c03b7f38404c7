// The whole model's forward for one new token per sequence, on the CPU in fp32, as hand-written
// loops over one packed copy of the weights (its matrices in bf16 under CPU bf16 autocast).
// Sampling the CPU-preset model through LibTorch ran ~60 small kernels per token (norms,
// matrix-vector products, adds, the activation), each a few microseconds of dispatch for a few
// thousand flops: most of the time per token was dispatch. Here
// a token is embedded, run through every block and the head with raw pointers: vectorised
// matrix-vector products split by output rows over the threads (each thread always gets the same
// rows, so its share of the weights stays in its own cache), norms and residual adds in place, no
// tensor allocated but the logits. The general path (GPT::forward_cached) stays the reference;
// tests/test_model_decoder.cpp holds the two equal across the architecture's switches (in bf16, as
// close to the fp32 model as the general path under autocast).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "model/fast/dot.h"
#include "model/fast/simd.h"
#include "model/fast/thread_choice.h"
#include "model/gpt.h"
#include "model/kv_cache.h"
#include "model/positions.h"

namespace nanogpt::model {

/// Whether Decoder can run `model` as it is now: parameters on the CPU in fp32, eval mode, no
/// autograd, and CPU autocast off or in bf16.
bool decoder_supports(const GPTImpl& model);

/// How the decoder stores its weight matrices: as the model (fp32, or bf16 under autocast), or
/// quantized (`nanogpt sample --quantize`).
enum class Quantize { none, int8, int4 };

class Decoder {
 public:
  /// Packs a copy of `model`'s weights: build it after the last weight change (one per sampling
  /// call). In fp32 the blocks' matrices are packed in panels of 16 rows (dot.h's F32Panels):
  /// several sequences' products then share each load of a weight, each output summed over its
  /// columns in one lane, the same bits in a batch of any size (full-preset model, 16 sequences,
  /// one thread: the products in 2.9 ms against 5.1-5.9 with rows of four). In bf16 they are too
  /// where the CPU has AVX512-BF16 (Bf16Panels, a pair of columns a lane and instruction; 16
  /// sequences 3.5 against 4.2-5.5 ms, one sequence unchanged at ~0.77 ms). Under CPU bf16
  /// autocast every weight matrix (the embeddings, Q/K/V, the projections, the MLP, the head) is
  /// packed in bf16, rounded as autocast rounds the weights of its bf16 products: half the bytes
  /// to stream per token. Each product then takes its input rounded to bf16 too, as autocast's do, and sums the exact products in fp32 (matvec_rows); the norms'
  /// weights, the biases and everything between the products stay fp32 (autocast also rounds each
  /// product's output, and keeps the embeddings fp32; this does not), so the logits match the
  /// general path under autocast to bf16's precision. The KV cache is then bf16 as well, as
  /// autocast's (half the bytes again for attention). Throws std::invalid_argument ("[model] ...")
  /// when !decoder_supports(model).
  ///
  /// Quantize::int8: every weight matrix is instead quantized to int8 row by row and each
  /// product's input to int8 as well, as PyTorch's dynamic quantization of Linear layers (dot.h:
  /// Int8Rows): a quarter of fp32's bytes, and products that AVX512-VNNI multiplies four pairs at a
  /// time. Quantize::int4: the blocks' matrices (Q/K/V, the projections, the MLP) in 4 bits a
  /// weight with a scale and a minimum every 64 columns (dot.h: Int4Tiles), their inputs in int8;
  /// the embeddings and the head as with int8. The logits then differ from the model's by the
  /// quantization's error (docs/perf-log.md measures what each costs a trained model's loss). With
  /// either, the KV cache is int8 too (decode_attention.h: a scale a position and head, the scores
  /// as integer dot products), where the head size is a multiple of 4; else as without them (bf16
  /// under autocast, else fp32).
  explicit Decoder(GPTImpl& model, Quantize quantize = Quantize::none);

  /// Whether the matrices are packed in bf16 (built under CPU bf16 autocast, not quantized).
  bool bf16_weights() const { return bf16_ && quantize_ == Quantize::none; }
  /// How the matrices are quantized.
  Quantize quantize() const { return quantize_; }

  /// tokens (B,) int64 on the CPU: one new token per sequence, at position cache.length(). Appends
  /// their keys and values to `cache` as GPT::forward_cached does (the same ring layout, so a cache
  /// filled by one continues with the other; the decoder keeps it in fp32, or in bf16 when built
  /// under autocast) and returns the logits of the new tokens, (B, V) fp32, as forward_cached
  /// would. Past block_size only with RoPE (the sliding window). A quantized decoder's int8 cache
  /// is its own: it goes on from a cache forward_cached filled (quantizing it), not the other way.
  /// Throws std::invalid_argument ("[model] ...") for a token id outside the vocabulary or a
  /// position the model cannot take.
  torch::Tensor step(const torch::Tensor& tokens, KVCache& cache);

  /// The same for sequences that each have a cache of their own (batch 1): row b's token goes at
  /// position caches[b]->length(), so sequences of different lengths share every product's pass
  /// over the weights (continuous batching: `nanogpt serve`). Row b's logits are the same as
  /// stepping it alone: its products, norms and attention are computed as for a batch of one.
  torch::Tensor step(const torch::Tensor& tokens, const std::vector<KVCache*>& caches);

 private:
  /// Both steps: `shared` (batch B, every row at its length) or `own` (B caches of batch 1).
  torch::Tensor run(const torch::Tensor& tokens, KVCache* shared, const std::vector<KVCache*>* own);

  /// A weight matrix (rows, cols) row-major, in packed_ (fp32), packed_bf16_ (bf16 bits) or
  /// packed_int8_ (int8: its bytes, with the row scales in packed_; int4: its Int4Tiles): one of
  /// the four set.
  struct Matrix {
    const float* f32 = nullptr;
    const uint16_t* bf16 = nullptr;
    Int8Rows int8;
    Int4Tiles int4;
    F32Panels panels;        // the blocks' fp32 matrices
    Bf16Panels bf16_panels;  // the blocks' bf16 matrices, where AVX512-BF16 multiplies them
    /// Rows r0 <= r < r1 of this @ x for each of B rows of x: matvec_rows on whichever is set.
    void rows(const float* x, int64_t x_stride, int64_t B, int64_t cols, int64_t r0, int64_t r1, float* y,
              int64_t y_stride, bool accumulate) const;
    void row(int64_t r, int64_t cols, float* out) const;      // out = row r, in fp32
    void add_row(int64_t r, int64_t cols, float* out) const;  // out += row r
    explicit operator bool() const { return f32 || bf16 || int8.q || int4.data || panels.data || bf16_panels.data; }
  };
  struct Layer {  // pointers into the packed buffers; biases nullptr when the model has none
    const float *ln_1_w, *ln_1_b, *qkv_b, *o_b, *ln_2_w, *ln_2_b, *fc_b, *proj_b;
    Matrix qkv_w, o_w, fc_w, fc_up_w, proj_w;  // fc_up_w: SwiGLU's up half (fc_w is then its gate half)
  };
  /// Walks the model's weights in a fixed order through pack() and pack_matrix(): once to measure,
  /// once to copy.
  void lay_out(GPTImpl& model);
  const float* pack(const torch::Tensor& t);  // its copy in packed_; nullptr while measuring or for an undefined t
  /// pack(t), its bf16 copy when bf16_, or quantized: int8 rows, or (a block's matrix, `in_block`)
  /// Int4Tiles with Quantize::int4.
  Matrix pack_matrix(const torch::Tensor& t, bool in_block = false);
  void norm(const float* x, const float* w, const float* b, float* out) const;  // one row of C
  /// Makes cache layer tensors (B, nkv, block, hs) contiguous, fp32 (bf16 with bf16_), keeping the
  /// filled slots.
  void ensure_cache(torch::Tensor& t, int64_t B, int64_t start) const;
  /// The same for a layer's int8 keys and values (kv_int8_): (B, nkv, bytes) uint8, zeroed when
  /// made; a cache in the general path's layout is quantized slot by slot.
  void ensure_int8_cache(torch::Tensor& k, torch::Tensor& v, int64_t B, int64_t start) const;

  ModelConfig config_;
  int64_t C_, hs_, nkv_, qkv_width_, fc_out_, hidden_;
  bool rms_;
  enum class Activation { gelu, gelu_tanh, relu2, swiglu } activation_;
  bool bf16_;  // under CPU bf16 autocast: the KV cache in bf16, and the matrices unless quantized
  Quantize quantize_;
  bool kv_int8_;  // quantized, and a head size int8_kv_supported: the KV cache in int8
  int64_t unit_;  // rows of the blocks' matrices that stay together on a thread: kInt4Tile for int4
  torch::Tensor packed_;       // every fp32 weight the decoder reads (int8: the row scales too), one allocation
  torch::Tensor packed_bf16_;  // bf16_, not quantized: the matrices, one allocation
  torch::Tensor packed_int8_;  // quantized: the matrices' bytes (dot.h's Int8Rows and Int4Tiles), one allocation
  int64_t packed_size_ = 0, packed_bf16_size_ = 0, packed_int8_size_ = 0;  // elements placed so far in each
  std::vector<Layer> layers_;
  const float *ln_f_w_ = nullptr, *ln_f_b_ = nullptr;
  Matrix wte_, wpe_, head_;  // wpe_ empty unless learned positions
  torch::Tensor sinusoid_;        // (block_size, C), sinusoidal positions only
  std::unique_ptr<Rope> rope_;    // RoPE only: its own tables, the same values as the model's
  AlignedVector<float> x_, xn_, qkv_, att_, hidden_buf_, attention_scratch_;  // per-token scratch, sized for B rows

  /// Whether a token's products run on all threads or one, by measurement, for steps of fewer than
  /// kThreadChoiceRows rows (larger ones always take the threads): a choice for each batch size,
  /// since a step's time grows with its rows (one choice compared a 16-row step with a one-row
  /// step's time and left the threads).
  static constexpr int64_t kThreadChoiceRows = 4;
  std::map<int64_t, ThreadChoice> threads_;
  WorkSplit split_;            // each thread's share of the rows, by measured speed
  TeamBarrier barrier_;        // the token's barriers, on a team of all threads
  std::vector<double> busy_;  // each thread's working seconds in the last token
  std::vector<double> attention_ends_;  // the attention items' cumulative costs (WorkSplit::share_costs)
};

}  // namespace nanogpt::model
