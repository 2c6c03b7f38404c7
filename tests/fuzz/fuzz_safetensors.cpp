// Fuzz target (c2): the safetensors reader (and the nlohmann-json header parsing in it).
//
// Input: the file's bytes. Properties, beyond "no crash, no UB": read_safetensors throws a one-line
// "[export] ..." error or returns tensors that write_safetensors writes back and read_safetensors
// reads again unchanged (names, order, dtypes, shapes, bytes, metadata).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_common.h"
#include "io/safetensors.h"

using namespace nanogpt;
using nanogpt::fuzz::expect_clear_error;
using nanogpt::fuzz::finding;

namespace {

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes() || a.nbytes() != b.nbytes()) return false;
  return a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::init_torch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_scratch("in.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  io::SafeTensors st;
  try {
    st = io::read_safetensors(path);
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[export] '");
    return 0;
  }
  const std::string copy = fuzz::scratch_dir() + "/copy.safetensors";
  try {
    io::write_safetensors(copy, st.tensors, st.metadata);
  } catch (const std::exception& e) {
    finding(std::string("write_safetensors rejected what read_safetensors accepted: ") + e.what());
  }
  const io::SafeTensors back = io::read_safetensors(copy);
  if (back.metadata != st.metadata) finding("metadata changed in a round trip");
  if (back.tensors.size() != st.tensors.size()) finding("tensor count changed in a round trip");
  for (size_t i = 0; i < st.tensors.size(); ++i)
    if (back.tensors[i].first != st.tensors[i].first || !same_bytes(back.tensors[i].second, st.tensors[i].second))
      finding("tensor '" + st.tensors[i].first + "' changed in a round trip");
  return 0;
}
