// nanogpt export: a checkpoint's weights, architecture and vocabulary as one .safetensors file, as
// nanoGPT's ckpt.pt + meta.pkl (--format=nanogpt), or as a Hugging Face transformers folder (--format=hf).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#include "interop/hf_export.h"
#include "interop/nanogpt_bridge.h"
#include "interop/safetensors_export.h"
#include "train/checkpoint.h"

namespace nanogpt::cli {

void add_export_command(CLI::App& app) {
  struct Options {
    std::string out_dir = "out";
    std::string ckpt;
    std::string out = "model.safetensors";
    std::string format = "safetensors";
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("export",
                                 "Write a checkpoint as .safetensors (weights, config, vocabulary), for nanoGPT, or "
                                 "for Hugging Face transformers");
  auto* out_dir = cmd->add_option("--out_dir", opts->out_dir, "Training folder (reads ckpt_best.safetensors, else ckpt_last.safetensors)")
                      ->capture_default_str();
  cmd->add_option("--ckpt", opts->ckpt, "A checkpoint file (instead of --out_dir)")->excludes(out_dir);
  auto* out = cmd->add_option("--out", opts->out, "Output .safetensors file; with --format=nanogpt or hf a new folder")
                  ->capture_default_str();
  cmd->add_option("--format", opts->format,
                  "safetensors | nanogpt (ckpt.pt + meta.pkl for nanoGPT's sample.py and train.py) | hf (a folder "
                  "transformers' AutoModelForCausalLM and AutoTokenizer load)")
      ->check(CLI::IsMember({"safetensors", "nanogpt", "hf"}))
      ->capture_default_str();
  cmd->callback([opts, out] {
    const std::string source = train::resolve_checkpoint(opts->ckpt.empty() ? opts->out_dir : opts->ckpt);
    if (opts->format == "nanogpt") {
      if (out->count() == 0) throw std::invalid_argument("[export] --format=nanogpt writes a folder: give --out=DIR");
      const std::string dataset =
          interop::export_nanogpt(source, opts->out, interop::PythonBridge::find(NANOGPT_PYTHON, NANOGPT_SOURCE_DIR));
      std::printf("[export] wrote %s/ckpt.pt and %s/meta.pkl | from %s\n", opts->out.c_str(), opts->out.c_str(), source.c_str());
      std::printf("[export] nanoGPT's sample.py reads data/%s/meta.pkl: copy meta.pkl there (or keep the one its "
                  "prepare.py made), then python sample.py --out_dir=%s\n", dataset.c_str(), opts->out.c_str());
      return;
    }
    if (opts->format == "hf") {
      if (out->count() == 0) throw std::invalid_argument("[export] --format=hf writes a folder: give --out=DIR");
      interop::hf_architecture(train::read_checkpoint_meta(source).model_config);  // refuse before reading weights
      const train::LoadedModel loaded = train::load_model(source, torch::kCPU);
      const auto written = interop::export_hf(loaded.model, loaded.vocab, loaded.meta.model_config.dropout, opts->out);
      std::printf("[export] wrote %s/ | %s | %lld tensors | %lld parameters | from %s\n", opts->out.c_str(),
                  written.architecture.c_str(), static_cast<long long>(written.tensors),
                  static_cast<long long>(written.parameters), loaded.path.c_str());
      std::printf("[export] in Python: AutoModelForCausalLM.from_pretrained(\"%s\") and "
                  "AutoTokenizer.from_pretrained(\"%s\")\n",
                  opts->out.c_str(), opts->out.c_str());
      return;
    }
    const train::LoadedModel loaded = train::load_model(source, torch::kCPU);
    interop::export_safetensors(loaded, opts->out);
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
