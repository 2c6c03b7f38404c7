// Character vocabulary -> Hugging Face tokenizer files (see hf_tokenizer.h).
#include "interop/hf_tokenizer.h"

namespace nanogpt::interop {

using Json = nlohmann::ordered_json;

Json hf_tokenizer_json(const data::Vocab& vocab) {
  Json chars = Json::object();  // "character": id, in id order
  for (int64_t id = 0; id < vocab.size(); ++id) chars[vocab.decode_one(id)] = id;
  Json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},  // none: an unknown character is dropped (see hf_tokenizer.h)
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", chars},
                {"merges", Json::array()}};
  return Json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", Json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", nullptr},
              {"post_processor", nullptr},
              {"decoder", {{"type", "Fuse"}}},
              {"model", model}};
}

Json hf_tokenizer_config_json(int64_t block_size) {
  return Json{{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"model_max_length", block_size},
              // Decoding joins the characters as they are: no " ." -> "." clean-up.
              {"clean_up_tokenization_spaces", false},
              {"add_bos_token", false},
              {"add_eos_token", false},
              {"bos_token", nullptr},
              {"eos_token", nullptr},
              {"unk_token", nullptr},
              {"pad_token", nullptr}};
}

Json hf_imported_tokenizer_config_json(const data::HfTokenizer& tokenizer, int64_t block_size) {
  Json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"model_max_length", block_size},
                 {"clean_up_tokenization_spaces", false}};
  // The usual names of the end-of-text token, when the tokenizer has one.
  for (const char* eos : {"<|endoftext|>", "</s>", "<|end_of_text|>", "<|im_end|>"})
    if (tokenizer.added_token_id(eos)) {
      config["eos_token"] = eos;
      break;
    }
  return config;
}

}  // namespace nanogpt::interop
