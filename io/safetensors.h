// safetensors (https://github.com/huggingface/safetensors): the tensor file format that Python,
// Rust and JavaScript tools read without pickle; exports and training checkpoints are written in it.
// Layout:
//   8 bytes   N, little-endian uint64
//   N bytes   JSON header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"key": "string value", ...}}, padded with spaces to a multiple of 8
//   the rest  the tensors' raw little-endian bytes, back to back; offsets are relative to here
// Supported dtypes: F32 F16 BF16 F64 I64 I32 I16 I8 U8 BOOL. The JSON is nlohmann-json's.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nanogpt::io {

/// The contents of a safetensors file: tensors in file order, metadata by key.
struct SafeTensors {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

/// Writes `tensors` (any device, any strides: each is copied to contiguous CPU memory) in the
/// given order, and `metadata` (valid UTF-8), atomically: temporary file, fsync, rename.
/// `after_tensor(k)`, when given, is called after the bytes of the first k tensors are written to
/// the temporary file (tests pause a write half-way with it).
/// Throws std::runtime_error "[<tag>] cannot write '<path>': <what>" for an empty or duplicate name,
/// the reserved name "__metadata__", an unsupported dtype, invalid UTF-8 or an I/O failure
/// ('path' untouched then).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata, std::string_view tag = "export",
                       const std::function<void(size_t tensors_written)>& after_tensor = nullptr);

/// One tensor as the header describes it; the offsets are relative to the data section.
struct TensorInfo {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

/// An open safetensors file whose header has been read and checked; tensors are read one by one
/// on demand, so a caller that needs only the metadata never reads the tensor bytes.
class SafeTensorsReader {
 public:
  /// Reads and validates the header against the file size before anything else: header length
  /// within the file, UTF-8 JSON object without duplicate keys, known dtypes, non-negative shapes,
  /// shape x dtype size == bytes, offsets that tile the data section exactly, string-only metadata.
  /// Throws std::runtime_error "[<tag>] '<path>': <what> (<hint>)" on any problem; never crashes.
  explicit SafeTensorsReader(const std::string& path, std::string_view tag = "export");

  /// Every tensor, in data-section order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor named `name`, or nullptr.
  const TensorInfo* find(std::string_view name) const;
  uint64_t file_size() const { return file_size_; }

  /// Reads one tensor (an entry of tensors()) as a CPU tensor that owns its memory. Throws
  /// "[<tag>] '<path>': ..." when the file has changed under us or a BOOL byte is not 0 or 1.
  torch::Tensor read(const TensorInfo& info);
  /// Reads one tensor into `dst`, a CPU tensor of its shape: straight into dst's memory when dst is
  /// contiguous and of the entry's dtype (no second copy), else through read() and a converting
  /// copy. On a throw dst may hold part of the tensor. Throws as read().
  void read_into(const TensorInfo& info, const torch::Tensor& dst);

 private:
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_, tag_;
  std::ifstream in_;
  uint64_t file_size_ = 0, data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Reads and validates a whole file (SafeTensorsReader, then every tensor).
/// Throws std::runtime_error "[<tag>] '<path>': <what> (<hint>)" on any problem; never crashes.
SafeTensors read_safetensors(const std::string& path, std::string_view tag = "export");

}  // namespace nanogpt::io
