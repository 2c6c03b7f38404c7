// nanogpt export: a checkpoint's weights, architecture and vocabulary as one .safetensors file, or
// as nanoGPT's ckpt.pt + meta.pkl (--format=nanogpt).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/nanogpt_bridge.h"

namespace nanogpt::cli {

void add_export_command(CLI::App& app) {
  struct Options {
    std::string out_dir = "out";
    std::string ckpt;
    std::string out = "model.safetensors";
    std::string format = "safetensors";
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("export", "Write a checkpoint as .safetensors (weights, config, vocabulary) or for nanoGPT");
  auto* out_dir = cmd->add_option("--out_dir", opts->out_dir, "Training folder (reads ckpt_best.safetensors, else ckpt_last.safetensors)")
                      ->capture_default_str();
  cmd->add_option("--ckpt", opts->ckpt, "A checkpoint file (instead of --out_dir)")->excludes(out_dir);
  auto* out = cmd->add_option("--out", opts->out, "Output .safetensors file; with --format=nanogpt a new folder")->capture_default_str();
  cmd->add_option("--format", opts->format, "safetensors | nanogpt (ckpt.pt + meta.pkl for nanoGPT's sample.py and train.py)")
      ->check(CLI::IsMember({"safetensors", "nanogpt"}))
      ->capture_default_str();
  cmd->callback([opts, out] {
    const std::string source = train::resolve_checkpoint(opts->ckpt.empty() ? opts->out_dir : opts->ckpt);
    if (opts->format == "nanogpt") {
      if (out->count() == 0) throw std::invalid_argument("[export] --format=nanogpt writes a folder: give --out=DIR");
      const std::string dataset =
          train::export_nanogpt(source, opts->out, train::PythonBridge::find(NANOGPT_PYTHON, NANOGPT_SOURCE_DIR));
      std::printf("[export] wrote %s/ckpt.pt and %s/meta.pkl | from %s\n", opts->out.c_str(), opts->out.c_str(), source.c_str());
      std::printf("[export] nanoGPT's sample.py reads data/%s/meta.pkl: copy meta.pkl there (or keep the one its "
                  "prepare.py made), then python sample.py --out_dir=%s\n", dataset.c_str(), opts->out.c_str());
      return;
    }
    const train::LoadedModel loaded = train::load_model(source, torch::kCPU);
    train::export_safetensors(loaded, opts->out);
    int64_t tensors = 0, params = 0;
    for (const auto& p : loaded.model->parameters()) {
      ++tensors;
      params += p.numel();
    }
    std::printf("[export] wrote %s | %lld tensors | %lld parameters | %llu bytes | from %s\n", opts->out.c_str(),
                static_cast<long long>(tensors), static_cast<long long>(params),
                static_cast<unsigned long long>(std::filesystem::file_size(opts->out)), loaded.path.c_str());
  });
}

}  // namespace nanogpt::cli
