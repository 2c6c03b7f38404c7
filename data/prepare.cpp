// Dataset preparation: input.txt -> train.bin, val.bin, meta.bin, like nanoGPT's
// data/shakespeare_char/prepare.py: the first int(n * (1 - val_fraction)) characters train, the rest val.
//
// meta.bin layout (little-endian):
//   magic         8 bytes  "NGPTMETA"
//   version       uint32   1
//   train_tokens  uint64
//   val_tokens    uint64
//   input_bytes   uint64
//   input_hash    uint64   FNV-1a 64 of the input bytes
//   val_fraction  uint64   IEEE-754 double bits
//   vocab_bytes   uint64   length of the vocabulary blob that follows
//   vocab         Vocab::serialize()
#include "data/prepare.h"

#include <fmt/format.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "io/atomic_file.h"
#include "data/token_file.h"
#include "data/utf8.h"

namespace nanogpt::data {
namespace {

namespace fs = std::filesystem;

constexpr char kMetaMagic[8] = {'N', 'G', 'P', 'T', 'M', 'E', 'T', 'A'};
constexpr uint32_t kMetaVersion = 1;
constexpr size_t kMetaFixedBytes = 8 + 4 + 6 * 8;

std::string join(const std::string& dir, const char* name) { return (fs::path(dir) / name).string(); }

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

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
  put_le(out, kMetaVersion, 4);
  put_le(out, static_cast<uint64_t>(meta.train_tokens), 8);
  put_le(out, static_cast<uint64_t>(meta.val_tokens), 8);
  put_le(out, meta.input_bytes, 8);
  put_le(out, meta.input_hash, 8);
  put_le(out, double_bits(meta.val_fraction), 8);
  put_le(out, vocab.size(), 8);
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

// Reads the input with errors that say what to pass instead.
std::string read_input(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status)) throw std::runtime_error("[data] input file '" + path + "' does not exist (check --input)");
  if (fs::is_directory(status)) {
    throw std::runtime_error("[data] input '" + path + "' is a directory, not a text file (pass a UTF-8 text file, "
                             "e.g. data/shakespeare_char/input.txt)");
  }
  std::string bytes = io::read_file(path);
  if (bytes.empty()) throw std::runtime_error("[data] input file '" + path + "' is empty (it must hold UTF-8 text)");
  return bytes;
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

// The size a token file must have for `count` tokens of this vocabulary (see token_file.h).
uint64_t token_file_bytes(int64_t count, int64_t vocab_size) {
  return 24 + static_cast<uint64_t>(count) * (vocab_size <= 65536 ? 2 : 4);
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
  const std::string bytes = read_input(options.input);
  std::u32string chars;
  try {
    chars = decode_utf8(bytes);
  } catch (const std::exception& e) {
    // "[data] invalid UTF-8 at ..." -> "[data] 'input.txt': invalid UTF-8 at ..."
    std::string what = e.what();
    if (what.rfind("[data] ", 0) == 0) what = what.substr(7);
    throw std::runtime_error("[data] '" + options.input + "': " + what);
  }

  DatasetMeta meta;
  meta.vocab = Vocab::from_chars(chars);
  const auto n = static_cast<int64_t>(chars.size());
  meta.train_tokens = static_cast<int64_t>(static_cast<double>(n) * (1.0 - options.val_fraction));  // int(n * 0.9)
  meta.val_tokens = n - meta.train_tokens;
  meta.input_bytes = bytes.size();
  meta.input_hash = fnv1a64(bytes);
  meta.val_fraction = options.val_fraction;
  check_split_sizes(meta, options);
  make_out_dir(options.out_dir);

  std::vector<int64_t> ids = meta.vocab.encode_chars(chars);
  const std::vector<int64_t> val(ids.begin() + meta.train_tokens, ids.end());
  ids.resize(static_cast<size_t>(meta.train_tokens));

  // Drop the old meta first: until the new one lands, the directory reads as "not prepared", so a
  // crash between the writes below never pairs new token files with a stale meta (or vice versa).
  std::error_code ec;
  fs::remove(join(options.out_dir, "meta.bin"), ec);
  write_token_file(join(options.out_dir, "train.bin"), ids, meta.vocab.size());
  write_token_file(join(options.out_dir, "val.bin"), val, meta.vocab.size());
  io::write_bytes_atomically(join(options.out_dir, "meta.bin"), serialize_meta(meta));
  return meta;
}

std::string summary_line(const DatasetMeta& meta) {
  std::ostringstream line;
  line << "[data] vocab_size=" << meta.vocab.size() << " train_tokens=" << meta.train_tokens
       << " val_tokens=" << meta.val_tokens;
  return line.str();
}

DatasetMeta read_meta(const std::string& out_dir) {
  const std::string path = join(out_dir, "meta.bin");
  const std::string bytes = io::read_file(path);
  const auto bad = [&](const std::string& what) {
    return std::runtime_error("[data] '" + path + "': " + what + " (re-run `nanogpt prepare` to rebuild it)");
  };
  if (bytes.size() < kMetaFixedBytes) {
    throw bad(fmt::format("the file has {} bytes, too short for a meta file", bytes.size()));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (std::memcmp(p, kMetaMagic, sizeof(kMetaMagic)) != 0) throw bad("not a meta file (wrong magic number)");
  const uint64_t version = get_le(p + 8, 4);
  if (version != kMetaVersion) {
    throw bad(fmt::format("unsupported meta file version {} (this build reads version {})", version, kMetaVersion));
  }
  DatasetMeta meta;
  const uint64_t train = get_le(p + 12, 8);
  const uint64_t val = get_le(p + 20, 8);
  meta.input_bytes = get_le(p + 28, 8);
  meta.input_hash = get_le(p + 36, 8);
  meta.val_fraction = bits_double(get_le(p + 44, 8));
  const uint64_t vocab_bytes = get_le(p + 52, 8);
  if (vocab_bytes != bytes.size() - kMetaFixedBytes) {
    throw bad(fmt::format("the vocabulary should be {} bytes but {} follow the header (truncated or corrupt)", vocab_bytes,
                          bytes.size() - kMetaFixedBytes));
  }
  if (train > (uint64_t{1} << 62) || val > (uint64_t{1} << 62)) throw bad("implausible token counts");
  if (!(meta.val_fraction > 0.0 && meta.val_fraction < 1.0)) throw bad("val_fraction is not between 0 and 1");
  meta.train_tokens = static_cast<int64_t>(train);
  meta.val_tokens = static_cast<int64_t>(val);
  try {
    meta.vocab = Vocab::deserialize(std::string_view(bytes).substr(kMetaFixedBytes));
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
  if (meta.vocab.size() == 0) throw bad("the vocabulary is empty");
  return meta;
}

bool is_prepared(const std::string& input, const std::string& out_dir, double val_fraction) {
  DatasetMeta meta;
  try {
    meta = read_meta(out_dir);
  } catch (const std::exception&) {
    return false;
  }
  if (meta.val_fraction != val_fraction) return false;
  std::error_code ec;
  const auto check_tokens = [&](const char* name, int64_t count) {
    const auto size = fs::file_size(join(out_dir, name), ec);
    return !ec && size == token_file_bytes(count, meta.vocab.size());
  };
  if (!check_tokens("train.bin", meta.train_tokens) || !check_tokens("val.bin", meta.val_tokens)) return false;
  const auto input_size = fs::file_size(input, ec);
  if (ec || input_size != meta.input_bytes) return false;  // cheap test before hashing
  try {
    return fnv1a64(io::read_file(input)) == meta.input_hash;
  } catch (const std::exception&) {
    return false;
  }
}

DatasetMeta ensure_prepared(const PrepareOptions& options, bool* prepared) {
  validate_options(options);
  if (is_prepared(options.input, options.out_dir, options.val_fraction)) {
    DatasetMeta meta = read_meta(options.out_dir);
    check_split_sizes(meta, options);
    if (prepared) *prepared = false;
    return meta;
  }
  DatasetMeta meta = prepare_dataset(options);
  if (prepared) *prepared = true;
  return meta;
}

}  // namespace nanogpt::data
