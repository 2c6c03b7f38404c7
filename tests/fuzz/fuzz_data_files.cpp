// Fuzz target (c1): the dataset readers, read_token_file (train.bin / val.bin) and read_meta (meta.bin).
//
// Input layout: one selector byte (even: token file, odd: meta.bin), then the file's bytes.
// Properties, beyond "no crash, no UB": each reader throws a one-line "[data] ..." error or returns
// values it validated: a token file's tokens re-written with write_token_file read back identical;
// a meta file's vocabulary is non-empty and its val_fraction in (0, 1).
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "data/prepare.h"
#include "data/token_file.h"
#include "tests/fuzz/fuzz_common.h"

using namespace nanogpt;
using nanogpt::fuzz::expect_clear_error;
using nanogpt::fuzz::finding;

namespace {

constexpr int64_t kVocabSize = 70000;  // width 4 when written back: any accepted id fits

void check_token_file(std::string_view bytes) {
  const std::string path = fuzz::write_scratch("tokens.bin", bytes);
  torch::Tensor tokens;
  try {
    tokens = data::read_token_file(path, kVocabSize);
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[data] '");
    return;
  }
  if (tokens.dim() != 1 || tokens.scalar_type() != torch::kInt32) finding("read_token_file returned a bad tensor");
  const int32_t* p = tokens.data_ptr<int32_t>();
  std::vector<int64_t> ids(p, p + tokens.numel());
  int64_t max_id = 0;
  for (int64_t id : ids) {
    if (id < 0) finding("read_token_file returned a negative token");
    max_id = std::max(max_id, id);
  }
  const std::string copy = fuzz::scratch_dir() + "/tokens_copy.bin";
  if (max_id >= kVocabSize) finding("read_token_file returned a token outside the vocabulary");
  data::write_token_file(copy, ids, kVocabSize);
  if (!torch::equal(data::read_token_file(copy, kVocabSize), tokens)) finding("token file round trip changed the tokens");
}

void check_meta(std::string_view bytes) {
  fuzz::write_scratch("meta.bin", bytes);
  data::DatasetMeta meta;
  try {
    meta = data::read_meta(fuzz::scratch_dir());
  } catch (const std::runtime_error& e) {
    expect_clear_error(e, "[data] '");
    return;
  }
  if (meta.vocab.size() <= 0) finding("read_meta returned an empty vocabulary");
  if (!(meta.val_fraction > 0.0 && meta.val_fraction < 1.0)) finding("read_meta returned a bad val_fraction");
  if (meta.train_tokens < 0 || meta.val_tokens < 0) finding("read_meta returned negative token counts");
  (void)data::summary_line(meta);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::init_torch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0)
    check_token_file(file);
  else
    check_meta(file);
  return 0;
}
