// Dataset preparation: input.txt -> train.bin, val.bin, meta.bin (nanoGPT's prepare.py, natively).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "data/vocab.h"

namespace nanogpt::data {

struct PrepareOptions {
  std::string input;          // UTF-8 text file
  std::string out_dir;        // receives train.bin, val.bin, meta.bin (created if missing)
  double val_fraction = 0.1;  // last fraction of the *characters* goes to val, like nanoGPT
  int64_t min_split_tokens = 2;  // each split must hold at least this many tokens (block_size + 1 for training)
};

/// What meta.bin holds: the vocabulary plus where the tokens came from.
struct DatasetMeta {
  Vocab vocab;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  uint64_t input_bytes = 0;   // size of the input file
  uint64_t input_hash = 0;    // FNV-1a 64 of the input bytes
  double val_fraction = 0.1;
};

/// Prepares the dataset and returns its meta. Every output is written atomically.
/// Throws on missing/empty/directory input, invalid UTF-8, a split too short, an unwritable out_dir.
DatasetMeta prepare_dataset(const PrepareOptions& options);

/// The summary line: "[data] vocab_size=65 train_tokens=1003854 val_tokens=111540".
std::string summary_line(const DatasetMeta& meta);

/// Reads and validates out_dir/meta.bin. Throws "[data] ..." on missing/corrupt files.
DatasetMeta read_meta(const std::string& out_dir);

/// True when out_dir holds train.bin, val.bin and a meta.bin made from exactly this input file
/// (same size and hash) with the same val_fraction.
bool is_prepared(const std::string& input, const std::string& out_dir, double val_fraction = 0.1);

/// Prepares only when needed (is_prepared is false); returns the meta either way. `prepared`, if
/// given, tells whether preparation ran.
DatasetMeta ensure_prepared(const PrepareOptions& options, bool* prepared = nullptr);

/// FNV-1a 64-bit hash.
uint64_t fnv1a64(std::string_view bytes);

}  // namespace nanogpt::data
