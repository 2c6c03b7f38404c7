// safetensors writer and validating reader. See safetensors.h for the layout.
#include "io/safetensors.h"

#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "io/atomic_file.h"
#include "io/little_endian.h"
#include "io/text.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes; this writer copies host memory as is");

namespace nanogpt::io {
namespace {

using Json = nlohmann::ordered_json;  // keeps the header's member order

struct Dtype {
  const char* name;
  torch::ScalarType type;
};

constexpr Dtype kDtypes[] = {
    {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16}, {"F64", torch::kFloat64},
    {"I64", torch::kInt64},   {"I32", torch::kInt32},   {"I16", torch::kInt16},     {"I8", torch::kInt8},
    {"U8", torch::kUInt8},    {"BOOL", torch::kBool},
};
constexpr const char* kSupported = "F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL";
constexpr const char* kMetadataKey = "__metadata__";
constexpr int kMaxJsonDepth = 64;  // a safetensors header nests 3 deep; deeper is damage

const Dtype* dtype_of(torch::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return &d;
  return nullptr;
}

const Dtype* dtype_named(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}


// A JSON value quoted in an error message, cut short: a damaged shape may hold a million numbers.
std::string brief(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

const char* kind_name(const Json& value) {
  return value.type_name();  // "object", "array", "string", "number", "boolean", "null"
}

// nlohmann's error without its "[json.exception.parse_error.101] " tag (ours comes first) and
// without its "; last read: ..." (raw header bytes: excerpt() quotes them safely instead).
std::string json_reason(const std::string& what) {
  std::string reason = what;
  const auto tag_end = reason.find("] ");
  if (reason.rfind("[json.exception.", 0) == 0 && tag_end != std::string::npos) reason = reason.substr(tag_end + 2);
  return reason.substr(0, reason.find("; last read"));
}

// Up to 24 header bytes before `end`, every byte outside printable ASCII as \xNN.
std::string excerpt(std::string_view text, size_t end) {
  end = std::min(end, text.size());
  const size_t begin = end > 24 ? end - 24 : 0;
  return printable(text.substr(begin, end - begin), Escape::non_ascii);
}

// Parses the header; nlohmann silently keeps the last of two equal keys, which would hide a
// damaged name, so the parser callback rejects them (and absurd nesting) as it reads.
Json parse_header(std::string_view text) {
  std::vector<std::set<std::string>> keys;  // per open object
  const auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxJsonDepth) throw std::runtime_error(fmt::format("nesting deeper than {}", kMaxJsonDepth));
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
      throw std::runtime_error("duplicate key " + parsed.dump());
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::parse_error& e) {
    throw std::runtime_error(fmt::format("at byte {} (after '{}'): {}", e.byte, excerpt(text, e.byte), json_reason(e.what())));
  } catch (const Json::exception& e) {
    throw std::runtime_error(json_reason(e.what()));
  }
}

std::string header_json(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json& meta = header[kMetadataKey] = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const uint64_t end = offset + tensor.nbytes();
    header[name] = {{"dtype", dtype_of(tensor.scalar_type())->name},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  return json;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata, std::string_view tag,
                       const std::function<void(size_t)>& after_tensor) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error("[" + std::string(tag) + "] cannot write '" + path + "': " + what);
  };
  std::vector<std::pair<std::string, torch::Tensor>> cpu;  // contiguous CPU copies (views when already so)
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty()) fail("a tensor has an empty name");
    if (name == kMetadataKey) fail("the tensor name '__metadata__' is reserved for metadata");
    if (!is_utf8(name)) fail("tensor name '" + printable(name) + "' is not valid UTF-8");
    if (!names.insert(name).second) fail("duplicate tensor name '" + name + "'");
    if (!tensor.defined()) fail("tensor '" + name + "' is undefined");
    if (dtype_of(tensor.scalar_type()) == nullptr)
      fail("tensor '" + name + "' has dtype " + std::string(c10::toString(tensor.scalar_type())) +
           ", which safetensors export does not support (supported: " + kSupported + ")");
    cpu.emplace_back(name, tensor.detach().to(torch::kCPU).contiguous());
  }
  for (const auto& [key, value] : metadata)
    if (!is_utf8(key) || !is_utf8(value)) fail("metadata '" + printable(key) + "' is not valid UTF-8");

  const std::string header = header_json(cpu, metadata);
  write_file_atomically(
      path,
      [&](const std::string& tmp_path) {
        std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
        if (!out) throw std::runtime_error(std::strerror(errno));
        unsigned char length[8];
        put_le(length, header.size(), 8);
        out.write(reinterpret_cast<const char*>(length), 8);
        out.write(header.data(), static_cast<std::streamsize>(header.size()));
        size_t written = 0;
        for (const auto& [name, tensor] : cpu) {
          if (tensor.nbytes() > 0)
            out.write(static_cast<const char*>(tensor.data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
          if (after_tensor) {
            out.flush();  // what the callback sees on disk is what was written
            after_tensor(++written);
          }
        }
        out.flush();
        if (!out) throw std::runtime_error(std::string("write failed: ") + std::strerror(errno));
      },
      tag);
}

void SafeTensorsReader::fail(const std::string& what) const {
  throw std::runtime_error(printable("[" + tag_ + "] '" + path_ + "': " + what));  // one line, even for hostile bytes
}

SafeTensorsReader::SafeTensorsReader(const std::string& path, std::string_view tag) : path_(path), tag_(tag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode))
    throw std::runtime_error("[" + tag_ + "] cannot read '" + path + "': " +
                             (S_ISDIR(st.st_mode) ? "is a directory" : std::strerror(errno)));
  in_.open(path, std::ios::binary);
  if (!in_) throw std::runtime_error("[" + tag_ + "] cannot read '" + path + "': " + std::strerror(errno));
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (file_size_ < 8)
    fail(fmt::format("file is {} bytes, too short for the 8-byte header length (empty or truncated file?)", file_size_));
  unsigned char length[8];
  in_.read(reinterpret_cast<char*>(length), 8);
  const uint64_t header_len = get_le(length, 8);
  if (!in_ || header_len > file_size_ - 8)
    fail(fmt::format("header length {} exceeds the {} bytes after it (truncated file, or not a safetensors file?)",
                     header_len, file_size_ - 8));
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size_ - data_start_;
  std::string text(header_len, '\0');
  in_.read(text.data(), static_cast<std::streamsize>(header_len));
  if (!in_) fail(fmt::format("cannot read the {}-byte header (file changed while reading?)", header_len));

  Json header;
  try {
    header = parse_header(text);
  } catch (const std::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what() + " (corrupted file, or not a safetensors file?)");
  }
  if (!header.is_object()) fail(std::string("header is a JSON ") + kind_name(header) + ", expected an object");

  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) fail("__metadata__ is not an object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string())
          fail("metadata '" + key + "' is a " + kind_name(v) + ", but metadata values must be strings");
        metadata_[key] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!value.is_object()) fail(where + " is not described by an object");
    for (const auto& [key, v] : value.items())
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        fail(where + " has an unknown field '" + key + "' (expected dtype, shape, data_offsets)");
    if (!value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets"))
      fail(where + " lacks dtype, shape or data_offsets");
    const Json& dtype = value["dtype"];
    const Json& shape = value["shape"];
    const Json& offsets = value["data_offsets"];
    const Dtype* known = dtype.is_string() ? dtype_named(dtype.get<std::string>()) : nullptr;
    if (!known) fail(where + " has dtype " + brief(dtype) + " (supported: " + kSupported + ")");
    TensorInfo info{name, known->type, {}, 0, 0};
    if (!shape.is_array()) fail(where + ": shape is not an array");
    for (const auto& dim : shape) {
      if (!dim.is_number_unsigned())  // nlohmann reads a non-negative integer literal as unsigned
        fail(where + ": shape " + brief(shape) + " must hold non-negative integers");
      if (dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(where + ": shape " + brief(shape) + " is too large");
      info.shape.push_back(dim.get<int64_t>());
    }
    if (!offsets.is_array() || offsets.size() != 2) fail(where + ": data_offsets must be [begin, end]");
    for (const auto& o : offsets)
      if (!o.is_number_unsigned()) fail(where + ": data_offsets " + brief(offsets) + " must be non-negative integers");
    info.begin = offsets[0].get<uint64_t>();
    info.end = offsets[1].get<uint64_t>();
    if (info.begin > info.end || info.end > data_size)
      fail(fmt::format("{}: data_offsets {} lie outside the data section of {} bytes (truncated or corrupted file?)", where,
                       brief(offsets), data_size));
    // shape x dtype size, without overflow: a zero dimension makes it 0 whatever the others are.
    uint64_t expected = torch::elementSize(info.dtype);
    if (std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end()) expected = 0;
    for (int64_t dim : info.shape)
      if (expected != 0 && __builtin_mul_overflow(expected, static_cast<uint64_t>(dim), &expected))
        fail(where + ": shape " + brief(shape) + " is too large");
    if (expected != info.end - info.begin)
      fail(fmt::format("{}: shape {} of {} needs {} bytes but data_offsets {} span {} (corrupted header?)", where, brief(shape),
                       known->name, expected, brief(offsets), info.end - info.begin));
    tensors_.push_back(std::move(info));
  }

  // The tensors must tile the data section exactly: no gaps, no overlaps, no trailing bytes.
  std::stable_sort(tensors_.begin(), tensors_.end(),
                   [](const TensorInfo& a, const TensorInfo& b) { return a.begin < b.begin; });
  uint64_t covered = 0;
  for (const TensorInfo& t : tensors_) {
    if (t.begin != covered)
      fail(fmt::format("tensor '{}' starts at data offset {} but the tensors before it end at {} (gaps and overlaps are "
                       "not allowed)", t.name, t.begin, covered));
    covered = t.end;
  }
  if (covered != data_size)
    fail(fmt::format("the tensors cover {} bytes but the data section holds {} (trailing bytes, or a corrupted header?)",
                     covered, data_size));
}

const TensorInfo* SafeTensorsReader::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

torch::Tensor SafeTensorsReader::read(const TensorInfo& info) {
  // The header checks bound the allocation by the file size.
  torch::Tensor t = torch::empty(info.shape, torch::TensorOptions().dtype(info.dtype));
  read_into(info, t);
  return t;
}

void SafeTensorsReader::read_into(const TensorInfo& info, const torch::Tensor& dst) {
  if (dst.sizes() != torch::IntArrayRef(info.shape) || !dst.device().is_cpu())
    throw std::invalid_argument(fmt::format("[{}] tensor '{}': read_into needs a CPU tensor of its shape", tag_, info.name));
  if (!dst.is_contiguous() || dst.scalar_type() != info.dtype) {
    torch::NoGradGuard no_grad;
    dst.copy_(read(info));
    return;
  }
  const uint64_t n = info.end - info.begin;
  if (n > 0) {
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(data_start_ + info.begin));
    in_.read(static_cast<char*>(dst.data_ptr()), static_cast<std::streamsize>(n));
    if (!in_) fail(fmt::format("tensor '{}': cannot read its {} bytes (file changed while reading?)", info.name, n));
  }
  if (info.dtype == torch::kBool) {
    const auto* bytes = static_cast<const unsigned char*>(dst.data_ptr());
    for (uint64_t i = 0; i < n; ++i)
      if (bytes[i] > 1)
        fail(fmt::format("tensor '{}' is BOOL but holds byte {} (only 0 and 1 are valid)", info.name, bytes[i]));
  }
}

SafeTensors read_safetensors(const std::string& path, std::string_view tag) {
  SafeTensorsReader reader(path, tag);
  SafeTensors result;
  result.metadata = reader.metadata();
  for (const auto& info : reader.tensors()) result.tensors.emplace_back(info.name, reader.read(info));
  return result;
}

}  // namespace nanogpt::io
