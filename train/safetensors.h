// safetensors (https://github.com/huggingface/safetensors): the weight format that Python, Rust and
// JavaScript tools read without pickle. Layout:
//   8 bytes   N, little-endian uint64
//   N bytes   JSON header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"key": "string value", ...}}, padded with spaces to a multiple of 8
//   the rest  the tensors' raw little-endian bytes, back to back; offsets are relative to here
// Supported dtypes: F32 F16 BF16 F64 I64 I32 I16 I8 U8 BOOL.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace nanogpt::train {

/// The contents of a safetensors file: tensors in file order, metadata by key.
struct SafeTensors {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

/// Writes `tensors` (any device, any strides: each is copied to contiguous CPU memory) in the
/// given order, and `metadata` (valid UTF-8), atomically: temporary file, fsync, rename.
/// Throws std::runtime_error "[export] ..." for an empty or duplicate name, the reserved name
/// "__metadata__", an unsupported dtype, invalid UTF-8 or an I/O failure ('path' untouched then).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata);

/// Reads and validates a whole file: header length within the file, UTF-8 JSON, known dtypes,
/// non-negative shapes, offsets that tile the data section exactly, shape x dtype size == bytes,
/// BOOL bytes 0 or 1, string-only metadata. Tensors come back as CPU tensors that own their memory.
/// Throws std::runtime_error "[export] 'path': <what> (<hint>)" on any problem; never crashes.
SafeTensors read_safetensors(const std::string& path);

}  // namespace nanogpt::train
