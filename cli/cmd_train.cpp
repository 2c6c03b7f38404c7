// nanogpt train CONFIG.yaml [--key=value ...]: nanoGPT's train.py, overrides and all.
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "train/config.h"
#include "train/trainer.h"

namespace nanogpt::cli {

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model from a YAML config; --key=value overrides any config key");
  auto config_path = std::make_shared<std::string>();
  cmd->add_option("config", *config_path, "YAML config, e.g. configs/shakespeare_char_cpu.yaml")->required();
  cmd->allow_extras();  // the --key=value overrides
  cmd->footer("Overrides use nanoGPT's form: --max_iters=100 --device=cpu --init_from=resume");
  cmd->callback([cmd, config_path] {
    auto config = train::load_config(*config_path);
    train::apply_overrides(config, cmd->remaining());
    train::Trainer trainer(config);
    exit_status() = trainer.run().exit_code;
  });
}

}  // namespace nanogpt::cli
