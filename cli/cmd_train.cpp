// nanogpt train CONFIG.yaml [--key=value ...]: nanoGPT's train.py, overrides and all.
// `--help` lists every config key; `--keys=markdown` prints the table of docs/configuration.md.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "train/config.h"
#include "train/trainer.h"

namespace nanogpt::cli {
namespace {

// The keys as `train --help` shows them: one line each, under their group.
std::string keys_text() {
  const auto table = train::config_key_table();
  size_t name_width = 0, default_width = 0;
  for (const auto& key : table) {
    name_width = std::max(name_width, key.name.size());
    default_width = std::max(default_width, key.default_value.size());
  }
  std::string out =
      "Config keys (YAML `key: value`, or --key=value here). Defaults are nanoGPT's train.py's except for\n"
      "dataset, gradient_accumulation_steps, device, dtype, compile and backend; docs/configuration.md has more.\n";
  std::string group;
  for (const auto& key : table) {
    if (key.group != group) out += "\n  # " + (group = key.group) + "\n";
    out += fmt::format("  {:<{}}  {:<6} {:<{}}  {}  [{}]\n", key.name, name_width, key.type, key.default_value,
                       default_width, key.description, key.range);
  }
  return out;
}

std::string markdown_cell(const std::string& text) {
  std::string out;
  for (const char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// The table docs/configuration.md holds between its markers (scripts/gen_config_doc.sh writes it).
std::string keys_markdown() {
  std::string out;
  std::string group;
  for (const train::ConfigKey& key : train::config_key_table()) {
    if (key.group != group) {
      out += fmt::format("{}### {}\n\n| key | type | default | range | nanoGPT | what it does |\n|---|---|---|---|---|---|\n",
                         group.empty() ? "" : "\n", key.group);
      group = key.group;
    }
    out += fmt::format("| `{}` | {} | `{}` | {} | {} | {} |\n", key.name, key.type, key.default_value,
                       markdown_cell(key.range), key.nanogpt_name.empty() ? "—" : "`" + key.nanogpt_name + "`",
                       markdown_cell(key.description));
  }
  return out;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model from a YAML config; --key=value overrides any config key");
  auto config_path = std::make_shared<std::string>();
  cmd->add_option("config", *config_path, "YAML config, e.g. configs/shakespeare_char_cpu.yaml")->required();
  // Runs while parsing, before the config is required, as --help does.
  cmd->add_option_function<std::string>(
         "--keys",
         [](const std::string& format) {
           std::fputs((format == "markdown" ? keys_markdown() : keys_text()).c_str(), stdout);
           throw CLI::Success();
         },
         "Print every config key and exit: text, or markdown (docs/configuration.md's table)")
      ->type_name("FORMAT")
      ->check(CLI::IsMember({"text", "markdown"}));
  cmd->allow_extras();  // the --key=value overrides
  cmd->footer("Overrides use nanoGPT's form: --max_iters=100 --device=cpu --init_from=resume\n\n" + keys_text());
  cmd->callback([cmd, config_path] {
    auto config = train::load_config(*config_path);
    train::apply_overrides(config, cmd->remaining());
    train::Trainer trainer(config);
    exit_status() = trainer.run().exit_code;
  });
}

}  // namespace nanogpt::cli
