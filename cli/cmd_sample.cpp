// nanogpt sample: nanoGPT's sample.py with a KV cache, top-p, stop strings, streaming, beam search
// and per-token probabilities.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "io/text.h"
#include "data/utf8.h"
#include "runtime/device.h"
#include "model/generate.h"
#include "model/static_decoder.h"
#include "runtime/cuda_plugin.h"
#include "train/checkpoint.h"

namespace nanogpt::cli {
namespace {

struct SampleArgs {
  std::string out_dir = "out";
  std::string ckpt;
  std::string start = "\n";
  int64_t num_samples = 10;
  int64_t max_new_tokens = 500;
  double temperature = 0.8;
  int64_t top_k = 200;
  double top_p = 1.0;
  int64_t seed = 1337;
  std::string device = "auto";
  std::string dtype = "auto";
  std::string quantize = "none";
  std::string decoder = "auto";
  int64_t max_context = 0;
  int64_t num_threads = 0;
  bool stream = false;
  bool batch = false;
  bool no_cache = false;
  bool exact_window = false;
  int64_t beam = 0;
  bool length_norm = false;
  bool show_probs = false;
  bool skip_unknown = false;
  std::string stop;
};

void check(const SampleArgs& a) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("[sample] " + m); };
  if (a.num_samples < 1) bad("--num_samples must be >= 1");
  if (a.max_new_tokens < 0) bad("--max_new_tokens must be >= 0");
  if (a.dtype != "auto" && a.dtype != "float32" && a.dtype != "bfloat16" && a.dtype != "float16")
    bad("--dtype (" + a.dtype + ") must be auto, float32, bfloat16 or float16");
  if (a.quantize != "none" && a.quantize != "int8" && a.quantize != "int4")
    bad("--quantize (" + a.quantize + ") must be none, int8 or int4");
  if (a.quantize != "none" && a.no_cache)
    bad("--quantize " + a.quantize + " runs in the decoder, which needs the KV cache: drop --no_cache");
  if (a.stream && a.batch) bad("--stream prints one sample at a time: drop --batch");
  if (a.decoder != "auto" && a.decoder != "graph" && a.decoder != "static" && a.decoder != "general")
    bad("--decoder (" + a.decoder + ") must be auto, graph, static or general");
  if ((a.decoder == "graph" || a.decoder == "static") && (a.no_cache || a.quantize != "none" || a.beam > 0))
    bad("--decoder " + a.decoder + " samples through the static KV cache: drop --no_cache, --quantize and --beam");
  if (a.max_context < 0) bad(fmt::format("--max_context ({}) must be >= 1 (0 = block_size)", a.max_context));
  if (a.max_context > 0 && (a.decoder == "general" || a.no_cache || a.quantize != "none"))
    bad("--max_context sizes the static KV cache (--decoder static or graph): drop --decoder=general, --no_cache and "
        "--quantize");
  if (a.beam < 0) bad("--beam must be >= 0 (0 = sample, 1 = greedy, K = beam search with K beams)");
  if (a.beam > 0 && (a.stream || a.batch || a.show_probs || a.no_cache))
    bad("--beam prints its K results at the end: drop --stream, --batch, --show_probs and --no_cache");
}

std::vector<int64_t> encode_prompt(const SampleArgs& a, const data::Vocab& vocab) {
  std::string text = a.start;
  if (text.rfind("FILE:", 0) == 0) text = io::read_file(text.substr(5), "sample");
  std::vector<int64_t> ids;
  if (a.skip_unknown) {
    std::u32string skipped;
    ids = vocab.encode(text, data::UnknownChars::Skip, &skipped);
    if (!skipped.empty()) {
      std::string names;
      for (size_t i = 0; i < skipped.size() && i < 10; ++i) names += (i ? ", " : "") + data::describe_char(skipped[i]);
      std::fprintf(stderr, "[sample] warning: dropped %zu prompt character(s) not in the vocabulary: %s%s\n", skipped.size(),
                   names.c_str(), skipped.size() > 10 ? ", ..." : "");
    }
  } else {
    try {
      ids = vocab.encode(text);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string(e.what()) + "; --skip_unknown drops them");
    }
  }
  if (ids.empty()) throw std::invalid_argument("[sample] the prompt is empty (give --start=TEXT)");
  return ids;
}

// One token for a table: quoted, with control characters (a newline) escaped.
std::string quoted(const data::Vocab& vocab, int64_t token) {
  return "'" + io::printable(vocab.piece(token), io::Escape::controls) + "'";
}

// --show_probs: the token drawn, its probability and the most likely alternatives.
std::string describe_step(const data::Vocab& vocab, int64_t token, const torch::Tensor& probs) {  // probs (V,)
  auto [p, ids] = probs.topk(std::min<int64_t>(4, probs.size(0)));
  std::string alternatives;
  for (int64_t i = 0, shown = 0; i < p.size(0) && shown < 3; ++i) {
    const int64_t id = ids[i].item<int64_t>();
    if (id == token || p[i].item<double>() <= 0.0) continue;
    alternatives += fmt::format("{}{} {:.3f}", shown++ ? ", " : "", quoted(vocab, id), p[i].item<double>());
  }
  return fmt::format("{:>8} {:.3f}  {}\n", quoted(vocab, token), probs[token].item<double>(), alternatives);
}

// Tracks one sample's generated text and whether it has reached the stop string.
struct SampleText {
  std::string text;
  std::string probs;  // --show_probs: one line per generated token
  bool done = false;
  void add(const std::string& piece, const std::string& stop) {
    if (done) return;
    text += piece;
    if (!stop.empty()) {
      const auto at = text.find(stop, text.size() > piece.size() + stop.size() ? text.size() - piece.size() - stop.size() : 0);
      if (at != std::string::npos) {
        text.resize(at + stop.size());  // end the sample right after the stop string
        done = true;
      }
    }
  }
};

model::Quantize quantize_of(const std::string& name) {  // after check()
  return name == "int8" ? model::Quantize::int8 : name == "int4" ? model::Quantize::int4 : model::Quantize::none;
}

// --beam=K: the K most probable continuations, best first, each with its log-probability.
void run_beam(const SampleArgs& a, train::LoadedModel& loaded, const std::vector<int64_t>& prompt,
              const std::string& prompt_text) {
  model::BeamOptions options;
  options.width = a.beam;
  options.length_normalize = a.length_norm;
  options.exact_window = a.exact_window;
  options.quantize = quantize_of(a.quantize);
  options.max_context = a.max_context;
  const size_t P = prompt.size();
  auto generated_text = [&](const std::vector<int64_t>& tokens) {
    SampleText text;
    for (size_t i = P; i < tokens.size() && !text.done; ++i) text.add(loaded.vocab.decode_one(tokens[i]), a.stop);
    return text;
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto beams = model::beam_search(loaded.model, prompt, a.max_new_tokens, options,
                                  [&](const std::vector<int64_t>& tokens) { return generated_text(tokens).done; });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < beams.size(); ++i) {
    const auto& beam = beams[i];
    std::string shown = data::replace_invalid_utf8(prompt_text + generated_text(beam.tokens).text);
    shown += fmt::format("\n[beam {}/{}] log-probability {:.4f} over {} tokens ({:.4f} per token)", i + 1, beams.size(),
                         beam.log_prob, beam.generated, beam.log_prob / std::max<int64_t>(1, beam.generated));
    std::fwrite(shown.data(), 1, shown.size(), stdout);
    std::fputs("\n---------------\n", stdout);
  }
  std::fflush(stdout);
  std::fprintf(stderr, "[sample] beam search, %lld beams, %lld new tokens in %.2f s\n", static_cast<long long>(a.beam),
               static_cast<long long>(a.max_new_tokens), seconds);
}

void run_sample(const SampleArgs& a) {
  check(a);
  model::SamplingOptions options;
  options.temperature = a.temperature;
  options.top_k = a.top_k;
  options.top_p = a.top_p;
  options.use_cache = !a.no_cache;
  options.exact_window = a.exact_window;
  options.quantize = quantize_of(a.quantize);
  options.validate();
  runtime::set_threads(a.num_threads);
  const auto device = runtime::resolve_device(a.device);
  auto loaded = train::load_model(train::resolve_checkpoint(a.ckpt.empty() ? a.out_dir : a.ckpt), device);
  const int64_t block_size = loaded.model->config().block_size;
  if (a.max_context > block_size)
    throw std::invalid_argument(fmt::format(
        "[sample] --max_context ({}) is longer than the model's block_size ({}): it has seen no longer window; give at "
        "most {} (0 = block_size)",
        a.max_context, block_size, block_size));
  // Autocast for the whole run, as sample.py's ctx: fp32 weights, products in the low precision
  // (the static decoder converts its weights to that precision once instead).
  const std::string dtype = runtime::resolve_sampling_dtype(a.dtype, device);
  const auto autocast_dtype = runtime::autocast_dtype(dtype);
  runtime::AutocastGuard autocast(device, autocast_dtype, autocast_dtype != torch::kFloat);
  const auto prompt = encode_prompt(a, loaded.vocab);
  const std::string prompt_text = loaded.vocab.decode(prompt);
  if (a.beam > 0) return run_beam(a, loaded, prompt, prompt_text);
  std::mt19937_64 rng(static_cast<uint64_t>(a.seed));
  torch::manual_seed(static_cast<uint64_t>(a.seed));
  // auto: on a GPU the static KV cache with its step as a CUDA graph (a token is a few hundred
  // kernel launches otherwise); on the CPU the general path and its hand-written decoder, unless
  // --max_context asks for the static cache's shorter window.
  const bool can_static = !a.no_cache && a.quantize == "none";
  const std::string decoder = a.decoder != "auto"                ? a.decoder
                              : device.is_cuda() && can_static ? "graph"
                              : a.max_context > 0              ? "static"
                                                               : "general";
  std::unique_ptr<model::StaticDecoder> static_decoder;  // made and captured before the clock starts
  if (decoder != "general") {
    static_decoder = std::make_unique<model::StaticDecoder>(loaded.model, a.batch ? a.num_samples : 1, autocast_dtype,
                                                            a.exact_window, a.max_context);
    const auto* plugin = runtime::cuda_plugin();
    if (decoder == "graph") {
      const std::string failed =
          device.is_cuda() && plugin ? static_decoder->capture(plugin->decode_graphs()) : "graphs need a CUDA device";
      if (!failed.empty()) std::fprintf(stderr, "[sample] no CUDA graph, decoding kernel by kernel: %s\n", failed.c_str());
    }
  }

  int64_t generated = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto print_sample = [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fputs("\n---------------\n", stdout);  // nanoGPT's separator
    std::fflush(stdout);
  };
  const int64_t rounds = a.batch ? 1 : a.num_samples;
  const int64_t per_round = a.batch ? a.num_samples : 1;
  for (int64_t r = 0; r < rounds; ++r) {
    std::vector<SampleText> texts(per_round);
    if (a.stream) {
      std::fwrite(prompt_text.data(), 1, prompt_text.size(), stdout);
      std::fflush(stdout);
    }
    auto on_token = [&](const std::vector<int64_t>& tokens, const torch::Tensor& probs) {
      bool all_done = true;
      for (size_t b = 0; b < tokens.size(); ++b) {
        if (texts[b].done) continue;
        if (a.show_probs) texts[b].probs += describe_step(loaded.vocab, tokens[b], probs[b]);
        const size_t before = texts[b].text.size();
        texts[b].add(loaded.vocab.decode_one(tokens[b]), a.stop);
        ++generated;
        if (a.stream) {
          std::fwrite(texts[b].text.data() + before, 1, texts[b].text.size() - before, stdout);
          std::fflush(stdout);
        }
        all_done = all_done && texts[b].done;
      }
      return !all_done;
    };
    if (decoder == "general") {
      model::generate(loaded.model, prompt, per_round, a.max_new_tokens, options, rng, on_token);
    } else {  // the static KV cache, its step replayed as a CUDA graph or run eagerly
      model::generate_static(*static_decoder, prompt, per_round, a.max_new_tokens, options, on_token, a.show_probs);
    }
    for (auto& t : texts) {
      // A bpe model may stop inside a character's byte pieces: those bytes show as U+FFFD.
      std::string shown = a.stream ? "" : data::replace_invalid_utf8(prompt_text + t.text);
      if (a.show_probs) shown += "\n[probs]    token     p  most likely alternatives\n" + t.probs;
      print_sample(shown);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string cache =
      a.no_cache        ? "no cache"
      : !static_decoder ? "KV cache"
                        : fmt::format("static KV cache of {} positions{}", static_decoder->window(),
                                      static_decoder->graphed() ? ", CUDA graphs" : "");
  std::fprintf(stderr, "[sample] %lld tokens in %.2f s: %.0f tok/s (%s, %s, %s, %s)\n", static_cast<long long>(generated),
               seconds, generated / std::max(seconds, 1e-9), cache.c_str(),
               a.batch ? fmt::format("batch of {}", a.num_samples).c_str() : "one sample at a time",
               device.str().c_str(), (dtype + (a.quantize != "none" ? ", " + a.quantize + " weights" : "")).c_str());
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint (KV cache, temperature, top-k, top-p)");
  auto a = std::make_shared<SampleArgs>();
  cmd->add_option("--out_dir", a->out_dir, "Training folder: reads ckpt_best.safetensors, else ckpt_last.safetensors")->capture_default_str();
  cmd->add_option("--ckpt", a->ckpt, "A checkpoint file (instead of --out_dir)");
  cmd->add_option("--start", a->start, "Prompt text, or FILE:path to read it from a file (default: one newline)")
      ->default_str("\\n");  // shown escaped: the newline itself would break the help line
  cmd->add_option("--num_samples", a->num_samples, "Number of samples")->capture_default_str();
  cmd->add_option("--max_new_tokens", a->max_new_tokens, "Tokens generated per sample")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "Softmax temperature; 0 = greedy (argmax)")->capture_default_str();
  cmd->add_option("--top_k", a->top_k, "Keep the k most likely tokens; 0 = off")->capture_default_str();
  cmd->add_option("--top_p", a->top_p, "Nucleus sampling: keep the smallest set with this much probability; 1 = off")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Random seed: same seed, same samples")->capture_default_str();
  cmd->add_option("--device", a->device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  cmd->add_option("--dtype", a->dtype,
                  "float32 | bfloat16 | float16 (autocast: the products in that precision) | auto (float32 on a GPU, "
                  "where a token at a time is bound by kernel launches and autocast only adds casts; on a CPU "
                  "bfloat16 where it multiplies it in hardware, else float32)")
      ->capture_default_str();
  cmd->add_option("--quantize", a->quantize,
                  "none | int8: the weight matrices and their inputs in int8 (dynamic quantization) | int4: the "
                  "blocks' matrices in 4 bits (a scale and a minimum every 64 weights), their inputs in int8; either "
                  "keeps the KV cache in int8 too; on the CPU, faster sampling, slightly less exact (docs/performance.md)")
      ->capture_default_str();
  cmd->add_option("--decoder", a->decoder,
                  "auto (graph on a GPU, general on a CPU) | graph (a preallocated KV cache, one token's step, "
                  "sampling included, captured as a CUDA graph once and replayed) | static (the same step run "
                  "kernel by kernel) | general (the model's own forward with a growing KV cache)")
      ->capture_default_str();
  cmd->add_option("--max_context", a->max_context,
                  "Tokens a prediction sees at most, and the static KV cache's length per sample (less memory): the "
                  "last N tokens, as a model of block_size N would; RoPE models slide their window past it as past "
                  "block_size; 0 = block_size. Samples through the static KV cache (--decoder auto picks it on a CPU); "
                  "beam search recomputes its last N tokens")
      ->capture_default_str();
  cmd->add_option("--num_threads", a->num_threads, "CPU threads; 0 = all cores")->capture_default_str();
  cmd->add_option("--stop", a->stop, "End a sample right after this string (e.g. a blank line, or 。)");
  cmd->add_flag("--stream", a->stream, "Print characters as they are generated");
  cmd->add_flag("--batch", a->batch, "Generate all samples together as one batch (faster; no streaming)");
  cmd->add_flag("--no_cache", a->no_cache,
                "No KV cache: run the model over the whole context (the last block_size tokens) for every new token, as "
                "nanoGPT's sample.py does; the same samples as --exact_window, slower (for comparison)");
  cmd->add_flag("--exact_window", a->exact_window,
                "RoPE models past block_size: recompute the last block_size tokens for every new token (sample.py's "
                "logits) instead of sliding the KV cache (O(1) per token; deeper layers keep older context)");
  cmd->add_option("--beam", a->beam,
                  "Beam search with K beams instead of sampling: prints the K most probable continuations, best first, "
                  "with their log-probabilities (1 = greedy; temperature, top-k and top-p do not apply)")
      ->capture_default_str();
  cmd->add_flag("--length_norm", a->length_norm,
                "Beam search: rank by log-probability per token instead of the total (matters when --stop ends beams early)");
  cmd->add_flag("--show_probs", a->show_probs,
                "After each sample, list every generated token with its probability and the likeliest alternatives");
  cmd->add_flag("--skip_unknown", a->skip_unknown, "Drop prompt characters that are not in the vocabulary (with a warning)");
  for (auto* option : cmd->get_options()) option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // later wins
  cmd->callback([a] { run_sample(*a); });
}

}  // namespace nanogpt::cli
