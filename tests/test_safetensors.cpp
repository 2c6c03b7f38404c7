// safetensors writer/reader (its JSON header through nlohmann-json), and the model export.
// Round trips are checked bit for bit (memcmp); every corrupt file must throw "[export] ...".
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "data/vocab.h"
#include "interop/safetensors_export.h"
#include "model/gpt.h"
#include "train/checkpoint.h"
#include "io/safetensors.h"
#include "test_files.h"

namespace fs = std::filesystem;
using namespace nanogpt;
using Json = nlohmann::ordered_json;

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
  io::write_safetensors(dir / "t.safetensors", tensors, {{"k", "v"}});
  const auto back = io::read_safetensors(dir / "t.safetensors");
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

// read_into (load_model reads a fresh model's parameters straight into their memory with it): the
// same bits as read() into a contiguous tensor of the dtype, the same values converted by LibTorch's
// copy into another dtype or a strided view, and a tensor of another shape refused untouched.
TEST(SafeTensors, ReadIntoFillsAnyCpuTensorOfTheShape) {
  ScratchDir dir;
  const auto tensors = sample_tensors();
  io::write_safetensors(dir / "t.safetensors", tensors, {});
  io::SafeTensorsReader reader(dir / "t.safetensors");
  for (const auto& info : reader.tensors()) {
    const auto expected = reader.read(info);
    auto same = torch::full(info.shape, 7, torch::TensorOptions().dtype(info.dtype));
    reader.read_into(info, same);
    EXPECT_TRUE(same_bits(same, expected)) << info.name;
    if (info.dtype == torch::kBool) continue;
    auto wider = torch::zeros(info.shape, torch::kFloat64);  // a converting copy
    reader.read_into(info, wider);
    const auto as_double = expected.to(torch::kFloat64);  // NaN != NaN: the NaNs in the same places, the rest equal
    EXPECT_TRUE(wider.isnan().equal(as_double.isnan()) && wider.nan_to_num(0.0).equal(as_double.nan_to_num(0.0)))
        << info.name;
    if (info.shape.size() == 2) {  // into a transposed view: not contiguous
      auto buffer = torch::zeros({info.shape[1], info.shape[0]}, torch::TensorOptions().dtype(info.dtype));
      auto view = buffer.t();
      reader.read_into(info, view);
      EXPECT_TRUE(same_bits(view.contiguous(), expected)) << info.name;
    }
  }
  const io::TensorInfo* f32 = reader.find("f32");
  ASSERT_NE(f32, nullptr);
  auto wrong = torch::full({5, 3}, 2.0f);
  EXPECT_THROW(reader.read_into(*f32, wrong), std::invalid_argument);
  EXPECT_TRUE(wrong.eq(2.0f).all().item<bool>());
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
  io::write_safetensors(dir / "m.safetensors", {{"x", torch::ones({2})}}, metadata);
  EXPECT_EQ(io::read_safetensors(dir / "m.safetensors").metadata, metadata);
  // No tensors and no metadata is a valid (tiny) file too.
  io::write_safetensors(dir / "none.safetensors", {}, {});
  const auto none = io::read_safetensors(dir / "none.safetensors");
  EXPECT_TRUE(none.tensors.empty());
  EXPECT_TRUE(none.metadata.empty());
}

TEST(SafeTensors, HeaderIsAlignedJsonWithContiguousOffsets) {
  ScratchDir dir;
  const auto tensors = sample_tensors();
  const std::string path = dir / "h.safetensors";
  io::write_safetensors(path, tensors, {{"format", "test"}});
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ(n % 8, 0u);
  const Json header = Json::parse(bytes.substr(8, n));
  ASSERT_TRUE(header.is_object());
  ASSERT_EQ(header.size(), tensors.size() + 1);
  ASSERT_TRUE(header.contains("__metadata__"));
  EXPECT_EQ(header["__metadata__"]["format"], "test");

  int64_t expected_begin = 0;
  for (const auto& [name, tensor] : tensors) {
    ASSERT_TRUE(header.contains(name)) << name;
    const Json& entry = header[name];
    ASSERT_EQ(entry.size(), 3u);
    EXPECT_TRUE(entry.contains("dtype"));
    EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), tensor.sizes().vec()) << name;
    const auto offsets = entry["data_offsets"].get<std::vector<int64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], expected_begin) << name;
    EXPECT_EQ(offsets[1] - offsets[0], static_cast<int64_t>(tensor.nbytes())) << name;
    expected_begin = offsets[1];
  }
  EXPECT_EQ(static_cast<uint64_t>(expected_begin), bytes.size() - 8 - n);
  EXPECT_EQ(header["f32"]["dtype"], "F32");
  EXPECT_EQ(header["bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["bool"]["dtype"], "BOOL");
  EXPECT_EQ(header["i64"]["dtype"], "I64");
}

TEST(SafeTensors, CorruptFilesThrowWithTheReason) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  const std::string f32x2 = std::string(8, '\0');  // two float zeros
  auto expect_error = [&](const std::string& bytes, const std::string& needle) {
    spit(path, bytes);
    const std::string message = error_of([&] { io::read_safetensors(path); });
    EXPECT_NE(message.find("[export] '" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << message;
  };
  const std::string good = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  spit(path, craft(good, f32x2));
  ASSERT_NO_THROW(io::read_safetensors(path));

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
  EXPECT_NE(error_of([&] { io::read_safetensors(missing); }).find("[export] cannot read"), std::string::npos);
}

TEST(SafeTensors, EveryTruncationOfAValidFileThrows) {
  ScratchDir dir;
  const std::string path = dir / "full.safetensors";
  io::write_safetensors(path, {{"w", torch::randn({3, 2})}, {"b", torch::tensor({true, false})}}, {{"k", "v"}});
  const std::string bytes = slurp(path);
  for (size_t len = 0; len < bytes.size(); ++len) {
    spit(path, bytes.substr(0, len));
    EXPECT_THROW(io::read_safetensors(path), std::runtime_error) << "prefix of " << len << " bytes";
  }
}

TEST(SafeTensors, WriterRejectsBadInputAndLeavesTheTargetAlone) {
  ScratchDir dir;
  const std::string path = dir / "w.safetensors";
  auto expect_error = [&](const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                          const std::map<std::string, std::string>& metadata, const std::string& needle) {
    const std::string message = error_of([&] { io::write_safetensors(path, tensors, metadata); });
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
  EXPECT_NE(error_of([&] { io::write_safetensors(nowhere, {{"x", x}}, {}); }).find("[export] cannot write"),
            std::string::npos);
}

// The header's JSON as the reader meets it: escapes and surrogate pairs in names and metadata,
// malformed text, deep nesting; every failure is one "[export] ..." line.
TEST(SafeTensorsJson, HeaderEscapesAndSurrogatePairsAreDecoded) {
  ScratchDir dir;
  const std::string path = dir / "esc.safetensors";
  spit(path, craft(R"({"__metadata__":{"s":"a\"b\\c\/d\b\f\n\r\t\u00e9\u4e2d\ud83d\ude42"},)"
                   R"("w\u00e9":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                   std::string(4, '\0')));
  const auto st = io::read_safetensors(path);
  EXPECT_EQ(st.metadata.at("s"), "a\"b\\c/d\b\f\n\r\té中🙂");
  ASSERT_EQ(st.tensors.size(), 1u);
  EXPECT_EQ(st.tensors[0].first, "wé");
}

TEST(SafeTensorsJson, MalformedHeadersAreOneLineErrors) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  for (const std::string bad : {"", "{", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "\"unterminated", "{\"\\ud800\":1}",
                                "{\"\\udc00\":1}", "{\"\\ud800\\u0041\":1}", "{\"\\x\":1}", "{\"tab\there\":1}",
                                "01", "1.", "-", "tru", "{} {}", "[1e999]", "{\"\\u12\":1}"}) {
    SCOPED_TRACE(bad);
    spit(path, craft(bad, ""));
    const std::string message = error_of([&] { io::read_safetensors(path); });
    EXPECT_EQ(message.rfind("[export] '" + path + "': header is", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  spit(path, craft(std::string(100, '[') + std::string(100, ']'), ""));
  EXPECT_NE(error_of([&] { io::read_safetensors(path); }).find("nesting deeper than 64"), std::string::npos);
  spit(path, craft("{\"__metadata__\":{\"a\":{\"b\":{\"c\":\"d\"}}}}", ""));
  EXPECT_NE(error_of([&] { io::read_safetensors(path); }).find("must be strings"), std::string::npos);
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
  interop::export_safetensors(loaded, path);
  const auto st = io::read_safetensors(path);

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

  const Json cfg = Json::parse(st.metadata.at("config"));
  EXPECT_EQ(cfg["vocab_size"], config.vocab_size);
  EXPECT_EQ(cfg["block_size"], 16);
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["n_head"], 4);
  EXPECT_EQ(cfg["n_kv_head"], 2);
  EXPECT_EQ(cfg["n_embd"], 32);
  EXPECT_EQ(cfg["bias"], true);
  EXPECT_EQ(cfg["pos_encoding"], "rope");
  EXPECT_EQ(cfg["norm"], "layernorm");
  EXPECT_DOUBLE_EQ(cfg["rope_base"].get<double>(), 10000.0);
  EXPECT_DOUBLE_EQ(cfg["dropout"].get<double>(), 0.0);
  EXPECT_FALSE(cfg.contains("attention"));

  const Json vocab = Json::parse(st.metadata.at("vocab"));
  ASSERT_EQ(static_cast<int64_t>(vocab.size()), loaded.vocab.size());
  for (int64_t id = 0; id < loaded.vocab.size(); ++id) EXPECT_EQ(vocab[id], loaded.vocab.decode_one(id));
}

// n_kv_head 0 means "as many as n_head": the export says the number.
TEST(Export, ResolvesKvHeadsAndWritesANonFiniteLossAsNull) {
  ScratchDir dir;
  model::ModelConfig config;
  train::LoadedModel loaded;
  loaded.vocab = data::Vocab::from_text("abc");
  config.vocab_size = 3;
  config.n_layer = 1;
  config.n_head = 2;  // n_kv_head stays 0
  config.n_embd = 8;
  loaded.model = model::GPT(config);
  loaded.meta.best_val_loss = std::nan("");
  interop::export_safetensors(loaded, dir / "m.safetensors");
  const auto st = io::read_safetensors(dir / "m.safetensors");
  EXPECT_EQ(Json::parse(st.metadata.at("config"))["n_kv_head"], 2);
  EXPECT_EQ(st.metadata.at("best_val_loss"), "null");
}
