// nanogpt import-nanogpt: a nanoGPT checkpoint (ckpt.pt + meta.pkl) as one of ours, ready for
// `nanogpt sample` and `nanogpt train --init_from=resume` (interop/nanogpt_bridge.h does the work).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "interop/nanogpt_bridge.h"

namespace nanogpt::cli {

void add_import_command(CLI::App& app) {
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
