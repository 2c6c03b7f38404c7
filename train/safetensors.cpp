// safetensors writer and validating reader. See safetensors.h for the layout.
#include "train/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include "data/atomic_file.h"
#include "data/utf8.h"
#include "train/json.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian bytes; this writer copies host memory as is");

namespace nanogpt::train {
namespace {

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

bool is_utf8(const std::string& s) {
  try {
    data::decode_utf8(s);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}


std::string header_json(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += json::quote(kMetadataKey) + ":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) json += ',';
      first = false;
      json += json::quote(key) + ':' + json::quote(value);
    }
    json += '}';
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (json.size() > 1) json += ',';
    json += json::quote(name) + ":{\"dtype\":\"" + dtype_of(tensor.scalar_type())->name + "\",\"shape\":[";
    for (int64_t d = 0; d < tensor.dim(); ++d) json += (d ? "," : "") + std::to_string(tensor.size(d));
    uint64_t end = offset + tensor.nbytes();
    json += "],\"data_offsets\":[" + std::to_string(offset) + ',' + std::to_string(end) + "]}";
    offset = end;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  return json;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error("[export] cannot write '" + path + "': " + what);
  };
  std::vector<std::pair<std::string, torch::Tensor>> cpu;  // contiguous CPU copies (views when already so)
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty()) fail("a tensor has an empty name");
    if (name == kMetadataKey) fail("the tensor name '__metadata__' is reserved for metadata");
    if (!is_utf8(name)) fail("tensor name " + json::quote(name) + " is not valid UTF-8");
    if (!names.insert(name).second) fail("duplicate tensor name '" + name + "'");
    if (!tensor.defined()) fail("tensor '" + name + "' is undefined");
    if (dtype_of(tensor.scalar_type()) == nullptr)
      fail("tensor '" + name + "' has dtype " + std::string(c10::toString(tensor.scalar_type())) +
           ", which safetensors export does not support (supported: " + kSupported + ")");
    cpu.emplace_back(name, tensor.detach().to(torch::kCPU).contiguous());
  }
  for (const auto& [key, value] : metadata)
    if (!is_utf8(key) || !is_utf8(value)) fail("metadata '" + key + "' is not valid UTF-8");

  const std::string header = header_json(cpu, metadata);
  data::write_file_atomically(
      path,
      [&](const std::string& tmp_path) {
        std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
        if (!out) throw std::runtime_error(std::strerror(errno));
        unsigned char length[8];
        for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
        out.write(reinterpret_cast<const char*>(length), 8);
        out.write(header.data(), static_cast<std::streamsize>(header.size()));
        for (const auto& [name, tensor] : cpu)
          if (tensor.nbytes() > 0)
            out.write(static_cast<const char*>(tensor.data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
        out.flush();
        if (!out) throw std::runtime_error(std::string("write failed: ") + std::strerror(errno));
      },
      "export");
}

SafeTensors read_safetensors(const std::string& path) {
  auto fail = [&](const std::string& what) -> void {
    throw std::runtime_error(data::escape_controls("[export] '" + path + "': " + what));
  };
  const std::string bytes = data::read_file(path, "export");
  if (bytes.size() < 8)
    fail("file is " + std::to_string(bytes.size()) +
         " bytes, too short for the 8-byte header length (empty or truncated file?)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  if (header_len > bytes.size() - 8)
    fail("header length " + std::to_string(header_len) + " exceeds the " + std::to_string(bytes.size() - 8) +
         " bytes after it (truncated file, or not a safetensors file?)");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = bytes.size() - data_start;

  json::Value header;
  try {
    header = json::parse(std::string_view(bytes).substr(8, header_len));
  } catch (const std::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what() + " (corrupted file, or not a safetensors file?)");
  }
  if (header.kind != json::Value::Kind::Object)
    fail(std::string("header is a JSON ") + json::kind_name(header.kind) + ", expected an object");

  struct Entry {
    std::string name;
    const Dtype* dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  SafeTensors result;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.object) {
    if (name == kMetadataKey) {
      if (value.kind != json::Value::Kind::Object) fail("__metadata__ is not an object");
      for (const auto& [key, v] : value.object) {
        if (v.kind != json::Value::Kind::String)
          fail("metadata '" + key + "' is a " + json::kind_name(v.kind) + ", but metadata values must be strings");
        result.metadata[key] = v.string;
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (value.kind != json::Value::Kind::Object) fail(where + " is not described by an object");
    for (const auto& [key, v] : value.object)
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        fail(where + " has an unknown field '" + key + "' (expected dtype, shape, data_offsets)");
    const json::Value* dtype = value.find("dtype");
    const json::Value* shape = value.find("shape");
    const json::Value* offsets = value.find("data_offsets");
    if (!dtype || !shape || !offsets) fail(where + " lacks dtype, shape or data_offsets");
    Entry entry{name, nullptr, {}, 0, 0};
    if (dtype->kind != json::Value::Kind::String || !(entry.dtype = dtype_named(dtype->string)))
      fail(where + " has dtype " + json::dump(*dtype) + " (supported: " + kSupported + ")");
    if (shape->kind != json::Value::Kind::Array) fail(where + ": shape is not an array");
    for (const auto& dim : shape->array) {
      if (dim.kind != json::Value::Kind::Number || !dim.is_integer || dim.integer < 0)
        fail(where + ": shape " + json::dump(*shape) + " must hold non-negative integers");
      entry.shape.push_back(dim.integer);
    }
    if (offsets->kind != json::Value::Kind::Array || offsets->array.size() != 2)
      fail(where + ": data_offsets must be [begin, end]");
    for (const auto& o : offsets->array)
      if (o.kind != json::Value::Kind::Number || !o.is_integer || o.integer < 0)
        fail(where + ": data_offsets " + json::dump(*offsets) + " must be non-negative integers");
    entry.begin = static_cast<uint64_t>(offsets->array[0].integer);
    entry.end = static_cast<uint64_t>(offsets->array[1].integer);
    if (entry.begin > entry.end || entry.end > data_size)
      fail(where + ": data_offsets " + json::dump(*offsets) + " lie outside the data section of " +
           std::to_string(data_size) + " bytes (truncated or corrupted file?)");
    // shape x dtype size, without overflow: a zero dimension makes it 0 whatever the others are.
    uint64_t expected = torch::elementSize(entry.dtype->type);
    if (std::find(entry.shape.begin(), entry.shape.end(), 0) != entry.shape.end()) expected = 0;
    for (int64_t dim : entry.shape)
      if (expected != 0 && __builtin_mul_overflow(expected, static_cast<uint64_t>(dim), &expected))
        fail(where + ": shape " + json::dump(*shape) + " is too large");
    if (expected != entry.end - entry.begin)
      fail(where + ": shape " + json::dump(*shape) + " of " + entry.dtype->name + " needs " +
           std::to_string(expected) + " bytes but data_offsets " + json::dump(*offsets) + " span " +
           std::to_string(entry.end - entry.begin) + " (corrupted header?)");
    entries.push_back(std::move(entry));
  }

  // The tensors must tile the data section exactly: no gaps, no overlaps, no trailing bytes.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  uint64_t covered = 0;
  for (const Entry* e : by_offset) {
    if (e->begin != covered)
      fail("tensor '" + e->name + "' starts at data offset " + std::to_string(e->begin) + " but the tensors before it end at " +
           std::to_string(covered) + " (gaps and overlaps are not allowed)");
    covered = e->end;
  }
  if (covered != data_size)
    fail("the tensors cover " + std::to_string(covered) + " bytes but the data section holds " +
         std::to_string(data_size) + " (trailing bytes, or a corrupted header?)");

  for (const auto& e : entries) {
    torch::Tensor t;
    try {
      t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype->type));
    } catch (const std::exception& err) {
      fail("tensor '" + e.name + "': cannot allocate shape " + c10::str(c10::IntArrayRef(e.shape)) + " (" + err.what() + ")");
    }
    const char* src = bytes.data() + data_start + e.begin;
    const size_t n = e.end - e.begin;
    if (e.dtype->type == torch::kBool)
      for (size_t i = 0; i < n; ++i)
        if (static_cast<unsigned char>(src[i]) > 1)
          fail("tensor '" + e.name + "' is BOOL but holds byte " + std::to_string(static_cast<unsigned char>(src[i])) +
               " (only 0 and 1 are valid)");
    if (n > 0) std::memcpy(t.data_ptr(), src, n);
    result.tensors.emplace_back(e.name, std::move(t));
  }
  return result;
}

}  // namespace nanogpt::train
