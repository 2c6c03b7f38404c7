// Attention for one new token per sequence on the CPU, in fp32, as plain loops. Decoding runs the
// whole attention of a token through ~20 small LibTorch kernels (split, rotate, cache copies, bmm,
// softmax, bmm, transposes), each a few microseconds of dispatch for a few hundred flops; for the
// CPU-preset model that overhead was most of the time per token. This does the same arithmetic in
// one pass. The general path (model/attention.cpp) stays the reference, and a test holds the two
// equal (GPT.KVCacheLogitsEqualFullForwardOverTwoBlocks).
#pragma once

#include <torch/torch.h>

namespace nanogpt::model {

/// Shapes: qkv (B, 1, (nh + 2 nkv) hs), fp32 contiguous: the new token's q, k and v, heads side by
/// side. k_cache, v_cache (B, nkv, block, hs) fp32 contiguous, rings: position p lives in slot
/// p % block. rope_cos2 / rope_sin2: the RoPE tables' rows for position `pos` (hs values each, laid
/// out as in Rope), or nullptr for no rotation. Rotates q and k, writes k and v into slot
/// pos % block, and returns softmax(q kᵀ / √hs) v over every filled slot (positions
/// max(0, pos - block + 1) .. pos) as y (B, 1, nh hs).
/// qk_norm_eps > 0: q and k are first RMS-normalised per head (QK-norm) with that epsilon; 0 = not.
torch::Tensor decode_attention(const torch::Tensor& qkv, torch::Tensor& k_cache, torch::Tensor& v_cache, int64_t pos,
                               int64_t n_head, int64_t n_kv_head, const float* rope_cos2, const float* rope_sin2,
                               double qk_norm_eps = 0.0);

/// The same on raw fp32 buffers, allocating nothing but a few head-sized scratch rows (for
/// model/fast/decoder.h): qkv (B, (nh + 2 nkv) hs), k_cache and v_cache (B, nkv, block, hs), y (B, nh hs).
/// `parallel` false keeps every head on the calling thread.
void decode_attention(const float* qkv, float* k_cache, float* v_cache, float* y, int64_t B, int64_t block,
                      int64_t head_size, int64_t pos, int64_t n_head, int64_t n_kv_head, const float* rope_cos2,
                      const float* rope_sin2, double qk_norm_eps, bool parallel = true);

/// The same for part of the batch's kv heads, on the calling thread (for a parallel region of the
/// decoder's): kv head j of sequence b for every item = b * n_kv_head + j in [begin, end), i.e. its new
/// key and value into the caches, then each query head of its group. Items are independent, so the
/// threads of a region can take disjoint ranges. scratch: decode_attention_scratch(block, hs) floats.
/// The second form keeps the caches in bf16 (raw bits): the new key and value are rounded to it, and
/// the scores round q to bf16 too (matvec_rows), as autocast's attention; the softmax and the
/// weighted sum of the values stay fp32.
void decode_attention_groups(const float* qkv, float* k_cache, float* v_cache, float* y, int64_t block,
                             int64_t head_size, int64_t pos, int64_t n_head, int64_t n_kv_head, const float* rope_cos2,
                             const float* rope_sin2, double qk_norm_eps, int64_t begin, int64_t end, float* scratch);
void decode_attention_groups(const float* qkv, uint16_t* k_cache, uint16_t* v_cache, float* y, int64_t block,
                             int64_t head_size, int64_t pos, int64_t n_head, int64_t n_kv_head, const float* rope_cos2,
                             const float* rope_sin2, double qk_norm_eps, int64_t begin, int64_t end, float* scratch);
inline int64_t decode_attention_scratch(int64_t block, int64_t head_size) { return 3 * head_size + block + 16; }

/// The KV cache in int8, for the decoder's quantized sampling (`--quantize`): keys and values of
/// each position and kv head as int8 rows with an fp32 scale each (quantize_row_int8: symmetric,
/// max|x| / 127), half the bytes of bf16. The query is quantized the same way when it meets the
/// keys, and the scores are integer dot products (VPDPBUSD where the CPU has AVX512-VNNI), scaled
/// back; the softmax and the weighted sum of the values are fp32. Per sequence and kv head, the keys
/// take int8_keys_bytes(block, hs) bytes: tiles of 16 positions, each hs / 4 chunks of 64 bytes in
/// which bytes 4j .. 4j + 3 hold dims 4c .. 4c + 3 of the tile's position j, as k + 128 (unsigned
/// bytes); then a scale a position. The values take int8_values_bytes(block, hs): a row of hs
/// signed bytes a position, then a scale a position. Position p lives in slot p % block.
/// head_size must be a multiple of 4 (int8_kv_supported).
inline bool int8_kv_supported(int64_t head_size) { return head_size > 0 && head_size % 4 == 0; }
int64_t int8_keys_bytes(int64_t block, int64_t head_size);
int64_t int8_values_bytes(int64_t block, int64_t head_size);
/// One kv head's key k and value v (head_size floats each; k as the cache keeps it: rotated and
/// normalised) into slot `slot` of its int8 keys and values. row: head_size bytes of scratch.
void int8_kv_write(uint8_t* keys, uint8_t* values, int64_t block, int64_t head_size, int64_t slot, const float* k,
                   const float* v, int8_t* row);
/// The key and value that slot `slot` holds, dequantized (scale times the integer).
void int8_kv_read(const uint8_t* keys, const uint8_t* values, int64_t block, int64_t head_size, int64_t slot, float* k,
                  float* v);
/// decode_attention_groups with the int8 cache: k_cache (B, nkv, int8_keys_bytes) and v_cache
/// (B, nkv, int8_values_bytes), both uint8.
void decode_attention_groups_int8(const float* qkv, uint8_t* k_cache, uint8_t* v_cache, float* y, int64_t block,
                                  int64_t head_size, int64_t pos, int64_t n_head, int64_t n_kv_head,
                                  const float* rope_cos2, const float* rope_sin2, double qk_norm_eps, int64_t begin,
                                  int64_t end, float* scratch);

}  // namespace nanogpt::model
