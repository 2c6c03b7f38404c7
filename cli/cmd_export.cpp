// nanogpt export: a checkpoint's weights, architecture and vocabulary as one .safetensors file.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "train/checkpoint.h"
#include "train/export.h"

namespace nanogpt::cli {

void add_export_command(CLI::App& app) {
  struct Options {
    std::string out_dir = "out";
    std::string ckpt;
    std::string out = "model.safetensors";
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("export", "Write a checkpoint as .safetensors (weights, config, vocabulary)");
  auto* out_dir = cmd->add_option("--out_dir", opts->out_dir, "Training folder (reads ckpt_best.safetensors, else ckpt_last.safetensors)")
                      ->capture_default_str();
  cmd->add_option("--ckpt", opts->ckpt, "A checkpoint file (instead of --out_dir)")->excludes(out_dir);
  cmd->add_option("--out", opts->out, "Output .safetensors file")->capture_default_str();
  cmd->callback([opts] {
    const std::string source = opts->ckpt.empty() ? opts->out_dir : opts->ckpt;
    const train::LoadedModel loaded = train::load_model(train::resolve_checkpoint(source), torch::kCPU);
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
