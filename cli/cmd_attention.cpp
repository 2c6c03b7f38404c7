// nanogpt attention: run a prompt through a trained model and draw every head's attention
// weights (one heatmap per layer and head, PNG or SVG), plus the raw weights as CSV; with --html,
// also an interactive explorer page over the prompt and a sampled continuation.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "data/utf8.h"
#include "data/vocab.h"
#include "model/generate.h"
#include "runtime/device.h"
#include "train/checkpoint.h"
#include "viz/attention_csv.h"
#include "viz/attention_explorer.h"
#include "viz/attention_plot.h"
#include "viz/figure.h"

namespace nanogpt::cli {
namespace {

// "all" -> every layer; "3" -> {3}. Throws naming the valid range.
std::vector<int64_t> select_layers(const std::string& spec, int64_t n_layer) {
  std::vector<int64_t> layers;
  if (spec == "all") {
    for (int64_t l = 0; l < n_layer; ++l) layers.push_back(l);
    return layers;
  }
  const std::string range = fmt::format("this model has {} layers: use 0..{} or all", n_layer, n_layer - 1);
  const bool digits = !spec.empty() && spec.size() < 10 && spec.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) throw std::runtime_error("[attention] --layer '" + spec + "' is not a layer number (" + range + ")");
  const int64_t layer = std::stoll(spec);
  if (layer >= n_layer) throw std::runtime_error("[attention] --layer " + spec + " is out of range (" + range + ")");
  return {layer};
}

// The characters that encode() dropped, described once each: 'x' (U+0078), ...
std::string describe_skipped(const std::u32string& skipped) {
  std::u32string distinct;
  for (char32_t c : skipped) {
    if (distinct.find(c) == std::u32string::npos) distinct += c;
  }
  std::string out;
  for (size_t i = 0; i < distinct.size() && i < 8; ++i) out += (i ? ", " : "") + data::describe_char(distinct[i]);
  if (distinct.size() > 8) out += ", ...";
  return out;
}

}  // namespace

void add_attention_command(CLI::App& app) {
  struct Options {
    std::string out_dir = "out";
    std::string ckpt;
    std::string start;
    std::string layer = "all";
    std::string out;   // default: next to the checkpoint, attention.png
    std::string csv;   // default: out with .csv
    std::string html;  // the explorer page; none by default
    int64_t new_tokens = 48;
    double temperature = 0.8;
    int64_t seed = 1337;
    std::string device = "auto";
    bool skip_unknown = false;
    bool no_heatmap = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("attention", "Draw the attention weights of a prompt, one heatmap per layer and head");
  auto* out_dir = cmd->add_option("--out_dir", opts->out_dir, "Training folder (reads ckpt_best.safetensors, else ckpt_last.safetensors)")
                      ->capture_default_str();
  cmd->add_option("--ckpt", opts->ckpt, "A checkpoint file (instead of --out_dir)")->excludes(out_dir);
  cmd->add_option("--start", opts->start, "The prompt, or FILE:path to read it from a file")->required();
  cmd->add_option("--layer", opts->layer, "Layer to draw (0-based), or all")->capture_default_str();
  cmd->add_option("--out", opts->out, "Output PNG, or SVG when it ends in .svg (default: attention.png next to the checkpoint)");
  cmd->add_option("--csv", opts->csv, "Raw weights as CSV (default: the --out path with .csv)");
  cmd->add_option("--html", opts->html, "Also write the interactive explorer page (one self-contained HTML file)");
  cmd->add_option("--new_tokens", opts->new_tokens, "Tokens the explorer samples after the prompt, to step through")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", opts->temperature, "Sampling temperature of the explorer's continuation")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", opts->seed, "Random seed of the explorer's continuation")->capture_default_str();
  cmd->add_option("--device", opts->device, "auto | cpu | cuda | cuda:N")->capture_default_str();
  cmd->add_flag("--skip_unknown", opts->skip_unknown, "Drop prompt characters that are not in the vocabulary");
  cmd->add_flag("--no_heatmap", opts->no_heatmap,
                "Write only the explorer page (--html) and the CSV, no heatmap image (a build without plots does so "
                "with --html)");
  cmd->callback([opts] {
    // The explorer page and the CSV need no drawing library: a build without plots still writes them.
    if (opts->no_heatmap && opts->html.empty())
      throw std::invalid_argument("[attention] --no_heatmap leaves only the explorer page to write: add --html=PAGE.html");
    const bool heatmap = !opts->no_heatmap && (viz::can_draw() || opts->html.empty());
    const std::string source = opts->ckpt.empty() ? opts->out_dir : opts->ckpt;
    const std::string ckpt_path = train::resolve_checkpoint(source);
    const torch::Device device = runtime::resolve_device(opts->device);
    train::LoadedModel loaded = train::load_model(ckpt_path, device);
    const model::ModelConfig& config = loaded.model->config();
    const std::vector<int64_t> layers = select_layers(opts->layer, config.n_layer);

    const bool from_file = opts->start.rfind("FILE:", 0) == 0;
    const std::string prompt = from_file ? io::read_file(opts->start.substr(5), "attention") : opts->start;
    std::u32string skipped;
    const auto policy = opts->skip_unknown ? data::UnknownChars::Skip : data::UnknownChars::Error;
    std::vector<int64_t> ids = loaded.vocab.encode(prompt, policy, &skipped);
    if (!skipped.empty()) {
      std::fprintf(stderr, "[attention] skipped %zu character(s) not in the vocabulary: %s\n", skipped.size(),
                   describe_skipped(skipped).c_str());
    }
    if (ids.empty()) throw std::runtime_error("[attention] the prompt has no tokens: pass a non-empty --start");
    if (static_cast<int64_t>(ids.size()) > config.block_size) {
      std::fprintf(stderr, "[attention] the prompt has %zu tokens; keeping the last %lld (the model's block_size)\n",
                   ids.size(), static_cast<long long>(config.block_size));
      ids.erase(ids.begin(), ids.end() - config.block_size);
    }
    const auto T = static_cast<int64_t>(ids.size());

    // The explorer's continuation, sampled up to the context window: attention is causal, so one
    // forward pass over prompt + continuation gives the prompt's weights as well.
    std::vector<int64_t> sequence = ids;
    const int64_t new_tokens = opts->html.empty() ? 0 : std::min(opts->new_tokens, config.block_size - T);
    if (new_tokens > 0) {
      std::mt19937_64 rng(static_cast<uint64_t>(opts->seed));
      model::SamplingOptions sampling;
      sampling.temperature = opts->temperature;
      sequence = model::generate(loaded.model, ids, 1, new_tokens, sampling, rng).at(0);
    }
    const auto S = static_cast<int64_t>(sequence.size());
    const torch::Tensor idx = torch::tensor(sequence, torch::kLong).view({1, S}).to(device);  // (1, S)
    std::vector<torch::Tensor> maps;  // per layer (1, nh, S, S)
    {
      torch::NoGradGuard no_grad;
      maps = loaded.model->attention_maps(idx);
    }
    using torch::indexing::Slice;
    std::vector<viz::AttentionPanel> panels;
    for (int64_t layer : layers) {
      const torch::Tensor weights =  // the prompt's rows and columns: (nh, T, T)
          maps.at(layer)[0].index({Slice(), Slice(0, T), Slice(0, T)}).to(torch::kCPU, torch::kFloat);
      for (int64_t head = 0; head < weights.size(0); ++head) panels.push_back({layer, head, weights[head]});
    }
    std::vector<std::string> labels;
    for (int64_t id : ids) labels.push_back(loaded.vocab.piece(id));  // a character, or a bpe piece

    const std::filesystem::path ckpt_dir = std::filesystem::path(ckpt_path).parent_path();
    const std::string out = opts->out.empty() ? (ckpt_dir / "attention.png").string() : opts->out;
    const std::string csv =
        opts->csv.empty() ? std::filesystem::path(out).replace_extension(".csv").string() : opts->csv;
    const std::string title = fmt::format("attention | {} (iter {}) | {} tokens",
                                          std::filesystem::path(ckpt_path).filename().string(), loaded.meta.iter, T);
    if (heatmap) {
      viz::plot_attention(panels, labels, out, title);  // throws, saying why, in a build without plots
      viz::write_attention_csv(panels, labels, csv);
      std::printf("[attention] wrote %s and %s | %zu panels | %lld tokens\n", out.c_str(), csv.c_str(), panels.size(),
                  static_cast<long long>(T));
    } else {
      viz::write_attention_csv(panels, labels, csv);
      std::printf("[attention] wrote %s | %zu panels | %lld tokens | no heatmap (%s)\n", csv.c_str(), panels.size(),
                  static_cast<long long>(T),
                  opts->no_heatmap ? "--no_heatmap" : "this build has no plots: configured with -DNANOGPT_PLOTS=OFF");
    }
    if (!opts->html.empty()) {
      viz::ExplorerData explorer;
      explorer.title = fmt::format("{} + {} sampled", title, new_tokens);
      for (int64_t id : sequence) explorer.tokens.push_back(loaded.vocab.piece(id));
      explorer.prompt_tokens = T;
      for (const torch::Tensor& map : maps) explorer.layers.push_back(map[0].to(torch::kCPU, torch::kFloat));  // (nh, S, S)
      viz::write_attention_explorer(explorer, opts->html);
      std::printf("[attention] wrote %s | %lld prompt + %lld sampled tokens | open it in a browser\n",
                  opts->html.c_str(), static_cast<long long>(T), static_cast<long long>(new_tokens));
    }
  });
}

}  // namespace nanogpt::cli
