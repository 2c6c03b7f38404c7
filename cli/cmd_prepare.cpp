// nanogpt prepare: input.txt -> train.bin, val.bin, meta.bin, then one summary line on stdout.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "data/prepare.h"

namespace nanogpt::cli {

void add_prepare_command(CLI::App& app) {
  auto options = std::make_shared<data::PrepareOptions>();
  auto* cmd = app.add_subcommand("prepare", "Tokenize a UTF-8 text file into train.bin, val.bin and meta.bin");
  cmd->add_option("--input", options->input, "UTF-8 text file (e.g. data/shakespeare_char/input.txt)")->required();
  cmd->add_option("--out_dir", options->out_dir, "Output directory (created if missing)")->required();
  cmd->add_option("--val_fraction", options->val_fraction, "Last fraction of the characters used for validation")
      ->capture_default_str();
  cmd->callback([options] {
    const data::DatasetMeta meta = data::prepare_dataset(*options);
    std::printf("%s\n", data::summary_line(meta).c_str());
  });
}

}  // namespace nanogpt::cli
