// nanogpt prepare: text files or folders -> train.bin, val.bin, meta.bin, then one summary line on
// stdout; a progress line on stderr while it runs, when stderr is a terminal.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#include "data/prepare.h"
#include "train/checkpoint.h"

namespace nanogpt::cli {
namespace {

// "\n" and "\t" typed on a command line arrive as backslash + letter: the separator means the characters.
std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      const char c = text[++i];
      out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == '0' ? '\0' : c;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

void add_prepare_command(CLI::App& app) {
  auto options = std::make_shared<data::PrepareOptions>();
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto separator = std::make_shared<std::string>("\\n");
  auto* cmd = app.add_subcommand("prepare", "Tokenize UTF-8 text (files or folders) into train.bin, val.bin and meta.bin");
  cmd->add_option("--input", *inputs,
                  "UTF-8 text files or folders (read recursively, sorted by path; e.g. data/shakespeare_char/input.txt)")
      ->required()
      ->expected(1, -1);
  cmd->add_option("--out_dir", options->out_dir, "Output directory (created if missing)")->required();
  cmd->add_option("--val_fraction", options->val_fraction, "Last fraction of the characters used for validation")
      ->capture_default_str();
  cmd->add_option("--separator", *separator, "Text put between two files (\\n, \\t, \\r, \\0, \\\\ understood)")
      ->capture_default_str();
  cmd->add_option("--errors", options->errors, "Invalid UTF-8: strict (one error naming file and byte) or replace (U+FFFD)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, data::Utf8Errors>{{"strict", data::Utf8Errors::strict}, {"replace", data::Utf8Errors::replace}}))
      ->default_str("strict");
  cmd->add_option("--tokenizer", options->tokenizer,
                  "char: one token per character; bpe: SentencePiece subwords trained on the text (needs --vocab_size)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, data::TokenizerKind>{{"char", data::TokenizerKind::Char}, {"bpe", data::TokenizerKind::Bpe}}))
      ->default_str("char");
  cmd->add_option("--vocab_size", options->vocab_size, "bpe: the pieces to learn, e.g. 2048 (256 of them are bytes)");
  auto tokenizer_from = std::make_shared<std::string>();
  cmd->add_option("--tokenizer_from", *tokenizer_from,
                  "Tokenize with the tokenizer of this checkpoint or folder (e.g. a model `nanogpt import` wrote), to "
                  "fine-tune it with train --init_from");
  cmd->callback([options, inputs, separator, tokenizer_from] {
    if (!tokenizer_from->empty()) {
      if (options->tokenizer != data::TokenizerKind::Char || options->vocab_size != 0)
        throw std::runtime_error("[data] --tokenizer_from uses that checkpoint's tokenizer: drop --tokenizer and --vocab_size");
      options->vocab = train::read_checkpoint_meta(train::resolve_checkpoint(*tokenizer_from)).vocab;
    }
    options->input = inputs->front();
    options->more_inputs.assign(inputs->begin() + 1, inputs->end());
    options->separator = unescape(*separator);
    if (options->tokenizer == data::TokenizerKind::Char && options->vocab_size != 0)
      throw std::runtime_error("[data] --vocab_size applies to --tokenizer=bpe only (a char vocabulary is the text's characters)");
    const bool terminal = ::isatty(fileno(stderr)) == 1;
    if (terminal) {
      options->progress = [](const data::PrepareProgress& p) {
        std::fprintf(stderr, "\r\033[K[data] %s %.0f of %.0f MB (%d%%)", p.pass == 1 ? "reading" : p.pass == 3 ? "training the tokenizer on" : "writing tokens",
                     p.bytes_done / 1e6, p.bytes_total / 1e6,
                     static_cast<int>(p.bytes_total ? p.bytes_done * 100 / p.bytes_total : 100));
      };
    }
    data::DatasetMeta meta;
    try {
      meta = data::prepare_dataset(*options);
    } catch (...) {
      if (terminal) std::fprintf(stderr, "\r\033[K");  // the error starts its own line
      throw;
    }
    if (terminal) std::fprintf(stderr, "\r\033[K");
    if (meta.replaced > 0) {
      std::fprintf(stderr, "[data] replaced %llu invalid UTF-8 sequences with U+FFFD\n",
                   static_cast<unsigned long long>(meta.replaced));
    }
    std::printf("%s\n", data::summary_line(meta).c_str());
  });
}

}  // namespace nanogpt::cli
