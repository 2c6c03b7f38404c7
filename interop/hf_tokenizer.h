// The character vocabulary as a Hugging Face tokenizer: tokenizer.json (the `tokenizers` library's
// format) and tokenizer_config.json (what transformers' AutoTokenizer reads first).
//
// tokenizer.json holds a BPE model whose vocabulary is our characters (token id = our id) and which
// has no merges, so every character is one token; no normalizer or pre-tokenizer (the text is taken
// as it is, spaces and newlines included); a Fuse decoder (tokens are joined as they are); no
// special tokens. A character outside the vocabulary is dropped when encoding, as `nanogpt sample
// --skip_unknown` drops it: the model has no row for an unknown token to map it to.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "data/hf_tokenizer.h"
#include "data/vocab.h"

namespace nanogpt::interop {

/// tokenizer.json for `vocab`.
nlohmann::ordered_json hf_tokenizer_json(const data::Vocab& vocab);

/// tokenizer_config.json: the fast tokenizer class, no special tokens, no clean-up of spaces
/// around punctuation on decoding, model_max_length = block_size.
nlohmann::ordered_json hf_tokenizer_config_json(int64_t block_size);

/// tokenizer_config.json beside an imported tokenizer.json written back as it came: the fast
/// tokenizer class (its own post-processor adds what it adds), no clean-up of spaces on decoding.
nlohmann::ordered_json hf_imported_tokenizer_config_json(const data::HfTokenizer& tokenizer, int64_t block_size);

}  // namespace nanogpt::interop
