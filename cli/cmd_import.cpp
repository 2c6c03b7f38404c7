// nanogpt import --format=hf: a Hugging Face transformers folder (GPT-2, Llama) with its tokenizer
// (interop/hf_import.h does the work); nanogpt import-nanogpt: a nanoGPT checkpoint (ckpt.pt +
// meta.pkl) (interop/nanogpt_bridge.h). Either becomes one of our checkpoints, ready for
// `nanogpt sample` and `nanogpt train --init_from=resume`.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "interop/hf_import.h"
#include "interop/nanogpt_bridge.h"

namespace nanogpt::cli {

namespace {

void add_hf_import_command(CLI::App& app) {
  struct Options {
    std::string dir, format, out_dir;
    int64_t block_size = 0;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("import", "Import a Hugging Face model folder (GPT-2, Llama) with its tokenizer to sample or fine-tune here");
  cmd->add_option("dir", opts->dir, "The model's folder: config.json, model.safetensors (or its sharded index), tokenizer.json")
      ->required();
  cmd->add_option("--format", opts->format, "hf (a transformers folder, as `hf download` writes it)")
      ->required()
      ->check(CLI::IsMember({"hf"}));
  cmd->add_option("--out_dir", opts->out_dir, "New (or empty) folder for our checkpoint and config.yaml")->required();
  cmd->add_option("--block_size", opts->block_size, "Cap the context at this many positions; 0 = the model's")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->callback([opts] {
    const auto start = std::chrono::steady_clock::now();
    const interop::HfImport report = interop::import_hf(opts->dir, opts->out_dir, opts->block_size);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto& m = report.model_config;
    std::printf("[import] wrote %s | %s: %lld layers, %lld heads (%lld kv), %lld wide, block %lld, %lld tokens "
                "(tokenizer %lld) | %.1fM parameters from %lld tensors | %.1f s\n",
                report.checkpoint.c_str(), report.architecture.c_str(), static_cast<long long>(m.n_layer),
                static_cast<long long>(m.n_head), static_cast<long long>(m.kv_heads()), static_cast<long long>(m.n_embd),
                static_cast<long long>(m.block_size), static_cast<long long>(m.vocab_size),
                static_cast<long long>(report.tokenizer_size), report.parameters / 1e6,
                static_cast<long long>(report.tensors), seconds);
    std::printf("[import] next: nanogpt sample --out_dir=%s, or nanogpt prepare --tokenizer_from=%s ... then nanogpt "
                "train --init_from=%s\n",
                opts->out_dir.c_str(), opts->out_dir.c_str(), opts->out_dir.c_str());
  });
}

}  // namespace

void add_import_command(CLI::App& app) {
  add_hf_import_command(app);
  struct Options {
    std::string ckpt, meta, out_dir;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("import-nanogpt", "Import a nanoGPT checkpoint (ckpt.pt + meta.pkl) to sample or keep training here");
  cmd->add_option("--ckpt", opts->ckpt, "nanoGPT's checkpoint (its out_dir/ckpt.pt)")->required();
  cmd->add_option("--meta", opts->meta, "nanoGPT's vocabulary (data/<dataset>/meta.pkl); character-level models only");
  cmd->add_option("--out_dir", opts->out_dir, "New (or empty) folder for our checkpoint and config.yaml")->required();
  cmd->callback([opts] {
    const auto bridge = interop::PythonBridge::find(NANOGPT_PYTHON, NANOGPT_SOURCE_DIR);
    const interop::ImportReport report = interop::import_nanogpt(opts->ckpt, opts->meta, opts->out_dir, bridge);
    const auto& m = report.model_config;
    std::printf("[import] wrote %s | %lld layers, %lld heads, %lld wide, block %lld, %lld characters | iter %lld | "
                "AdamW state %s\n",
                report.checkpoint.c_str(), static_cast<long long>(m.n_layer), static_cast<long long>(m.n_head),
                static_cast<long long>(m.n_embd), static_cast<long long>(m.block_size),
                static_cast<long long>(m.vocab_size), static_cast<long long>(report.iter),
                report.optimizer ? "carried over" : "fresh");
    for (const auto& note : report.notes) std::printf("[import] note: %s\n", note.c_str());
    std::printf("[import] next: nanogpt sample --out_dir=%s, or nanogpt train %s --init_from=resume\n",
                opts->out_dir.c_str(), report.config.c_str());
  });
}

}  // namespace nanogpt::cli
