// Dataset preparation: text -> train.bin, val.bin, meta.bin, like nanoGPT's
// data/shakespeare_char/prepare.py: the first int(n * (1 - val_fraction)) characters train, the rest val.
// Two passes over the input, each in 1 MiB pieces: the first finds the characters (the vocabulary)
// and counts them, the second writes the tokens; memory stays a few MB whatever the corpus size.
// The bpe tokenizer adds a pass between them: SentencePiece learns its pieces from the lines of the
// training split (its first kMaxBpeTrainingBytes); the split point is the same character as for char.
//
// meta.bin layout (little-endian):
//   magic           8 bytes  "NGPTMETA"
//   version         uint32   3 (version 1 ends after val_fraction, version 2 after val_checksum; then
//                            vocab_bytes and the vocab)
//   train_tokens    uint64
//   val_tokens      uint64
//   input_bytes     uint64
//   input_hash      uint64   checksum of the input bytes (data/checksum.h; version 1: FNV-1a 64)
//   val_fraction    uint64   IEEE-754 double bits
//   input_mtime_ns  uint64   modification time of a single input file, 0 for several
//   train_checksum  uint64   checksum of train.bin's token bytes
//   val_checksum    uint64   checksum of val.bin's token bytes
//   train_chars     uint64   characters of the train split (= train_tokens for char)
//   val_chars       uint64   characters of the val split
//   vocab_bytes     uint64   length of the vocabulary blob that follows
//   vocab           Vocab::serialize()
#include "data/prepare.h"

#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "data/bpe.h"
#include "data/hf_tokenizer.h"
#include "data/token_file.h"
#include "data/utf8.h"
#include "io/atomic_file.h"
#include "io/little_endian.h"

namespace nanogpt::data {
namespace {

namespace fs = std::filesystem;

constexpr char kMetaMagic[8] = {'N', 'G', 'P', 'T', 'M', 'E', 'T', 'A'};
constexpr uint32_t kMetaVersion = 3;
constexpr size_t kMetaV1FixedBytes = 8 + 4 + 6 * 8;
constexpr size_t kMetaV2FixedBytes = 8 + 4 + 9 * 8;
constexpr size_t kMetaFixedBytes = 8 + 4 + 11 * 8;
// SentencePiece keeps its training sentences in memory: it learns from this much of the train split.
constexpr uint64_t kMaxBpeTrainingBytes = 32 << 20;
// Lines longer than this many characters are cut (for training and encoding), so memory stays bounded.
constexpr size_t kMaxLineChars = 4096;

std::string join(const std::string& dir, const char* name) { return (fs::path(dir) / name).string(); }

uint64_t double_bits(double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  return bits;
}

double bits_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}

std::string serialize_meta(const DatasetMeta& meta) {
  const std::string vocab = meta.vocab.serialize();
  std::string out(kMetaMagic, sizeof(kMetaMagic));
  io::append_le(out, kMetaVersion, 4);
  io::append_le(out, static_cast<uint64_t>(meta.train_tokens), 8);
  io::append_le(out, static_cast<uint64_t>(meta.val_tokens), 8);
  io::append_le(out, meta.input_bytes, 8);
  io::append_le(out, meta.input_hash, 8);
  io::append_le(out, double_bits(meta.val_fraction), 8);
  io::append_le(out, static_cast<uint64_t>(meta.input_mtime_ns), 8);
  io::append_le(out, meta.train_checksum, 8);
  io::append_le(out, meta.val_checksum, 8);
  io::append_le(out, static_cast<uint64_t>(meta.train_chars), 8);
  io::append_le(out, static_cast<uint64_t>(meta.val_chars), 8);
  io::append_le(out, vocab.size(), 8);
  out += vocab;
  return out;
}

void validate_options(const PrepareOptions& options) {
  if (options.input.empty()) throw std::runtime_error("[data] no input file given (pass --input FILE)");
  if (options.out_dir.empty()) throw std::runtime_error("[data] no output directory given (pass --out_dir DIR)");
  if (!(options.val_fraction > 0.0 && options.val_fraction < 1.0)) {
    throw std::runtime_error(
        fmt::format("[data] val_fraction ({}) must be between 0 and 1, exclusive (nanoGPT uses 0.1)", options.val_fraction));
  }
  if (options.tokenizer == TokenizerKind::Bpe && options.vocab_size <= kBpeReservedPieces) {
    throw std::runtime_error(fmt::format(
        "[data] vocab_size ({}) is too small for the bpe tokenizer: it must exceed the {} reserved pieces (<unk>, the "
        "newline, 256 bytes); try 2048",
        options.vocab_size, kBpeReservedPieces));
  }
  if (options.tokenizer == TokenizerKind::Bpe && options.vocab_size > (int64_t{1} << 20)) {
    throw std::runtime_error(fmt::format("[data] vocab_size ({}) is too large (at most 1048576; try 2048)", options.vocab_size));
  }
  if (options.min_split_tokens < 1) {
    throw std::runtime_error(fmt::format("[data] min_split_tokens ({}) must be at least 1", options.min_split_tokens));
  }
}

void check_split_sizes(const DatasetMeta& meta, const PrepareOptions& options) {
  const auto check = [&](const char* split, int64_t tokens) {
    if (tokens < options.min_split_tokens) {
      throw std::runtime_error(fmt::format(
          "[data] corpus '{}' is too short: the {} split has {} tokens, fewer than the {} needed for one training window "
          "(use a longer text, a smaller block_size, or another val_fraction)",
          options.input, split, tokens, options.min_split_tokens));
    }
  };
  check("train", meta.train_tokens);
  check("val", meta.val_tokens);
}

// Creates out_dir if needed and checks we may write there, before anything is written.
void make_out_dir(const std::string& out_dir) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec)) {
    throw std::runtime_error("[data] output path '" + out_dir + "' exists and is not a directory (choose another --out_dir)");
  }
  fs::create_directories(out_dir, ec);
  if (ec) {
    throw std::runtime_error("[data] cannot create output directory '" + out_dir + "': " + ec.message() +
                             " (choose a writable --out_dir)");
  }
  if (::access(out_dir.c_str(), W_OK) != 0) {
    throw std::runtime_error("[data] cannot write to output directory '" + out_dir + "': " + std::strerror(errno) +
                             " (choose a writable --out_dir)");
  }
}

int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// Calls `progress` when another percent of the input is done.
class ProgressTicker {
 public:
  ProgressTicker(const PrepareOptions& options, int pass) : progress_(options.progress), pass_(pass) {}
  void operator()(const CorpusReader& reader) {
    if (!progress_) return;
    const uint64_t total = std::max<uint64_t>(reader.total_bytes(), 1);
    const uint64_t percent = reader.bytes_read() * 100 / total;
    if (percent == last_percent_) return;
    last_percent_ = percent;
    progress_(PrepareProgress{pass_, reader.bytes_read(), reader.total_bytes()});
  }

 private:
  std::function<void(const PrepareProgress&)> progress_;
  int pass_;
  uint64_t last_percent_ = ~uint64_t{0};
};

// The bpe pass: SentencePiece learns from the lines of the first `train_chars` characters (at most
// kMaxBpeTrainingBytes of them; lines longer than kMaxLineChars are cut). Only the bpe_char_budget
// most frequent characters are kept whole: a sentence is cut at any other, which falls back to bytes.
Vocab train_tokenizer(const std::vector<std::string>& files, const PrepareOptions& options, int64_t train_chars,
                      const std::vector<uint64_t>& counts) {
  std::vector<std::pair<uint64_t, char32_t>> by_count;
  for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    if (counts[cp] != 0 && cp != U'\n') by_count.emplace_back(counts[cp], cp);
  }
  const auto keep_count = std::min<size_t>(by_count.size(), static_cast<size_t>(bpe_char_budget(options.vocab_size)));
  std::partial_sort(by_count.begin(), by_count.begin() + static_cast<std::ptrdiff_t>(keep_count), by_count.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  std::vector<bool> kept(kMaxCodePoint + 1, false);
  for (size_t i = 0; i < keep_count; ++i) kept[by_count[i].second] = true;

  CorpusReader reader(files, options.separator, options.errors);
  ProgressTicker tick(options, 3);
  std::u32string_view piece;
  size_t used = 0;
  int64_t left = train_chars;
  uint64_t fed = 0;
  const auto next_sentence = [&](std::string& sentence) {
    sentence.clear();
    size_t chars = 0;
    while (left > 0 && fed < kMaxBpeTrainingBytes && chars < kMaxLineChars) {
      if (used == piece.size()) {
        if (!reader.next(piece)) break;
        used = 0;
        tick(reader);
      }
      const char32_t cp = piece[used++];
      --left;
      if (cp == U'\n' || !kept[cp]) {
        if (chars > 0) break;
        continue;  // SentencePiece has no use for empty sentences
      }
      append_utf8(sentence, cp);
      ++chars;
    }
    fed += sentence.size();
    return !sentence.empty();
  };
  return Vocab::from_bpe_model(train_bpe(next_sentence, options.vocab_size), options.vocab_size);
}

}  // namespace

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t hash = 14695981039346656037ULL;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return hash;
}

DatasetMeta prepare_dataset(const PrepareOptions& options) {
  validate_options(options);
  std::vector<std::string> inputs{options.input};
  inputs.insert(inputs.end(), options.more_inputs.begin(), options.more_inputs.end());
  const std::vector<std::string> files = corpus_files(inputs, options.out_dir);
  DatasetMeta meta;
  meta.version = kMetaVersion;
  meta.input_mtime_ns = files.size() == 1 ? mtime_ns(files[0]) : 0;

  // Pass 1: which characters occur and how often (a table over all code points: sorted for free).
  std::vector<uint64_t> counts(kMaxCodePoint + 1, 0);
  int64_t n = 0;
  std::u32string_view piece;
  {
    CorpusReader reader(files, options.separator, options.errors);
    ProgressTicker tick(options, 1);
    while (reader.next(piece)) {
      for (char32_t cp : piece) ++counts[cp];
      n += static_cast<int64_t>(piece.size());
      tick(reader);
    }
    meta.input_bytes = reader.bytes_read();
    meta.input_hash = reader.checksum();
    meta.replaced = reader.replaced();
  }
  if (n == 0) {
    throw std::runtime_error(std::string(files.size() == 1 ? "[data] input file '" : "[data] input '") + options.input +
                             "' is empty (it must hold UTF-8 text)");
  }
  std::u32string chars;
  for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    if (counts[cp] != 0) chars.push_back(cp);
  }
  meta.train_chars = static_cast<int64_t>(static_cast<double>(n) * (1.0 - options.val_fraction));  // int(n * 0.9)
  meta.val_chars = n - meta.train_chars;
  meta.train_tokens = meta.train_chars;  // char; bpe: known once the splits are encoded (never more)
  meta.val_tokens = meta.val_chars;
  meta.val_fraction = options.val_fraction;
  check_split_sizes(meta, options);
  const bool bpe = options.tokenizer == TokenizerKind::Bpe || options.vocab.has_value();  // subwords, line by line
  meta.vocab = options.vocab                                        ? *options.vocab
               : options.tokenizer == TokenizerKind::Bpe ? train_tokenizer(files, options, meta.train_chars, counts)
                                                         : Vocab::from_chars(chars);
  counts = {};
  make_out_dir(options.out_dir);

  // Pass 2: code point -> id through a table (char), or each line through the tokenizer (bpe),
  // streamed into train.bin then val.bin.
  std::vector<int32_t> id_of(bpe ? 0 : kMaxCodePoint + 1, -1);
  for (size_t id = 0; id < chars.size() && !bpe; ++id) id_of[chars[id]] = static_cast<int32_t>(id);
  CorpusReader reader(files, options.separator, options.errors);
  ProgressTicker tick(options, 2);
  std::vector<int32_t> ids;
  size_t used = 0;  // characters of `piece` already written
  piece = {};
  const auto write_split = [&](const std::string& path, int64_t count) {
    uint64_t checksum = 0;
    io::write_file_atomically(path, [&](const std::string& tmp) {
      TokenFileWriter writer(tmp, static_cast<uint64_t>(count), meta.vocab.size());
      while (writer.written() < static_cast<uint64_t>(count)) {
        if (used == piece.size()) {
          if (!reader.next(piece)) throw std::runtime_error("the input became shorter while it was prepared");
          used = 0;
          tick(reader);
        }
        const size_t take = std::min<uint64_t>(piece.size() - used, static_cast<uint64_t>(count) - writer.written());
        ids.resize(take);
        for (size_t i = 0; i < take; ++i) ids[i] = id_of[piece[used + i]];
        writer.append(ids.data(), take);  // an id of -1 (a character pass 1 did not see) is refused there
        used += take;
      }
      checksum = writer.finish();
    });
    return checksum;
  };
  // bpe: `chars` characters of the input (whole lines, cut at kMaxLineChars) -> tokens; returns how many.
  const auto write_bpe_split = [&](const std::string& path, int64_t chars_left, int64_t& tokens) {
    uint64_t checksum = 0;
    io::write_file_atomically(path, [&](const std::string& tmp) {
      TokenFileWriter writer(tmp, TokenFileWriter::kCountAtFinish, meta.vocab.size());
      std::string line;
      size_t line_chars = 0;
      const auto encode_line = [&] {
        // An imported tokenizer's special tokens (Llama's <s>) belong to a prompt, not to every line.
        const HfTokenizer* hf = meta.vocab.hf_tokenizer();
        const std::vector<int64_t> encoded = hf ? hf->encode(line, /*add_special_tokens=*/false) : meta.vocab.encode(line);
        ids.assign(encoded.begin(), encoded.end());
        writer.append(ids.data(), ids.size());
        line.clear();
        line_chars = 0;
      };
      for (; chars_left > 0; --chars_left) {
        if (used == piece.size()) {
          if (!reader.next(piece)) throw std::runtime_error("the input became shorter while it was prepared");
          used = 0;
          tick(reader);
        }
        const char32_t cp = piece[used++];
        append_utf8(line, cp);
        if (cp == U'\n' || ++line_chars == kMaxLineChars) encode_line();
      }
      encode_line();
      tokens = static_cast<int64_t>(writer.written());
      checksum = writer.finish();
    });
    return checksum;
  };
  // Drop the old meta first: until the new one lands, the directory reads as "not prepared", so a
  // crash between the writes below never pairs new token files with a stale meta (or vice versa).
  std::error_code ec;
  fs::remove(join(options.out_dir, "meta.bin"), ec);
  if (bpe) {
    meta.train_checksum = write_bpe_split(join(options.out_dir, "train.bin"), meta.train_chars, meta.train_tokens);
    meta.val_checksum = write_bpe_split(join(options.out_dir, "val.bin"), meta.val_chars, meta.val_tokens);
    check_split_sizes(meta, options);
  } else {
    meta.train_checksum = write_split(join(options.out_dir, "train.bin"), meta.train_tokens);
    meta.val_checksum = write_split(join(options.out_dir, "val.bin"), meta.val_tokens);
  }
  if (used != piece.size() || reader.next(piece) || reader.checksum() != meta.input_hash) {
    throw std::runtime_error("[data] the input changed while it was prepared (prepare it again once it is complete)");
  }
  io::write_bytes_atomically(join(options.out_dir, "meta.bin"), serialize_meta(meta));
  return meta;
}

double val_tokens_per_char(const DatasetMeta& meta) {
  return meta.val_chars > 0 ? static_cast<double>(meta.val_tokens) / static_cast<double>(meta.val_chars) : 1.0;
}

std::string summary_line(const DatasetMeta& meta) {
  std::string line = fmt::format("[data] vocab_size={} train_tokens={} val_tokens={}", meta.vocab.size(),
                                 meta.train_tokens, meta.val_tokens);
  if (meta.vocab.kind() != TokenizerKind::Char)
    line += fmt::format(" tokenizer={} val_chars_per_token={:.3f}", meta.vocab.kind_name(), 1.0 / val_tokens_per_char(meta));
  return line;
}

DatasetMeta read_meta(const std::string& out_dir) {
  const std::string path = join(out_dir, "meta.bin");
  const std::string bytes = io::read_file(path);
  const auto bad = [&](const std::string& what) {
    return std::runtime_error("[data] '" + path + "': " + what + " (re-run `nanogpt prepare` to rebuild it)");
  };
  if (bytes.size() < kMetaV1FixedBytes) {
    throw bad(fmt::format("the file has {} bytes, too short for a meta file", bytes.size()));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (std::memcmp(p, kMetaMagic, sizeof(kMetaMagic)) != 0) throw bad("not a meta file (wrong magic number)");
  const uint64_t version = io::get_le(p + 8, 4);
  if (version < 1 || version > kMetaVersion) {
    throw bad(fmt::format("unsupported meta file version {} (this build reads versions 1 to {})", version, kMetaVersion));
  }
  const size_t fixed = version == 1 ? kMetaV1FixedBytes : version == 2 ? kMetaV2FixedBytes : kMetaFixedBytes;
  if (bytes.size() < fixed) throw bad(fmt::format("the file has {} bytes, too short for a meta file", bytes.size()));
  DatasetMeta meta;
  meta.version = static_cast<uint32_t>(version);
  const uint64_t train = io::get_le(p + 12, 8);
  const uint64_t val = io::get_le(p + 20, 8);
  meta.input_bytes = io::get_le(p + 28, 8);
  meta.input_hash = io::get_le(p + 36, 8);
  meta.val_fraction = bits_double(io::get_le(p + 44, 8));
  if (version >= 2) {
    meta.input_mtime_ns = static_cast<int64_t>(io::get_le(p + 52, 8));
    meta.train_checksum = io::get_le(p + 60, 8);
    meta.val_checksum = io::get_le(p + 68, 8);
  }
  // Versions 1 and 2 held only char datasets: a character per token.
  const uint64_t train_chars = version >= 3 ? io::get_le(p + 76, 8) : train;
  const uint64_t val_chars = version >= 3 ? io::get_le(p + 84, 8) : val;
  const uint64_t vocab_bytes = io::get_le(p + fixed - 8, 8);
  if (vocab_bytes != bytes.size() - fixed) {
    throw bad(fmt::format("the vocabulary should be {} bytes but {} follow the header (truncated or corrupt)", vocab_bytes,
                          bytes.size() - fixed));
  }
  if (train > (uint64_t{1} << 62) || val > (uint64_t{1} << 62)) throw bad("implausible token counts");
  if (train_chars > (uint64_t{1} << 62) || val_chars > (uint64_t{1} << 62)) throw bad("implausible character counts");
  meta.train_chars = static_cast<int64_t>(train_chars);
  meta.val_chars = static_cast<int64_t>(val_chars);
  if (!(meta.val_fraction > 0.0 && meta.val_fraction < 1.0)) throw bad("val_fraction is not between 0 and 1");
  meta.train_tokens = static_cast<int64_t>(train);
  meta.val_tokens = static_cast<int64_t>(val);
  try {
    meta.vocab = Vocab::deserialize(std::string_view(bytes).substr(fixed));
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
  if (meta.vocab.size() == 0) throw bad("the vocabulary is empty");
  if (meta.vocab.kind() == TokenizerKind::Char && (meta.train_chars != meta.train_tokens || meta.val_chars != meta.val_tokens))
    throw bad("character and token counts differ for a char tokenizer");
  return meta;
}

bool is_prepared(const std::string& input, const std::string& out_dir, double val_fraction) {
  DatasetMeta meta;
  try {
    meta = read_meta(out_dir);
  } catch (const std::exception&) {
    return false;
  }
  // Version 1 recorded no token checksums: preparing again adds them.
  if (meta.version < kMetaVersion || meta.val_fraction != val_fraction) return false;
  std::error_code ec;
  const auto check_tokens = [&](const char* name, int64_t count) {
    const auto size = fs::file_size(join(out_dir, name), ec);
    return !ec && size == token_file_bytes(count, meta.vocab.size());
  };
  if (!check_tokens("train.bin", meta.train_tokens) || !check_tokens("val.bin", meta.val_tokens)) return false;
  const auto input_size = fs::file_size(input, ec);
  if (ec || input_size != meta.input_bytes) return false;  // cheap tests before reading it
  // An unchanged modification time vouches for the content, unless the file was modified within 2 s
  // of meta.bin's writing: clocks tick coarsely, so an edit then could keep the time ("racy git").
  constexpr int64_t kClockSlackNs = 2'000'000'000;
  if (meta.input_mtime_ns != 0 && mtime_ns(input) == meta.input_mtime_ns &&
      meta.input_mtime_ns + kClockSlackNs < mtime_ns(join(out_dir, "meta.bin")))
    return true;
  try {
    CorpusReader reader({input}, "", Utf8Errors::replace);
    std::u32string_view piece;
    while (reader.next(piece)) {
    }
    return reader.checksum() == meta.input_hash;
  } catch (const std::exception&) {
    return false;
  }
}

DatasetMeta ensure_prepared(const PrepareOptions& options, bool* prepared) {
  validate_options(options);
  if (is_prepared(options.input, options.out_dir, options.val_fraction)) {
    DatasetMeta meta = read_meta(options.out_dir);
    const bool same_tokenizer = meta.vocab.kind() == options.tokenizer &&
                                (options.tokenizer == TokenizerKind::Char || meta.vocab.requested_vocab_size() == options.vocab_size);
    if (same_tokenizer) {
      check_split_sizes(meta, options);
      if (prepared) *prepared = false;
      return meta;
    }
  }
  DatasetMeta meta = prepare_dataset(options);
  if (prepared) *prepared = true;
  return meta;
}

std::string dataset_dir(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") return name;
  return "data/" + name;
}

}  // namespace nanogpt::data
