// The benchmark instrument behind `nanogpt bench`: on this machine, in one process, GEMM
// throughput (fp32 and bf16) at the model's shapes and at a large square size, the training step
// time of a config in its dtype (median after warm-up), tokens/s, MFU against the measured peak
// of that dtype, sampling tokens/s with and without the KV cache, and peak RSS.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace nanogpt::tools {

struct BenchOptions {
  int64_t iters = 30;           // timed training steps
  int64_t warmup = 5;           // untimed steps first
  int64_t sample_tokens = 500;  // new tokens per sampling measurement; 0 skips sampling
  int64_t sample_batch = 10;    // samples generated together in the batched measurement
  std::string profile_path;     // non-empty: profile 3 more steps, Chrome trace JSON written here
};

struct GemmResult {
  std::string shape;  // "square", "q/k/v/c_proj", "mlp c_fc", "head"
  std::string dtype;
  int64_t m, k, n;
  double gflops;
};

struct BenchReport {
  std::string torch_version, device, dtype, config_summary;
  int64_t threads = 0;
  std::vector<GemmResult> gemm;
  double peak_gflops = 0;           // the MFU denominator: a GPU's datasheet bf16 peak, else the square GEMM of the config's dtype
  std::string peak_source;          // "datasheet" or "measured"
  double step_ms_median = 0, step_ms_min = 0, step_ms_mean = 0;
  double tokens_per_sec = 0, mfu = 0;
  double final_loss = 0;            // loss of the last timed step (sanity: finite, falling)
  double sample_tok_s_cache = 0, sample_tok_s_nocache = 0, sample_tok_s_batch = 0;
  double sample_tok_s_int8 = 0;     // one sample with --quantize int8 (CPU only; 0 elsewhere)
  double sample_tok_s_int4 = 0;     // the same with --quantize int4
  int64_t sample_batch = 0;
  double peak_rss_mb = 0;
  double peak_gpu_allocated_mb = 0, peak_gpu_reserved_mb = 0;  // CUDA's caching allocator, training steps

  std::string table() const;
  std::string json() const;
};

/// Runs the benchmark for `config` (data prepared on demand, as in training).
BenchReport run_bench(train::TrainConfig config, const BenchOptions& options);

}  // namespace nanogpt::tools
