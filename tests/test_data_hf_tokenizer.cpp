// Hugging Face tokenizers read from tokenizer.json (data/hf_tokenizer.h) against the `tokenizers`
// library itself: byte-level BPE with GPT-2's and Llama 3's split patterns, and SentencePiece-style
// BPE with byte fallback (Llama 2's Prepend/Replace normalizer, and a Metaspace pre-tokenizer), all
// trained on Shakespeare by tests/hf_import_reference.py at test time. Ids must equal the library's
// on English, Chinese, emoji, runs of spaces and newlines, numbers, invalid UTF-8 and special tokens,
// and decoding its ids must give its text.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "data/vocab.h"
#include "shell.h"
#include "test_files.h"

namespace {

using nanogpt::data::HfTokenizer;
using nanogpt::data::Vocab;
using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;
using nanogpt::testing::spit;
using Json = nlohmann::json;

std::string python() { return nanogpt::testing::project_python(); }

std::string script() { return std::string(NANOGPT_SOURCE_DIR) + "/tests/hf_import_reference.py"; }

int run(const std::string& command) { return nanogpt::testing::shell_quiet(command); }

// The texts each tokenizer must encode as the library does (file name -> bytes).
const std::vector<std::pair<std::string, std::string>>& texts() {
  static const std::vector<std::pair<std::string, std::string>> all = {
      {"english", "Hello world! It's a test. They'll say: we've done it, I'm sure. DON'T SHOUT.\n"},
      {"chinese", "中文字符测试，你好世界。我们今天学习分词。龘"},
      {"emoji", "😀🎉👍🏽 emoji 🚀 and a flag 🇫🇷!"},
      {"spaces", "a  b   c    d\n\n\n  e\t\tf \n \r\n  end   "},
      {"numbers", "12345 67890 3.14159 2024-12-05 1,000,000 007x"},
      {"invalid", "ok \xff\xfe bad \xe4\xb8 cut \xc0\xaf over \xed\xa0\x80 surrogate \xf0\x9f\x98"},
      {"special", "Hello<|endoftext|>world </s> <s>x<|begin_of_text|> <unk>"},
      {"leading", " leading space and trailing "},
      {"empty", ""},
      {"shakespeare", "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"},
  };
  return all;
}

class HfTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (run("'" + python() + "' -c 'import tokenizers'") != 0) {
      skip_ = "'" + python() + "' cannot import tokenizers (run scripts/setup.sh --tests)";
      return;
    }
    dir_ = new ScratchDir();
    const std::string corpus = std::string(NANOGPT_SOURCE_DIR) + "/data/shakespeare_char/input.txt";
    ASSERT_EQ(run("'" + python() + "' '" + script() + "' tokenizers '" + corpus + "' '" + (*dir_ / "tok") + "'"), 0);
    std::filesystem::create_directories(*dir_ / "texts");
    for (const auto& [name, bytes] : texts()) spit(*dir_ / ("texts/" + name), bytes);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  // The library's ids and decoded text for every text, with `tokenizer`.
  static Json reference(const std::string& tokenizer) {
    const std::string out = *dir_ / (tokenizer + ".ref.json");
    EXPECT_EQ(run("'" + python() + "' '" + script() + "' encode '" + (*dir_ / ("tok/" + tokenizer)) + "' '" +
                  (*dir_ / "texts") + "' '" + out + "'"),
              0);
    return Json::parse(slurp(out));
  }

  static void expect_same_as_library(const std::string& tokenizer) {
    const Json ref = reference(tokenizer);
    const auto ours = HfTokenizer::load(slurp(*dir_ / ("tok/" + tokenizer)));
    for (const auto& [name, bytes] : texts()) {
      SCOPED_TRACE(tokenizer + " on " + name);
      const auto expected = ref.at(name).at("ids").get<std::vector<int64_t>>();
      EXPECT_EQ(ours->encode(bytes), expected);
      EXPECT_EQ(ours->decode(expected), ref.at(name).at("decoded").get<std::string>());
    }
  }

  static inline ScratchDir* dir_ = nullptr;
  static inline std::string skip_;
};

TEST_F(HfTokenizerTest, ByteLevelWithGpt2sSplitEncodesAndDecodesAsTheLibrary) { expect_same_as_library("gpt2.json"); }

TEST_F(HfTokenizerTest, ByteLevelWithLlama3sSplitEncodesAndDecodesAsTheLibrary) { expect_same_as_library("llama3.json"); }

TEST_F(HfTokenizerTest, SentencePieceStyleWithByteFallbackEncodesAndDecodesAsTheLibrary) {
  expect_same_as_library("sp.json");
}

TEST_F(HfTokenizerTest, MetaspacePreTokenizerEncodesAndDecodesAsTheLibrary) { expect_same_as_library("sp_metaspace.json"); }

TEST_F(HfTokenizerTest, TokensStreamedOneByOneGiveTheDecodedBytes) {
  // What the sampler prints token by token: the tokens' bytes, concatenated, are the text (for a
  // SentencePiece-style tokenizer, the text with the space its normalizer put in front).
  for (const char* name : {"gpt2.json", "llama3.json", "sp.json"}) {
    const auto tok = HfTokenizer::load(slurp(*dir_ / (std::string("tok/") + name)));
    const std::string text = texts()[1].second + texts()[3].second + texts()[4].second;
    const auto ids = tok->encode(text, /*add_special_tokens=*/false);
    std::string streamed;
    for (int64_t id : ids) streamed += tok->bytes_of(id);
    EXPECT_EQ(streamed, std::string(name) == std::string("sp.json") ? " " + text : text) << name;
  }
}

TEST_F(HfTokenizerTest, TravelsInAVocabularyAndComesBackTheSame) {
  const Vocab vocab = Vocab::from_hf_tokenizer(slurp(*dir_ / "tok/llama3.json"));
  const Vocab back = Vocab::deserialize(vocab.serialize());
  EXPECT_EQ(back.kind_name(), std::string("hf"));
  EXPECT_TRUE(back == vocab);
  EXPECT_EQ(back.encode(texts()[0].second), vocab.encode(texts()[0].second));
  EXPECT_EQ(back.size(), vocab.size());
}

TEST_F(HfTokenizerTest, StepsItDoesNotRunAreRefusedByName) {
  Json j = Json::parse(slurp(*dir_ / "tok/gpt2.json"));
  j["normalizer"] = {{"type", "NFC"}};
  const std::string nfc = nanogpt::testing::error_of([&] { HfTokenizer::load(j.dump()); });
  EXPECT_NE(nfc.find("[data] tokenizer.json: the normalizer 'NFC'"), std::string::npos) << nfc;
  j = Json::parse(slurp(*dir_ / "tok/gpt2.json"));
  j["model"]["type"] = "WordPiece";
  const std::string wordpiece = nanogpt::testing::error_of([&] { HfTokenizer::load(j.dump()); });
  EXPECT_NE(wordpiece.find("WordPiece"), std::string::npos) << wordpiece;
}

}  // namespace
