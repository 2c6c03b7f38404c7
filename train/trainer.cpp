// The training loop (see trainer.h).
#include "train/trainer.h"

#include <fmt/format.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <optional>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "io/atomic_file.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "runtime/device.h"
#include "runtime/host_memory.h"
#include "train/logger.h"
#include "train/run_id.h"
#include "io/metrics_csv.h"
#include "runtime/peak_flops.h"
#include "runtime/threads.h"
#include "train/signals.h"
#include "train/step.h"
#include "viz/loss_plot.h"

namespace nanogpt::train {
namespace {

using runtime::Clock;
using runtime::ms_since;

at::Generator default_generator(torch::Device device) {
  return device.is_cuda() ? at::globalContext().defaultGenerator(device) : at::detail::getDefaultCPUGenerator();
}

torch::Tensor get_rng_state(torch::Device device) {
  auto gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(torch::Device device, const torch::Tensor& state) {
  auto gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// FNV-1a over bytes: a cheap fingerprint of the data every rank must share.
uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

// Eager steps before a step is captured as CUDA graphs: the allocator, cuBLAS and the attention
// kernels' choices settle first.
constexpr int64_t kEagerStepsBeforeGraphs = 3;

// The median of `values` after the first `skip` (warm-up) ones; 0 when none are left.
double median_after(const std::vector<double>& values, size_t skip) {
  if (skip >= values.size()) return 0;
  std::vector<double> steady(values.begin() + static_cast<std::ptrdiff_t>(skip), values.end());
  std::nth_element(steady.begin(), steady.begin() + steady.size() / 2, steady.end());
  return steady[steady.size() / 2];
}

}  // namespace

Trainer::Trainer(TrainConfig config, bool quiet) : config_(std::move(config)) {
  config_.validate();
  launch_ = LaunchEnv::from_environment();
  rank_ = launch_.rank;
  world_ = launch_.world_size;
  if (config_.gradient_accumulation_steps % world_ != 0)
    throw std::runtime_error(fmt::format(
        "[ddp] gradient_accumulation_steps ({}) must be divisible by the number of processes ({}): each process "
        "runs an equal share of a step's micro-batches (e.g. --gradient_accumulation_steps={})",
        config_.gradient_accumulation_steps, world_, world_ * std::max<int64_t>(1, config_.gradient_accumulation_steps / world_)));
  local_micro_steps_ = config_.gradient_accumulation_steps / world_;
  // Threads: all cores alone; under torchrun, the machine's cores shared by its processes.
  int64_t threads = config_.num_threads;
  if (threads == 0 && launch_.launched)
    threads = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) / launch_.local_world_size);
  runtime::set_threads(threads);
  // One GPU per process: cuda:LOCAL_RANK under torchrun, cuda:0 alone, and the current device (NCCL's).
  device_ = runtime::process_device(runtime::resolve_device(config_.device), launch_.local_rank);
  runtime::set_current_device(device_);
  if (device_.is_cuda()) runtime::set_tf32(config_.tf32);
  // out_dir: create it and prove it writable before any work is done.
  std::error_code ec;
  std::filesystem::create_directories(config_.out_dir, ec);
  if (ec) throw std::runtime_error("[train] cannot create out_dir '" + config_.out_dir + "': " + ec.message());
  const std::string last_path = config_.out_dir + "/" + kLastCheckpoint;

  // This run's id: a fresh run draws one; a resumed run keeps its checkpoint's; a worker group that
  // torchrun restarted after a failure (--max-restarts) reads it back from out_dir and goes on from
  // the last complete checkpoint of this run by itself: the steps since it are lost, nothing else.
  // Every rank decides alike from the same files; rank 0's id is the one written.
  RunId run{new_run_id(), launch_.elastic_run_id};
  if (launch_.restart_count > 0 && config_.init_from == "scratch") {
    // A run_id file of another launch is an older run's: this one's first start died before writing its own.
    const RunId recorded = read_run_id(config_.out_dir);
    const bool recorded_here = !recorded.id.empty() && recorded.launch == run.launch;
    if (recorded_here) run.id = recorded.id;
    const std::string why = restart_checkpoint_mismatch(last_path, recorded_here ? run.id : "");
    if (why.empty()) config_.init_from = "resume";
    restart_note_ = why.empty()
                        ? fmt::format("[ckpt] torchrun restarted the workers (restart {}): resuming from {}",
                                      launch_.restart_count, last_path)
                        : fmt::format("[ckpt] torchrun restarted the workers (restart {}): starting afresh, {}",
                                      launch_.restart_count, why);
  }
  CheckpointMeta resume_meta;
  const bool resume = config_.init_from == "resume";
  if (resume) {
    if (!std::filesystem::exists(last_path))
      throw std::runtime_error("[train] --init_from=resume but there is no checkpoint at '" + last_path +
                               "' (train from scratch first, or check out_dir)");
    resume_meta = read_checkpoint_meta(last_path);
    if (!resume_meta.run_id.empty()) run.id = resume_meta.run_id;  // the run goes on
    config_.set_architecture(resume_meta.model_config);  // the checkpoint decides the architecture
    config_.validate();
  }
  // init_from=DIR: a new run from another checkpoint's weights (an imported model, for a fine-tune):
  // its architecture and vocabulary, this config's dropout and schedule, step 0, a fresh optimizer.
  CheckpointMeta init_meta;
  std::string init_path;
  const bool init = !resume && config_.init_from != "scratch";
  if (init) {
    if (!std::filesystem::exists(config_.init_from))
      throw std::runtime_error("[train] --init_from=" + config_.init_from +
                               ": no such checkpoint or folder (scratch, resume, or a folder `nanogpt import --format=hf "
                               "DIR --out_dir=" + config_.init_from + "` wrote)");
    init_path = resolve_checkpoint(config_.init_from);
    init_meta = read_checkpoint_meta(init_path);
    config_.set_architecture(init_meta.model_config);
    config_.validate();
  }
  run_id_ = run.id;
  if (is_main() && !config_.eval_only) write_run_id(config_.out_dir, run);
  // Saves that a kill interrupted left their temporary files (as large as a checkpoint): rank 0
  // removes them, as the one that writes here. An evaluation leaves out_dir alone.
  io::RemovedTempFiles removed;
  if (is_main() && !config_.eval_only) removed = io::remove_dead_temp_files(config_.out_dir);
  // Only rank 0 speaks and writes; another rank's errors still reach stderr (cli/main.cpp).
  log_ = is_main() ? make_logger(config_.out_dir + "/train.log", quiet) : make_logger("", true);
  if (!restart_note_.empty()) log_->info("{}", restart_note_);
  if (removed.files > 0)
    log_->info("[ckpt] removed {} temporary file{} of interrupted saves from {} ({:.1f} MB)", removed.files,
               removed.files > 1 ? "s" : "", config_.out_dir, static_cast<double>(removed.bytes) / 1e6);
  if (launch_.launched) {
    group_ = std::make_unique<ProcessGroup>(launch_, device_, config_.backend, std::chrono::seconds(config_.ddp_timeout));
    group_->check_same("config", to_yaml(config_), "start every rank with the same config file and --key=value overrides");
  }
  // dtype auto: on a CPU a timed product decides, and two ranks could decide differently near
  // parity: every rank takes rank 0's choice (checked above as written, "auto").
  const std::string dtype = is_main() ? runtime::resolve_training_dtype(config_.dtype, device_) : std::string();
  config_.dtype = group_ ? group_->value_of_rank0("dtype", dtype) : dtype;
  amp_dtype_ = config_.autocast_dtype();
  scaler_ = std::make_unique<GradScaler>(device_, amp_dtype_ == torch::kHalf);
  // An evaluation leaves the training record alone: config.yaml describes the run that trained.
  if (!config_.eval_only && is_main())
    io::write_bytes_atomically(config_.out_dir + "/config.yaml", to_yaml(config_), "train");

  // Data: prepared on demand from dataset/input.txt, or a folder `nanogpt prepare` filled (train.bin,
  // val.bin, meta.bin). The token files are memory-mapped: start-up costs the same whatever their size.
  config_.dataset = data::dataset_dir(config_.dataset);  // NAME means data/NAME, as in nanoGPT
  data::PrepareOptions prep;
  prep.input = config_.dataset + "/input.txt";
  prep.out_dir = config_.dataset;
  prep.val_fraction = config_.val_fraction;
  prep.min_split_tokens = config_.model.block_size + 1;
  prep.tokenizer = config_.tokenizer == "bpe" ? data::TokenizerKind::Bpe : data::TokenizerKind::Char;
  prep.vocab_size = config_.vocab_size;
  const bool has_input = std::filesystem::exists(prep.input);
  if (!has_input && !std::filesystem::exists(config_.dataset + "/meta.bin"))
    throw std::runtime_error("[train] dataset '" + config_.dataset + "' has no input.txt and no meta.bin (make one with "
                             "`nanogpt prepare --input FILE_OR_FOLDER --out_dir " + config_.dataset + "`)");
  bool prepared = false;
  // Rank 0 prepares the tokens while the others wait; they then find them (a shared folder) or
  // prepare their machine's own copy.
  if (group_ && !is_main()) group_->barrier("the wait for rank 0 to prepare the data");
  auto meta = has_input ? data::ensure_prepared(prep, &prepared) : data::read_meta(config_.dataset);
  if (group_ && is_main()) group_->barrier("the wait for rank 0 to prepare the data");
  if (prepared) log_->info("{} (prepared from {}/input.txt)", data::summary_line(meta), config_.dataset);
  if (!has_input && config_.tokenizer == "bpe" &&
      (meta.vocab.kind() != data::TokenizerKind::Bpe || meta.vocab.requested_vocab_size() != config_.vocab_size))
    throw std::runtime_error(fmt::format(
        "[train] dataset '{}' holds a {} tokenizer ({} tokens), not bpe with vocab_size {}, and no input.txt to prepare "
        "again: drop --tokenizer/--vocab_size (the folder's own tokenizer trains), or run `nanogpt prepare` with them",
        config_.dataset, meta.vocab.kind_name(), meta.vocab.size(), config_.vocab_size));
  vocab_ = meta.vocab;
  val_tokens_per_char_ = data::val_tokens_per_char(meta);
  if (init && !(init_meta.vocab == vocab_))
    throw std::runtime_error(fmt::format(
        "[train] --init_from={} holds a {} vocabulary of {} tokens, dataset '{}' a {} one of {}: tokenize the text "
        "with it (nanogpt prepare --tokenizer_from={} --input FILE --out_dir DIR) and train on that",
        config_.init_from, init_meta.vocab.kind_name(), init_meta.vocab.size(), config_.dataset, vocab_.kind_name(),
        vocab_.size(), config_.init_from));
  if (resume && !(resume_meta.vocab == vocab_))
    throw std::runtime_error(fmt::format(
        "[train] the checkpoint's vocabulary ({}, {} tokens) differs from dataset '{}' ({}, {} tokens): resume with "
        "the dataset it was trained on",
        resume_meta.vocab.kind_name(), resume_meta.vocab.size(), config_.dataset, vocab_.kind_name(), vocab_.size()));
  train_tokens_ = data::map_token_file(config_.dataset + "/train.bin",
                                       {vocab_.size(), meta.train_tokens, meta.train_checksum, config_.verify_data});
  val_tokens_ = data::map_token_file(config_.dataset + "/val.bin",
                                     {vocab_.size(), meta.val_tokens, meta.val_checksum, config_.verify_data});
  if (config_.verify_data) log_->info("[data] verify_data: every token of train.bin and val.bin checked");
  if (group_) {
    const std::string vocab_text = vocab_.serialize();
    group_->check_same("dataset",
                       fmt::format("vocab {} characters, checksum {:016x}\ntrain {} tokens, checksum {:016x}\nval {} tokens, "
                                   "checksum {:016x}",
                                   vocab_.size(), fnv1a(vocab_text.data(), vocab_text.size()), meta.train_tokens,
                                   meta.train_checksum, meta.val_tokens, meta.val_checksum),
                       "every rank must read the same dataset: copy the dataset folder to every machine");
  }
  sampler_ = std::make_unique<data::BatchSampler>(train_tokens_, config_.batch_size, config_.model.block_size,
                                                  config_.seed, vocab_.size());
  batch_ = std::make_unique<DeviceBatch>(config_.batch_size, config_.model.block_size, device_);
  // The val split only needs one window; check it now rather than at the first evaluation.
  data::BatchSampler(val_tokens_, 1, config_.model.block_size, 0);

  torch::manual_seed(static_cast<uint64_t>(config_.seed));
  if (!init) config_.model.vocab_size = vocab_.size();  // an imported model may have more rows than tokens
  model_ = model::GPT(config_.model);
  model_->to(device_);
  optimizer_ = std::make_unique<FlatAdamW>(*model_, optimizer_options(config_));
  schedule_ = LrSchedule{config_.learning_rate, config_.min_lr,          config_.warmup_iters, config_.lr_decay_iters,
                         config_.decay_lr,      config_.lr_schedule == "wsd", config_.decay_frac};

  if (init) {
    load_checkpoint(init_path, &model_, nullptr);
    log_->info("[ckpt] weights from {}: a new run from step 0 with a fresh optimizer", init_path);
  }
  if (resume) {
    auto state = load_checkpoint(last_path, &model_, optimizer_.get());
    sampler_->restore_state(state.sampler_state);
    set_rng_state(torch::kCPU, state.torch_rng_state);
    if (device_.is_cuda() && state.cuda_rng_state.defined()) set_rng_state(device_, state.cuda_rng_state);
    iter_ = state.iter;
    best_val_loss_ = state.best_val_loss;
    resumed_eval_done_ = state.eval_done;
    if (scaler_->enabled()) scaler_->restore(state.loss_scale, state.loss_scale_growth);
    log_->info("[ckpt] resumed from {} at iter {} (best val {:.4f})", last_path, iter_, best_val_loss_);
    if (config_.decay_lr && iter_ >= config_.lr_decay_iters && config_.max_iters > iter_)
      log_->info("[train] resuming at iter {}, at or past lr_decay_iters ({}): every step from here runs at min_lr {:g} "
                 "(raise lr_decay_iters with max_iters to decay over the longer run)",
                 iter_, config_.lr_decay_iters, config_.min_lr);
    if (state.world_size != world_)
      log_->info("[ddp] the checkpoint was written by {} process{}, resuming with {}: the same {} micro-batches per "
                 "step, {} per process, so the run goes on as it would have",
                 state.world_size, state.world_size > 1 ? "es" : "", world_, config_.gradient_accumulation_steps,
                 local_micro_steps_);
  }
  if (group_) {
    const auto bucket_bytes = static_cast<int64_t>(config_.ddp_bucket_mb * 1024 * 1024);
    std::vector<torch::Tensor> params;
    for (const auto& p : model_->parameters()) params.push_back(p);
    grad_reduce_ = std::make_unique<GradientAllReduce>(*group_, optimizer_->flat_grads(), params, bucket_bytes);
  }
}

std::string Trainer::restart_checkpoint_mismatch(const std::string& path, const std::string& run_id) const {
  if (!std::filesystem::exists(path)) return fmt::format("as out_dir holds no checkpoint ('{}')", path);
  CheckpointMeta meta;
  try {
    meta = read_checkpoint_meta(path);
  } catch (const std::exception& e) {
    return fmt::format("as '{}' does not load ({})", path, e.what());
  }
  if (run_id.empty())
    return fmt::format("as '{}/{}' names no run of this torchrun launch", config_.out_dir, kRunIdFile);
  if (meta.run_id != run_id)
    return fmt::format("as '{}' was written by another run (run id '{}', this run's is '{}')", path, meta.run_id,
                       run_id);
  return "";
}

std::pair<torch::Tensor, torch::Tensor> Trainer::next_micro_batch() {
  // One stream of micro-batches for the whole step, as one process would draw them; rank r runs
  // micro-batches [r L, (r+1) L) of it (L = local_micro_steps_) and skips the rest.
  if (micro_ == 0) sampler_->skip(rank_ * local_micro_steps_);
  const int64_t global_micro = rank_ * local_micro_steps_ + micro_;
  // Dropout's masks follow (seed, iteration, micro-batch): the same on any number of processes,
  // and after a resume, whatever ran before.
  {
    auto gen = default_generator(device_);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(static_cast<uint64_t>(config_.seed) * 0x9e3779b97f4a7c15ULL ^
                         (static_cast<uint64_t>(iter_) << 20) ^ static_cast<uint64_t>(global_micro));
  }
  batch_->load(*sampler_);
  if (++micro_ == local_micro_steps_) {
    sampler_->skip((world_ - 1 - rank_) * local_micro_steps_);
    micro_ = 0;
  }
  return {batch_->x(), batch_->y()};
}

std::pair<double, int> Trainer::reduce_step(const torch::Tensor& loss_sum) {
  const int local_signal = StopSignals::received();
  if (!group_) return {loss_sum.item<double>(), local_signal};
  // One small all-reduce: [loss sum, ranks that saw SIGINT, ranks that saw SIGTERM].
  auto pack = torch::stack({loss_sum.to(torch::kFloat).reshape({}),
                            torch::tensor(local_signal == SIGINT ? 1.0f : 0.0f).to(device_),
                            torch::tensor(local_signal == SIGTERM ? 1.0f : 0.0f).to(device_)});
  group_->all_reduce_sum({pack}, fmt::format("the loss all-reduce at iter {}", iter_).c_str());
  const auto host = pack.cpu();
  const float* v = host.data_ptr<float>();
  return {v[0], v[1] > 0 ? SIGINT : v[2] > 0 ? SIGTERM : 0};
}

void Trainer::log_start() {
  const int64_t tokens_per_iter = config_.gradient_accumulation_steps * config_.batch_size * config_.model.block_size;
  log_->info("number of parameters: {:.2f}M", model_->num_params() / 1e6);
  log_->info("[train] tokens per iteration will be: {}", tokens_per_iter);
  // The OpenMP spin count the runtime started with (cli/openmp_env.cpp sets it for the nanogpt program).
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const std::string waits = policy ? fmt::format("OpenMP wait {}", policy)
                                   : fmt::format("OpenMP spin {}", spin ? spin : "default");
  log_->info("[train] device {} | dtype {} | threads {} ({}) | malloc {} | {} layers, {} heads, {} embd, block {}, vocab {} | {} positions, {}",
             device_.str(), config_.dtype, torch::get_num_threads(), waits, runtime::allocator_name(), config_.model.n_layer,
             config_.model.n_head, config_.model.n_embd, config_.model.block_size, vocab_.size(), config_.model.pos_encoding,
             config_.model.norm);
}

double Trainer::estimate_loss(const std::string& split) {
  torch::NoGradGuard no_grad;
  model_->eval();
  // A fresh generator per evaluation: the same batches whenever this iteration is evaluated, and
  // the training generator is never touched (resume stays exact).
  const uint64_t salt = split == "val" ? 0x9e3779b97f4a7c15ULL : 0xc2b2ae3d27d4eb4fULL;
  data::BatchSampler eval_sampler(split == "val" ? val_tokens_ : train_tokens_, config_.batch_size, config_.model.block_size,
                                  static_cast<uint64_t>(config_.seed) ^ salt ^ static_cast<uint64_t>(iter_), vocab_.size());
  torch::Tensor sum = torch::zeros({}, torch::TensorOptions().device(device_));
  for (int64_t k = 0; k < config_.eval_iters; ++k) {
    if (k % world_ != rank_) {  // another rank's batch
      eval_sampler.skip(1);
      continue;
    }
    auto [x_host, y_host] = eval_sampler.next(torch::kCPU);
    auto [x, y] = runtime::to_device(x_host, y_host, device_);
    runtime::AutocastGuard autocast(device_, amp_dtype_, amp_dtype_ != torch::kFloat);
    sum += model_->forward(x, y).second.to(torch::kFloat);
  }
  if (group_) group_->all_reduce_sum({sum}, fmt::format("the evaluation at iter {}", iter_).c_str());
  model_->train();
  return sum.item<double>() / static_cast<double>(config_.eval_iters);
}

std::pair<double, double> Trainer::evaluate() {
  const double train_loss = estimate_loss("train"), val_loss = estimate_loss("val");
  // Bits per character, whatever the tokenizer: nats per token x tokens per character / ln 2.
  log_->info("[eval] iter {} | train {:.4f} | val {:.4f} | val bits/char {:.4f}", iter_, train_loss, val_loss,
             val_loss * val_tokens_per_char_ / std::log(2.0));
  return {train_loss, val_loss};
}

void Trainer::save(const std::vector<std::string>& paths, bool eval_done) {
  CheckpointMeta meta;
  meta.iter = iter_;
  meta.best_val_loss = best_val_loss_;
  meta.config_yaml = to_yaml(config_);
  meta.model_config = model_->config();
  meta.vocab = vocab_;
  meta.sampler_state = sampler_->state();
  meta.torch_rng_state = get_rng_state(torch::kCPU);
  if (device_.is_cuda()) meta.cuda_rng_state = get_rng_state(device_);
  meta.eval_done = eval_done;
  meta.loss_scale = scaler_->current_scale();
  meta.loss_scale_growth = scaler_->growth_tracker();
  meta.world_size = world_;
  meta.run_id = run_id_;
  writer_->save(paths, checkpoint_content(model_, *optimizer_, meta), iter_);  // logs "[ckpt] saved ..."
}

std::string Trainer::out_of_memory_message() const {
  return fmt::format(
      "[train] out of memory on {} at iter {} (batch_size {}, block_size {}, {:.2f}M parameters, dtype {}): "
      "lower batch_size and raise gradient_accumulation_steps to keep the tokens per step (e.g. --batch_size={} "
      "--gradient_accumulation_steps={}), or lower block_size",
      device_.str(), iter_, config_.batch_size, config_.model.block_size, model_->num_params() / 1e6, config_.dtype,
      std::max<int64_t>(1, config_.batch_size / 2), config_.gradient_accumulation_steps * 2);
}

TrainResult Trainer::run() {
  try {
    TrainResult result = run_loop();
    writer_.reset();  // idle by now (run_loop finished it): the thread and the snapshot's memory go
    return result;
  } catch (const std::exception& e) {
    // The save in flight completes first: the last checkpoint on disk is whole when the error is
    // reported (an error of that save, too, is logged, after this one's cause).
    if (writer_) {
      const std::string save_error = writer_->finish_quietly();
      if (!save_error.empty()) log_->warn("{}", save_error);
      writer_.reset();
    }
    // A CUDA out-of-memory error carries the caching allocator's multi-line report: say instead
    // what to change. The checkpoints on disk are untouched.
    if (runtime::is_out_of_memory(e)) throw std::runtime_error(out_of_memory_message());
    if (dynamic_cast<const DistributedError*>(&e))
      throw DistributedError(fmt::format("{}; at iter {}, the last checkpoint '{}/{}' is intact: start again "
                                         "with --init_from=resume",
                                         e.what(), iter_, config_.out_dir, kLastCheckpoint));
    throw;
  }
}

TrainResult Trainer::run_loop() {
  if (config_.eval_only) {
    // The model as loaded, evaluated once: no step, and the checkpoints and metrics.csv stay as
    // they are (a resumed checkpoint's own evaluation may already have run: this one runs anyway).
    log_start();
    TrainResult result;
    result.iter = iter_;
    result.best_val_loss = best_val_loss_;
    result.last_val_loss = evaluate().second;
    return result;
  }
  StopSignals signals(/*repeat_kills=*/!launch_.launched);
  if (is_main()) writer_ = std::make_unique<CheckpointWriter>(log_, config_.checkpoint_async);
  const std::string metrics_path = config_.out_dir + "/metrics.csv";
  const bool resumed = config_.init_from == "resume";
  std::optional<io::MetricsLog> metrics;  // rank 0's
  if (is_main()) metrics.emplace(metrics_path, resumed ? iter_ : -1, resumed_eval_done_);
  log_start();
  if (group_)
    log_->info("[ddp] {} process{} ({}), {} of the {} micro-batches per step each; gradients in {} all-reduce bucket{}",
               world_, world_ > 1 ? "es" : "", group_->backend_name(), local_micro_steps_, config_.gradient_accumulation_steps,
               grad_reduce_->num_buckets(), grad_reduce_->num_buckets() > 1 ? "s" : "");
  // MFU: on a GPU against its datasheet's dense bf16 peak (nanoGPT's convention, whatever the run's
  // dtype); on a CPU, or a GPU not in the table, against a GEMM timed here in the run's dtype.
  const std::string gpu = runtime::device_name(device_);
  peak_flops_ = runtime::datasheet_bf16_flops(gpu);
  if (peak_flops_ > 0) {
    log_->info("[train] MFU is against the {}'s dense bf16 peak of {:.0f} TFLOP/s (datasheet)", gpu, peak_flops_ / 1e12);
  } else {
    peak_flops_ = runtime::measure_peak_flops(device_, amp_dtype_);
    log_->info("[train] MFU is against a measured {} GEMM peak of {:.0f} GFLOP/s", config_.dtype, peak_flops_ / 1e9);
  }
  runtime::reset_peak_gpu_memory(device_);

  const int64_t tokens_per_iter = config_.gradient_accumulation_steps * config_.batch_size * config_.model.block_size;
  const double flops_per_iter = model_->flops_per_token() * static_cast<double>(tokens_per_iter);
  const auto run_start = Clock::now();
  auto last_save = Clock::now();  // checkpoint_minutes counts from here
  bool plot_warned = false;        // a figure that cannot be drawn is said once, not at every eval
  std::vector<double> step_ms;
  bool skip_eval = resumed_eval_done_;
  StepOptions step_options;
  step_options.gradient_accumulation_steps = local_micro_steps_;
  step_options.world_size = world_;
  step_options.all_reduce = grad_reduce_.get();
  step_options.grad_clip = config_.grad_clip;
  step_options.autocast_dtype = amp_dtype_;
  step_options.scaler = scaler_->enabled() ? scaler_.get() : nullptr;
  step_options.device = device_;
  const auto graphs = resolve_cuda_graphs(config_.cuda_graphs, device_, world_, optimizer_->fused());
  if (!graphs.note.empty()) log_->info("{}", graphs.note);
  if (graphs.on) {
    graphed_ = std::make_unique<GraphedStep>(model_, *optimizer_, step_options, kEagerStepsBeforeGraphs,
                                             [this](const std::string& line) { log_->warn("{}", line); });
    log_->info("[train] CUDA graphs: each step replayed as graphs after {} eager steps (cuda_graphs: {})",
               kEagerStepsBeforeGraphs, config_.cuda_graphs);
  }
  double last_val = std::nan("");
  TrainResult result;
  model_->train();

  for (;;) {
    const bool at_end = iter_ >= config_.max_iters;
    if ((iter_ % config_.eval_interval == 0 || at_end) && !skip_eval) {
      const auto [train_loss, val_loss] = evaluate();
      last_val = val_loss;
      const double lr = schedule_.at(iter_);
      if (metrics) {
        metrics->row(iter_, "train_eval", train_loss, lr, 0, 0);
        metrics->row(iter_, "val", val_loss, lr, 0, 0);
      }
      if (!std::isfinite(val_loss) || !std::isfinite(train_loss))
        throw std::runtime_error(fmt::format(
            "[train] evaluation loss is not finite at iter {}: stopping; the last good checkpoint is untouched (try a "
            "lower learning_rate)",
            iter_));
      if (config_.plot && is_main()) {
        try {
          viz::plot_loss_curves(metrics_path, config_.out_dir + "/loss.png");
        } catch (const std::exception& e) {
          if (!std::exchange(plot_warned, true)) log_->warn("[plot] {} (said once per run)", e.what());
        }
      }
      const bool improved = val_loss < best_val_loss_;
      best_val_loss_ = std::min(best_val_loss_, val_loss);
      if (iter_ > 0 && is_main()) {  // one snapshot for both files
        std::vector<std::string> paths = {config_.out_dir + "/" + kLastCheckpoint};
        if (improved || config_.always_save_checkpoint) paths.push_back(config_.out_dir + "/" + kBestCheckpoint);
        save(paths, true);
        last_save = Clock::now();
      }
    }
    skip_eval = false;
    if (at_end) break;

    const bool log_now = iter_ % config_.log_interval == 0;
    // A CUDA step is timed between two synchronisations, so its time is the GPU's own (not the
    // launches', nor the step before it): on the steps that log, to keep the queue full on the others.
    const bool timed = log_now || !device_.is_cuda();
    if (timed) runtime::synchronize(device_);
    const auto t0 = Clock::now();
    const double lr = schedule_.at(iter_);
    auto loss_sum = graphed_ ? graphed_->step([this] { return next_micro_batch(); }, lr)
                             : train_step(model_, *optimizer_, [this] { return next_micro_batch(); }, lr, step_options);
    if (timed) runtime::synchronize(device_);
    const double ms = ms_since(t0);
    if (timed) step_ms.push_back(ms);
    double loss_value = 0;
    int stop_signal = 0;
    // On CPU reading the loss costs nothing: check every step. With several processes the loss and
    // the stop signal are summed over them every step (one small all-reduce).
    if (log_now || !device_.is_cuda() || group_) {
      double total = 0;
      std::tie(total, stop_signal) = reduce_step(loss_sum);
      loss_value = total / static_cast<double>(config_.gradient_accumulation_steps);
      if (!std::isfinite(loss_value))
        throw std::runtime_error(fmt::format(  // {:f}: six decimals, the message's text before fmt
            "[train] loss is not finite at iter {} (lr {:f}): stopping; the last good checkpoint '{}/{}' is untouched "
            "(try a lower learning_rate or dtype: float32)",
            iter_, lr, config_.out_dir, kLastCheckpoint));
    }
    if (log_now) {
      const double tps = tokens_per_iter / (ms / 1000.0);
      const double mfu = flops_per_iter / static_cast<double>(world_) / (ms / 1000.0) / peak_flops_;  // per process
      log_step(*log_, {iter_, config_.max_iters, loss_value, lr, ms, tps, mfu, ms_since(run_start) / 1000.0,
                       static_cast<int64_t>(step_ms.size())});
      if (metrics) metrics->row(iter_, "train", loss_value, lr, ms, tps);
    }
    ++iter_;
    if (step_hook_) step_hook_(iter_);
    if (writer_) writer_->check();  // a background save that failed stops the run here, as it would have then
    // Checkpoints on their own clock, between evaluations (an evaluation's own save comes next).
    const bool at_eval = iter_ % config_.eval_interval == 0 || iter_ >= config_.max_iters;
    const bool by_count = config_.checkpoint_interval > 0 && iter_ % config_.checkpoint_interval == 0;
    const bool by_clock = config_.checkpoint_minutes > 0 && ms_since(last_save) >= config_.checkpoint_minutes * 60e3;
    if (is_main() && !at_eval && (by_count || by_clock)) {
      save({config_.out_dir + "/" + kLastCheckpoint}, false);
      last_save = Clock::now();
    }

    // Alone: a signal that came after the loss was read (the step hook), or on a CUDA step that did not read it.
    if (!group_ && stop_signal == 0) stop_signal = StopSignals::received();
    if (const int sig = stop_signal) {
      log_->info("[train] signal {} received: saving and stopping at iter {}", sig, iter_);
      if (is_main()) save({config_.out_dir + "/" + kLastCheckpoint}, false);
      result.exit_code = 128 + sig;
      break;
    }
  }

  if (writer_) writer_->finish();  // the last checkpoint is on disk, whole, before the run reports done
  result.iter = iter_;
  result.best_val_loss = best_val_loss_;
  result.last_val_loss = last_val;
  const size_t skip = std::min<size_t>(step_ms.size() / 2, 10);  // warm-up steps
  result.median_ms = median_after(step_ms, skip);
  log_->info("[train] done at iter {} | best val {:.4f} | median {:.2f} ms/iter | wall {:.1f} s", iter_, best_val_loss_,
             result.median_ms, ms_since(run_start) / 1000.0);
  if (device_.is_cuda()) {
    const auto memory = runtime::peak_gpu_memory(device_);
    result.peak_gpu_allocated_mb = static_cast<double>(memory.peak_allocated) / (1 << 20);
    log_->info("[train] peak GPU memory: {:.0f} MiB held by tensors, {:.0f} MiB reserved by the caching allocator",
               result.peak_gpu_allocated_mb, static_cast<double>(memory.peak_reserved) / (1 << 20));
  }
  if (grad_reduce_ && !grad_reduce_->exposed_ms().empty()) {
    const auto& waits = grad_reduce_->exposed_ms();  // one per step, like step_ms
    log_->info("[ddp] gradient all-reduce: median {:.2f} ms per step left waiting after the backward pass ({} bucket{})",
               median_after(waits, std::min(skip, waits.size() - 1)), grad_reduce_->num_buckets(),
               grad_reduce_->num_buckets() > 1 ? "s" : "");
  }
  return result;
}

}  // namespace nanogpt::train
