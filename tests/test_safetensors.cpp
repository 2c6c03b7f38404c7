// safetensors writer/reader, the JSON helpers under them, and the model export.
// Round trips are checked bit for bit (memcmp); every corrupt file must throw "[export] ...".
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include "data/vocab.h"
#include "model/gpt.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/json.h"
#include "train/safetensors.h"
#include "test_files.h"

namespace fs = std::filesystem;
using namespace nanogpt;
using train::json::Value;

namespace {

using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;
using nanogpt::testing::spit;

// A safetensors file from a hand-written header (padding added) and raw data bytes.
std::string craft(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t(header.size()) >> (8 * i));
  return out + header + data;
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  auto ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() && (ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0);
}

// Runs `fn`, which must throw std::runtime_error; returns its message.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

std::vector<std::pair<std::string, torch::Tensor>> sample_tensors() {
  torch::manual_seed(0);
  auto f32 = torch::randn({3, 5});
  f32[0][0] = std::numeric_limits<float>::quiet_NaN();
  f32[0][1] = -0.0f;
  f32[0][2] = std::numeric_limits<float>::infinity();
  auto i64 = torch::tensor({std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                            std::numeric_limits<int64_t>::max()});
  return {
      {"f32", f32},
      {"f16", torch::randn({4, 2}).to(torch::kFloat16)},
      {"bf16", torch::randn({7}).to(torch::kBFloat16)},
      {"f64", torch::randn({2, 2, 2}, torch::kFloat64)},
      {"i64", i64},
      {"i32", torch::randint(-1000, 1000, {6}, torch::kInt32)},
      {"i16", torch::randint(-1000, 1000, {3}, torch::kInt16)},
      {"i8", torch::randint(-128, 127, {5}, torch::kInt8)},
      {"u8", torch::randint(0, 255, {9}, torch::kUInt8)},
      {"bool", torch::rand({3, 3}) > 0.5},
      {"scalar", torch::tensor(3.25)},                      // 0-d
      {"empty", torch::empty({0, 4})},                      // no bytes
      {"transposed", torch::randn({4, 6}).t()},             // non-contiguous
      {"strided", torch::arange(20, torch::kInt64).slice(0, 0, 20, 3)},
      {"h.0.attn.q_proj.weight", torch::randn({2, 3}, torch::kFloat64).to(torch::kFloat32)},
  };
}

}  // namespace

TEST(SafeTensors, RoundTripIsBitExact) {
  ScratchDir dir;
  const auto tensors = sample_tensors();
  train::write_safetensors(dir / "t.safetensors", tensors, {{"k", "v"}});
  const auto back = train::read_safetensors(dir / "t.safetensors");
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].first, tensors[i].first);
    EXPECT_TRUE(same_bits(back.tensors[i].second, tensors[i].second)) << tensors[i].first;
    EXPECT_TRUE(back.tensors[i].second.is_contiguous());
  }
  EXPECT_EQ(back.tensors[10].second.dim(), 0);
  EXPECT_EQ(back.tensors[11].second.numel(), 0);
  EXPECT_EQ(back.tensors[11].second.sizes(), torch::IntArrayRef({0, 4}));
}

TEST(SafeTensors, MetadataRoundTripsAnyUtf8AndEscapes) {
  ScratchDir dir;
  const std::map<std::string, std::string> metadata = {
      {"ascii", "hello"},
      {"quotes \"and\" \\backslashes\\", "say \"hi\" \\n is not a newline"},
      {"control", std::string("tab\tnewline\nreturn\rbell\x07nul") + '\0' + "end\x1f\x7f"},
      {"unicode", "中文 é ü 🙂 𝄞 \u2028"},
      {"empty", ""},
      {"json", R"({"n_layer": 6, "list": ["a", "\u00e9"]})"},
  };
  train::write_safetensors(dir / "m.safetensors", {{"x", torch::ones({2})}}, metadata);
  EXPECT_EQ(train::read_safetensors(dir / "m.safetensors").metadata, metadata);
  // No tensors and no metadata is a valid (tiny) file too.
  train::write_safetensors(dir / "none.safetensors", {}, {});
  const auto none = train::read_safetensors(dir / "none.safetensors");
  EXPECT_TRUE(none.tensors.empty());
  EXPECT_TRUE(none.metadata.empty());
}

TEST(SafeTensors, HeaderIsAlignedJsonWithContiguousOffsets) {
  ScratchDir dir;
  const auto tensors = sample_tensors();
  const std::string path = dir / "h.safetensors";
  train::write_safetensors(path, tensors, {{"format", "test"}});
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ(n % 8, 0u);
  const Value header = train::json::parse(std::string_view(bytes).substr(8, n));
  ASSERT_EQ(header.kind, Value::Kind::Object);
  ASSERT_EQ(header.object.size(), tensors.size() + 1);
  const Value* meta = header.find("__metadata__");
  ASSERT_NE(meta, nullptr);
  ASSERT_NE(meta->find("format"), nullptr);
  EXPECT_EQ(meta->find("format")->string, "test");

  int64_t expected_begin = 0;
  for (const auto& [name, tensor] : tensors) {
    const Value* entry = header.find(name);
    ASSERT_NE(entry, nullptr) << name;
    ASSERT_EQ(entry->object.size(), 3u);
    EXPECT_NE(entry->find("dtype"), nullptr);
    const Value& shape = *entry->find("shape");
    ASSERT_EQ(shape.array.size(), static_cast<size_t>(tensor.dim()));
    for (int64_t d = 0; d < tensor.dim(); ++d) EXPECT_EQ(shape.array[d].integer, tensor.size(d));
    const Value& offsets = *entry->find("data_offsets");
    ASSERT_EQ(offsets.array.size(), 2u);
    EXPECT_EQ(offsets.array[0].integer, expected_begin) << name;
    EXPECT_EQ(offsets.array[1].integer - offsets.array[0].integer, static_cast<int64_t>(tensor.nbytes())) << name;
    expected_begin = offsets.array[1].integer;
  }
  EXPECT_EQ(static_cast<uint64_t>(expected_begin), bytes.size() - 8 - n);
  EXPECT_EQ(header.find("f32")->find("dtype")->string, "F32");
  EXPECT_EQ(header.find("bf16")->find("dtype")->string, "BF16");
  EXPECT_EQ(header.find("bool")->find("dtype")->string, "BOOL");
  EXPECT_EQ(header.find("i64")->find("dtype")->string, "I64");
}

TEST(SafeTensors, CorruptFilesThrowWithTheReason) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  const std::string f32x2 = std::string(8, '\0');  // two float zeros
  auto expect_error = [&](const std::string& bytes, const std::string& needle) {
    spit(path, bytes);
    const std::string message = error_of([&] { train::read_safetensors(path); });
    EXPECT_NE(message.find("[export] '" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << message;
  };
  const std::string good = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  spit(path, craft(good, f32x2));
  ASSERT_NO_THROW(train::read_safetensors(path));

  expect_error("", "too short");
  expect_error("\x10\0\0", "too short");
  expect_error(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds");
  expect_error(craft(good, f32x2).substr(0, 20), "exceeds");                         // header cut short
  expect_error(craft(good, f32x2.substr(0, 7)), "outside the data section");        // data cut short
  expect_error(craft(good, f32x2 + "!!!!"), "trailing");                            // extra bytes
  expect_error(craft("{\"x\": nonsense}", ""), "not valid JSON");
  expect_error(craft("not json at all", ""), "not valid JSON");
  expect_error(craft("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", f32x2), "not valid JSON");
  expect_error(craft("{\"a\":1,\"a\":1}", ""), "duplicate key");
  expect_error(craft("{\"x\":\"\xff\"}", ""), "UTF-8");
  expect_error(craft("[1,2]", ""), "expected an object");
  expect_error(craft(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}})", f32x2), "outside the data section");
  expect_error(craft(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32x2), "outside the data section");
  expect_error(craft(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2), "needs 12 bytes");
  expect_error(craft(R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", f32x2), "needs 16 bytes");
  expect_error(craft(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2), "non-negative");
  expect_error(craft(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", f32x2),
               "too large");
  expect_error(craft(R"({"x":{"dtype":"C64","shape":[2],"data_offsets":[0,8]}})", f32x2), "dtype");
  expect_error(craft(R"({"x":{"dtype":"F32","shape":[2]}})", f32x2), "lacks");
  expect_error(craft(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", f32x2), "unknown field");
  expect_error(craft(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2), "gaps and overlaps");
  expect_error(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2),
               "gaps and overlaps");
  expect_error(craft(R"({"__metadata__":{"n":1}})", ""), "must be strings");
  expect_error(craft(R"({"__metadata__":[]})", ""), "not an object");
  expect_error(craft(R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"), "BOOL");
  const std::string missing = dir / "missing.safetensors";
  EXPECT_NE(error_of([&] { train::read_safetensors(missing); }).find("[export] cannot read"), std::string::npos);
}

TEST(SafeTensors, EveryTruncationOfAValidFileThrows) {
  ScratchDir dir;
  const std::string path = dir / "full.safetensors";
  train::write_safetensors(path, {{"w", torch::randn({3, 2})}, {"b", torch::tensor({true, false})}}, {{"k", "v"}});
  const std::string bytes = slurp(path);
  for (size_t len = 0; len < bytes.size(); ++len) {
    spit(path, bytes.substr(0, len));
    EXPECT_THROW(train::read_safetensors(path), std::runtime_error) << "prefix of " << len << " bytes";
  }
}

TEST(SafeTensors, WriterRejectsBadInputAndLeavesTheTargetAlone) {
  ScratchDir dir;
  const std::string path = dir / "w.safetensors";
  auto expect_error = [&](const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                          const std::map<std::string, std::string>& metadata, const std::string& needle) {
    const std::string message = error_of([&] { train::write_safetensors(path, tensors, metadata); });
    EXPECT_NE(message.find("[export] cannot write '" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << message;
    EXPECT_FALSE(fs::exists(path));
  };
  const auto x = torch::ones({2});
  expect_error({{"a", x}, {"a", x}}, {}, "duplicate");
  expect_error({{"", x}}, {}, "empty name");
  expect_error({{"__metadata__", x}}, {}, "reserved");
  expect_error({{"c", torch::ones({2}, torch::kComplexFloat)}}, {}, "does not support");
  expect_error({{"u", torch::Tensor()}}, {}, "undefined");
  expect_error({{"x", x}}, {{"bad", "\xc3"}}, "UTF-8");
  const std::string nowhere = dir / "no/such/dir/w.safetensors";
  EXPECT_NE(error_of([&] { train::write_safetensors(nowhere, {{"x", x}}, {}); }).find("[export] cannot write"),
            std::string::npos);
}

TEST(Json, ParsesEscapesSurrogatePairsAndNumbers) {
  const Value v = train::json::parse(
      R"( {"s": "a\"b\\c\/d\b\f\n\r\t\u00e9\u4e2d\ud83d\ude42", "n": [0, -7, 9223372036854775807, 1.5e3, -0.25],)"
      R"( "t": true, "f": false, "z": null, "o": {}, "a": []} )");
  EXPECT_EQ(v.find("s")->string, "a\"b\\c/d\b\f\n\r\té中🙂");
  const auto& n = v.find("n")->array;
  EXPECT_TRUE(n[0].is_integer);
  EXPECT_EQ(n[1].integer, -7);
  EXPECT_EQ(n[2].integer, std::numeric_limits<int64_t>::max());
  EXPECT_FALSE(n[3].is_integer);
  EXPECT_DOUBLE_EQ(n[3].number, 1500.0);
  EXPECT_DOUBLE_EQ(n[4].number, -0.25);
  EXPECT_TRUE(v.find("t")->boolean);
  EXPECT_EQ(v.find("z")->kind, Value::Kind::Null);
  EXPECT_EQ(v.find("o")->kind, Value::Kind::Object);
  EXPECT_EQ(train::json::dump(v.find("n")[0]), "[0,-7,9223372036854775807,1500,-0.25]");
}

TEST(Json, RejectsMalformedText) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "\"unterminated", "\"\\ud800\"",
                          "\"\\udc00\"", "\"\\ud800\\u0041\"", "\"\\x\"", "\"tab\there\"", "01", "1.", "-", "tru",
                          "{} {}", "[1e999]", "\"\\u12\""}) {
    EXPECT_THROW(train::json::parse(bad), std::runtime_error) << bad;
  }
  EXPECT_THROW(train::json::parse(std::string(100, '[') + std::string(100, ']')), std::runtime_error);
  EXPECT_NO_THROW(train::json::parse(std::string(60, '[') + std::string(60, ']')));
}

TEST(Json, QuoteAndNumberRoundTrip) {
  const std::string text = std::string("\"\\/\b\f\n\r\t\x01\x1f\x7f") + '\0' + "中🙂 end";
  const std::string quoted = train::json::quote(text);
  EXPECT_EQ(train::json::parse(quoted).string, text);
  EXPECT_EQ(quoted.find('\n'), std::string::npos);
  EXPECT_NE(quoted.find("中🙂"), std::string::npos);  // UTF-8 passes through unescaped
  for (double x : {0.1, 10000.0, 1e-7, 6e-4, -3.0, 1e300, 0.0}) {
    EXPECT_EQ(train::json::parse(train::json::number(x)).number, x) << train::json::number(x);
  }
  EXPECT_EQ(train::json::number(0.1), "0.1");
  EXPECT_EQ(train::json::number(10000.0), "10000");
  EXPECT_THROW(train::json::number(std::nan("")), std::runtime_error);
}

TEST(Export, WritesEveryParameterWithConfigAndVocab) {
  ScratchDir dir;
  model::ModelConfig config;
  const std::string text = "hello, wörld! 中文\n\"quoted\" \\";
  train::LoadedModel loaded;
  loaded.vocab = data::Vocab::from_text(text);
  config.vocab_size = loaded.vocab.size();
  config.block_size = 16;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_kv_head = 2;
  config.n_embd = 32;
  config.bias = true;
  config.pos_encoding = "rope";
  torch::manual_seed(0);
  loaded.model = model::GPT(config);
  loaded.meta.iter = 250;
  loaded.meta.best_val_loss = 1.875;

  const std::string path = dir / "model.safetensors";
  train::export_safetensors(loaded, path);
  const auto st = train::read_safetensors(path);

  const auto params = loaded.model->named_parameters(true);
  ASSERT_EQ(st.tensors.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(st.tensors[i].first, params[i].key());
    EXPECT_EQ(st.tensors[i].second.scalar_type(), torch::kFloat32);
    EXPECT_TRUE(same_bits(st.tensors[i].second, params[i].value().detach())) << params[i].key();
  }
  EXPECT_EQ(st.tensors[0].first, "wte.weight");
  for (const auto& [name, tensor] : st.tensors) EXPECT_EQ(name.find("lm_head"), std::string::npos);

  EXPECT_EQ(st.metadata.at("format"), "nanogpt-cpp");
  EXPECT_EQ(st.metadata.at("format_version"), "1");
  EXPECT_EQ(st.metadata.at("rope_convention"), "split_halves");
  EXPECT_EQ(st.metadata.at("tied_lm_head"), "wte.weight");
  EXPECT_EQ(st.metadata.at("iter"), "250");
  EXPECT_EQ(st.metadata.at("best_val_loss"), "1.875");

  const Value cfg = train::json::parse(st.metadata.at("config"));
  EXPECT_EQ(cfg.find("vocab_size")->integer, config.vocab_size);
  EXPECT_EQ(cfg.find("block_size")->integer, 16);
  EXPECT_EQ(cfg.find("n_layer")->integer, 2);
  EXPECT_EQ(cfg.find("n_head")->integer, 4);
  EXPECT_EQ(cfg.find("n_kv_head")->integer, 2);
  EXPECT_EQ(cfg.find("n_embd")->integer, 32);
  EXPECT_TRUE(cfg.find("bias")->boolean);
  EXPECT_EQ(cfg.find("pos_encoding")->string, "rope");
  EXPECT_EQ(cfg.find("norm")->string, "layernorm");
  EXPECT_DOUBLE_EQ(cfg.find("rope_base")->number, 10000.0);
  EXPECT_DOUBLE_EQ(cfg.find("dropout")->number, 0.0);

  const Value vocab = train::json::parse(st.metadata.at("vocab"));
  ASSERT_EQ(static_cast<int64_t>(vocab.array.size()), loaded.vocab.size());
  for (int64_t id = 0; id < loaded.vocab.size(); ++id) EXPECT_EQ(vocab.array[id].string, loaded.vocab.decode_one(id));
}
