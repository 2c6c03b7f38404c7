// Dataset preparation: text -> train.bin, val.bin, meta.bin (nanoGPT's prepare.py, natively), in
// two streaming passes over the input, so memory stays flat whatever the corpus size.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/corpus.h"
#include "data/vocab.h"

namespace nanogpt::data {

/// Where prepare is: `pass` 1 reads the characters, 2 writes the tokens, 3 trains the bpe tokenizer
/// (between 1 and 2); bytes of input done of total.
struct PrepareProgress {
  int pass = 1;
  uint64_t bytes_done = 0, bytes_total = 0;
};

struct PrepareOptions {
  std::string input;          // UTF-8 text file, or a folder of them (see corpus_files)
  std::string out_dir;        // receives train.bin, val.bin, meta.bin (created if missing)
  double val_fraction = 0.1;  // last fraction of the *characters* goes to val, like nanoGPT
  int64_t min_split_tokens = 2;  // each split must hold at least this many tokens (block_size + 1 for training)
  std::vector<std::string> more_inputs{};  // further files or folders, read after `input`
  std::string separator = "\n";            // put between two files' texts
  Utf8Errors errors = Utf8Errors::strict;  // invalid UTF-8: refuse, or replace with U+FFFD
  TokenizerKind tokenizer = TokenizerKind::Char;  // char: one token per character; bpe: SentencePiece subwords
  int64_t vocab_size = 0;                  // bpe: pieces to learn (e.g. 2048); not used by char
  std::optional<Vocab> vocab{};            // a tokenizer to use as it is (prepare --tokenizer_from); none = make one
  std::function<void(const PrepareProgress&)> progress{};  // called about every 1% (optional)
};

/// What meta.bin holds: the vocabulary, the token counts and checksums, and where the tokens came from.
struct DatasetMeta {
  Vocab vocab;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  uint64_t input_bytes = 0;     // size of the input (all files and separators)
  uint64_t input_hash = 0;      // checksum of the input bytes (version 1: FNV-1a 64)
  double val_fraction = 0.1;
  int64_t input_mtime_ns = 0;   // modification time of a single input file (0: several files)
  uint64_t train_checksum = 0;  // checksum of train.bin's token bytes (0: not recorded, version 1)
  uint64_t val_checksum = 0;    // checksum of val.bin's token bytes
  int64_t train_chars = 0;      // characters of each split: bits per character = loss in nats per token
  int64_t val_chars = 0;        // x tokens / characters / ln 2 (version 1-2 files: the token counts)
  uint32_t version = 0;         // meta.bin's format version as read (read_meta); written: the current one
  uint64_t replaced = 0;        // invalid UTF-8 sequences replaced (prepare only, not stored)
};

/// Prepares the dataset and returns its meta. Every output is written atomically; meta.bin last.
/// Throws on missing/empty input, invalid UTF-8 (strict), a split too short, an unwritable out_dir.
DatasetMeta prepare_dataset(const PrepareOptions& options);

/// Tokens per character of the val split (1 for the char tokenizer): bits per character = val
/// loss (nats per token) x this / ln 2.
double val_tokens_per_char(const DatasetMeta& meta);

/// The summary line: "[data] vocab_size=65 train_tokens=1003854 val_tokens=111540", then for bpe
/// " tokenizer=bpe val_chars_per_token=3.21".
std::string summary_line(const DatasetMeta& meta);

/// Reads and validates out_dir/meta.bin (versions 1 to 3). Throws "[data] ..." on missing/corrupt files.
DatasetMeta read_meta(const std::string& out_dir);

/// True when out_dir holds train.bin, val.bin and a current meta.bin made from exactly this input
/// file with the same val_fraction. The input is read (checksummed) only when its size matches and
/// its modification time does not.
bool is_prepared(const std::string& input, const std::string& out_dir, double val_fraction = 0.1);

/// Prepares only when needed (is_prepared is false, or the folder holds another tokenizer or
/// vocab_size than `options` ask for); returns the meta either way. `prepared`, if
/// given, tells whether preparation ran.
DatasetMeta ensure_prepared(const PrepareOptions& options, bool* prepared = nullptr);

/// A dataset name as train's `dataset` takes it: NAME (no slash) is data/NAME, as in nanoGPT;
/// anything with a slash (or "." / "..") is a path.
std::string dataset_dir(const std::string& name);

/// FNV-1a 64-bit hash.
uint64_t fnv1a64(std::string_view bytes);

}  // namespace nanogpt::data
