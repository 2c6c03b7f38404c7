// nanogpt bench (see bench.h).
#include "tools/bench.h"

#include <fmt/format.h>

#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <filesystem>
#include <sstream>

#include "data/batch_sampler.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "model/generate.h"
#include "runtime/device.h"
#include "runtime/peak_flops.h"
#include "train/adamw.h"
#include "train/grad_scaler.h"
#include "train/step.h"

namespace nanogpt::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double sample_rate(model::GPT& model, int64_t batch, int64_t tokens, bool cache,
                   model::Quantize quantize = model::Quantize::none) {
  model::SamplingOptions o;
  o.temperature = 1.0;
  o.use_cache = cache;
  o.quantize = quantize;
  std::mt19937_64 rng(1);
  model::generate(model, {0}, batch, std::min<int64_t>(tokens, 20), o, rng);  // warm-up
  const auto t0 = Clock::now();
  model::generate(model, {0}, batch, tokens, o, rng);
  return static_cast<double>(batch * tokens) / seconds_since(t0);
}

}  // namespace

BenchReport run_bench(train::TrainConfig config, const BenchOptions& options) {
  // Opened first, so that an unwritable path fails now rather than silently after the steps.
  std::ofstream profile_out;
  if (!options.profile_path.empty()) {
    profile_out.open(options.profile_path, std::ios::binary | std::ios::trunc);
    if (!profile_out)
      throw std::runtime_error("[bench] cannot write the profile '" + options.profile_path + "': " +
                               std::strerror(errno) + " (does its folder exist?)");
  }
  BenchReport r;
  r.threads = runtime::set_threads(config.num_threads);
  const auto device = runtime::process_device(runtime::resolve_device(config.device), 0);
  runtime::set_current_device(device);
  if (device.is_cuda()) runtime::set_tf32(config.tf32);
  config.dtype = runtime::resolve_training_dtype(config.dtype, device);
  r.torch_version = runtime::torch_version();
  r.device = device.str();
  r.dtype = config.dtype;

  // The data as training finds it: prepared on demand from input.txt, or a prepared folder.
  config.dataset = data::dataset_dir(config.dataset);
  data::PrepareOptions prep;
  prep.input = config.dataset + "/input.txt";
  prep.out_dir = config.dataset;
  prep.val_fraction = config.val_fraction;
  prep.min_split_tokens = config.model.block_size + 1;
  prep.tokenizer = config.tokenizer == "bpe" ? data::TokenizerKind::Bpe : data::TokenizerKind::Char;
  prep.vocab_size = config.vocab_size;
  const auto meta = std::filesystem::exists(prep.input) ? data::ensure_prepared(prep) : data::read_meta(config.dataset);
  const int64_t V = meta.vocab.size(), C = config.model.n_embd, BT = config.batch_size * config.model.block_size;

  // GEMMs: a large square, and the model's own shapes (rows = tokens in a micro-batch).
  const int64_t square = device.is_cuda() ? 4096 : 1024;
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const std::string name = dtype == torch::kFloat ? "float32" : dtype == torch::kBFloat16 ? "bfloat16" : "float16";
    r.gemm.push_back({"square", name, square, square, square, runtime::measure_gemm_flops(device, dtype, square, square, square) / 1e9});
    r.gemm.push_back({"q/k/v/c_proj", name, BT, C, C, runtime::measure_gemm_flops(device, dtype, BT, C, C) / 1e9});
    r.gemm.push_back({"mlp c_fc", name, BT, C, 4 * C, runtime::measure_gemm_flops(device, dtype, BT, C, 4 * C) / 1e9});
    r.gemm.push_back({"head", name, BT, C, V, runtime::measure_gemm_flops(device, dtype, BT, C, V) / 1e9});
  }
  r.peak_gflops = runtime::datasheet_bf16_flops(runtime::device_name(device)) / 1e9;
  r.peak_source = r.peak_gflops > 0 ? "datasheet" : "measured";
  for (const auto& g : r.gemm)
    if (g.shape == "square" && g.dtype == config.dtype && r.peak_source == "measured") r.peak_gflops = g.gflops;

  // Training steps on real batches, exactly as the trainer runs them.
  torch::manual_seed(static_cast<uint64_t>(config.seed));
  model::ModelConfig model_config = config.model;
  model_config.vocab_size = V;
  model::GPT model(model_config);
  model->to(device);
  std::ostringstream summary;
  summary << config.model.n_layer << "L/" << config.model.n_head << "H/" << config.model.n_embd << " block " << config.model.block_size << " batch "
          << config.batch_size << "x" << config.gradient_accumulation_steps << " vocab " << V << " ("
          << model->num_params() / 1e6 << "M params, " << config.model.pos_encoding << ")";
  r.config_summary = summary.str();
  train::FlatAdamW optimizer(*model, train::optimizer_options(config));  // Muon too, as the config trains
  // Memory-mapped, as the trainer reads it: only the windows drawn are ever read.
  data::BatchSampler sampler(data::map_token_file(config.dataset + "/train.bin",
                                                  {V, meta.train_tokens, meta.train_checksum, config.verify_data}),
                             config.batch_size, config.model.block_size,
                             static_cast<uint64_t>(config.seed));
  train::StepOptions step;
  step.gradient_accumulation_steps = config.gradient_accumulation_steps;
  step.grad_clip = config.grad_clip;
  step.autocast_dtype = config.autocast_dtype();
  step.device = device;
  train::GradScaler scaler(device, step.autocast_dtype == torch::kHalf);
  if (scaler.enabled()) step.scaler = &scaler;
  model->train();
  auto next_batch = [&] {
    auto [x, y] = sampler.next(torch::kCPU);
    return runtime::to_device(x, y, device);
  };
  runtime::reset_peak_gpu_memory(device);
  std::vector<double> ms;
  for (int64_t i = 0; i < options.warmup + options.iters; ++i) {
    const auto t0 = Clock::now();
    auto loss = train::train_step(model, optimizer, next_batch, config.learning_rate, step);
    r.final_loss = loss.item<double>() / static_cast<double>(config.gradient_accumulation_steps);  // syncs
    if (i >= options.warmup) ms.push_back(seconds_since(t0) * 1000.0);
  }
  if (!options.profile_path.empty()) {  // after the timed steps, so that profiling does not slow them
    {
      torch::autograd::profiler::RecordProfile profile(profile_out);  // writes the trace when it ends
      for (int i = 0; i < 3; ++i)
        train::train_step(model, optimizer, next_batch, config.learning_rate, step).item<double>();
    }
    profile_out.close();
    if (!profile_out) throw std::runtime_error("[bench] writing the profile '" + options.profile_path + "' failed");
  }
  const auto gpu_memory = runtime::peak_gpu_memory(device);
  r.peak_gpu_allocated_mb = static_cast<double>(gpu_memory.peak_allocated) / (1 << 20);
  r.peak_gpu_reserved_mb = static_cast<double>(gpu_memory.peak_reserved) / (1 << 20);
  if (!ms.empty()) {
    r.step_ms_mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
    r.step_ms_min = *std::min_element(ms.begin(), ms.end());
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    r.step_ms_median = ms[ms.size() / 2];
    const double tokens = static_cast<double>(BT * config.gradient_accumulation_steps);
    r.tokens_per_sec = tokens / (r.step_ms_median / 1000.0);
    r.mfu = model->flops_per_token() * r.tokens_per_sec / (r.peak_gflops * 1e9);
  }

  if (options.sample_tokens > 0) {
    r.sample_tok_s_cache = sample_rate(model, 1, options.sample_tokens, true);
    r.sample_tok_s_nocache = sample_rate(model, 1, options.sample_tokens, false);
    r.sample_batch = options.sample_batch;
    r.sample_tok_s_batch = sample_rate(model, options.sample_batch, options.sample_tokens, true);
    if (device.is_cpu()) {
      r.sample_tok_s_int8 = sample_rate(model, 1, options.sample_tokens, true, model::Quantize::int8);
      r.sample_tok_s_int4 = sample_rate(model, 1, options.sample_tokens, true, model::Quantize::int4);
    }
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  r.peak_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;
  return r;
}

std::string BenchReport::table() const {
  std::string o = fmt::format("[bench] LibTorch {} | device {} | threads {}\n", torch_version, device, threads);
  o += fmt::format("[bench] model {} | dtype {}\n", config_summary, dtype);
  o += "  GEMM                         dtype        m      k      n    GFLOP/s\n";
  for (const auto& g : gemm) o += fmt::format("  {:<28} {:<9} {:6} {:6} {:6} {:10.1f}\n", g.shape, g.dtype, g.m, g.k, g.n, g.gflops);
  o += fmt::format("  train step: median {:.2f} ms (min {:.2f}, mean {:.2f}) | {:.0f} tok/s | MFU {:.1f}% of {:.0f} GFLOP/s ({}) | loss {:.4f}\n",
                   step_ms_median, step_ms_min, step_ms_mean, tokens_per_sec, 100.0 * mfu, peak_gflops, peak_source,
                   final_loss);
  if (sample_batch > 0)
    o += fmt::format("  sampling: {:.0f} tok/s with KV cache | {:.0f} tok/s without | {:.0f} tok/s batch of {}{}\n",
                     sample_tok_s_cache, sample_tok_s_nocache, sample_tok_s_batch, sample_batch,
                     sample_tok_s_int8 > 0 ? fmt::format(" | {:.0f} tok/s int8 weights | {:.0f} tok/s int4 weights",
                                                         sample_tok_s_int8, sample_tok_s_int4)
                                           : "");
  o += fmt::format("  peak RSS: {:.0f} MB\n", peak_rss_mb);
  if (peak_gpu_reserved_mb > 0)
    o += fmt::format("  peak GPU memory: {:.0f} MiB held by tensors, {:.0f} MiB reserved\n", peak_gpu_allocated_mb,
                     peak_gpu_reserved_mb);
  return o;
}

std::string BenchReport::json() const {
  // nlohmann writes a non-finite number (a diverged loss, an MFU without a peak) as null.
  nlohmann::ordered_json gemms = nlohmann::ordered_json::array();
  for (const auto& g : gemm)
    gemms.push_back({{"shape", g.shape}, {"dtype", g.dtype}, {"m", g.m}, {"k", g.k}, {"n", g.n}, {"gflops", g.gflops}});
  const nlohmann::ordered_json report = {
      {"torch_version", torch_version},
      {"device", device},
      {"threads", threads},
      {"dtype", dtype},
      {"model", config_summary},
      {"gemm", gemms},
      {"peak_gflops", peak_gflops},
      {"peak_source", peak_source},
      {"train",
       {{"median_ms", step_ms_median}, {"min_ms", step_ms_min}, {"mean_ms", step_ms_mean},
        {"tokens_per_sec", tokens_per_sec}, {"mfu", mfu}, {"final_loss", final_loss}}},
      {"sample",
       {{"tok_s_kv_cache", sample_tok_s_cache}, {"tok_s_no_cache", sample_tok_s_nocache},
        {"tok_s_batch", sample_tok_s_batch}, {"batch", sample_batch}, {"tok_s_int8", sample_tok_s_int8},
        {"tok_s_int4", sample_tok_s_int4}}},
      {"peak_rss_mb", peak_rss_mb},
      {"peak_gpu_allocated_mb", peak_gpu_allocated_mb},
      {"peak_gpu_reserved_mb", peak_gpu_reserved_mb},
  };
  return report.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace nanogpt::tools
