// nanogpt sample: nanoGPT's sample.py with a KV cache, top-p, stop strings and streaming.
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "data/utf8.h"
#include "runtime/device.h"
#include "model/generate.h"
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
  int64_t num_threads = 0;
  bool stream = false;
  bool batch = false;
  bool no_cache = false;
  bool skip_unknown = false;
  std::string stop;
};

void check(const SampleArgs& a) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("[sample] " + m); };
  if (a.num_samples < 1) bad("--num_samples must be >= 1");
  if (a.max_new_tokens < 0) bad("--max_new_tokens must be >= 0");
  if (!(a.temperature >= 0.0)) bad("--temperature must be >= 0 (0 = greedy)");
  if (a.top_k < 0) bad("--top_k must be >= 0 (0 = off)");
  if (!(a.top_p > 0.0 && a.top_p <= 1.0)) bad("--top_p must be in (0, 1] (1 = off)");
  if (a.stream && a.batch) bad("--stream prints one sample at a time: drop --batch");
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

// Tracks one sample's generated text and whether it has reached the stop string.
struct SampleText {
  std::string text;
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

void run_sample(const SampleArgs& a) {
  check(a);
  runtime::set_threads(a.num_threads);
  const auto device = runtime::resolve_device(a.device);
  auto loaded = train::load_model(train::resolve_checkpoint(a.ckpt.empty() ? a.out_dir : a.ckpt), device);
  const auto prompt = encode_prompt(a, loaded.vocab);
  const std::string prompt_text = loaded.vocab.decode(prompt);
  model::SamplingOptions options;
  options.temperature = a.temperature;
  options.top_k = a.top_k;
  options.top_p = a.top_p;
  options.use_cache = !a.no_cache;
  std::mt19937_64 rng(static_cast<uint64_t>(a.seed));
  torch::manual_seed(static_cast<uint64_t>(a.seed));

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
    model::generate(loaded.model, prompt, per_round, a.max_new_tokens, options, rng, [&](const std::vector<int64_t>& tokens) {
      bool all_done = true;
      for (size_t b = 0; b < tokens.size(); ++b) {
        if (texts[b].done) continue;
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
    });
    for (auto& t : texts) {
      if (a.stream)
        print_sample("");
      else
        print_sample(prompt_text + t.text);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "[sample] %lld tokens in %.2f s: %.0f tok/s (%s, %s, %s)\n", static_cast<long long>(generated),
               seconds, generated / std::max(seconds, 1e-9), a.no_cache ? "no cache" : "KV cache",
               a.batch ? ("batch of " + std::to_string(a.num_samples)).c_str() : "one sample at a time",
               device.str().c_str());
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint (KV cache, temperature, top-k, top-p)");
  auto a = std::make_shared<SampleArgs>();
  cmd->add_option("--out_dir", a->out_dir, "Training folder: reads ckpt_best.safetensors, else ckpt_last.safetensors")->capture_default_str();
  cmd->add_option("--ckpt", a->ckpt, "A checkpoint file (instead of --out_dir)");
  cmd->add_option("--start", a->start, "Prompt text, or FILE:path to read it from a file")->capture_default_str();
  cmd->add_option("--num_samples", a->num_samples, "Number of samples")->capture_default_str();
  cmd->add_option("--max_new_tokens", a->max_new_tokens, "Tokens generated per sample")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "Softmax temperature; 0 = greedy (argmax)")->capture_default_str();
  cmd->add_option("--top_k", a->top_k, "Keep the k most likely tokens; 0 = off")->capture_default_str();
  cmd->add_option("--top_p", a->top_p, "Nucleus sampling: keep the smallest set with this much probability; 1 = off")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Random seed: same seed, same samples")->capture_default_str();
  cmd->add_option("--device", a->device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  cmd->add_option("--num_threads", a->num_threads, "CPU threads; 0 = all cores")->capture_default_str();
  cmd->add_option("--stop", a->stop, "End a sample right after this string (e.g. a blank line, or 。)");
  cmd->add_flag("--stream", a->stream, "Print characters as they are generated");
  cmd->add_flag("--batch", a->batch, "Generate all samples together as one batch (faster; no streaming)");
  cmd->add_flag("--no_cache", a->no_cache, "Recompute the whole context for every token (nanoGPT's way; for comparison)");
  cmd->add_flag("--skip_unknown", a->skip_unknown, "Drop prompt characters that are not in the vocabulary (with a warning)");
  for (auto* option : cmd->get_options()) option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // later wins
  cmd->callback([a] { run_sample(*a); });
}

}  // namespace nanogpt::cli
