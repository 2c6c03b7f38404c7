// The Hugging Face export (interop/hf_export.h) against the real transformers: tiny models trained
// here on tiny data (Shakespeare, and Tang poems for Chinese) go out through `nanogpt export
// --format=hf`, and tests/hf_reference.py loads each folder offline with AutoModelForCausalLM and
// AutoTokenizer, as a user would. Their fp32 logits must be ours to 1e-4 on held-out text, their
// greedy text for 200 tokens must be `nanogpt sample --temperature=0`'s from every prompt,
// pipeline("text-generation") must produce text, and a character outside the vocabulary must be
// dropped as `nanogpt sample --skip_unknown` drops it. What no stock architecture holds is refused
// with one line and nothing written. The tests that need transformers skip, saying why, without it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/utf8.h"
#include "interop/hf_export.h"
#include "io/safetensors.h"
#include "runtime/subprocess.h"
#include "shell.h"
#include "test_files.h"
#include "train_fixture.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

using namespace nanogpt;
using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;
using nanogpt::testing::spit;
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// The Python that runs tests/hf_reference.py.
std::string python() { return nanogpt::testing::project_python(); }

// Why that Python cannot run tests/hf_reference.py, or "" when it can.
std::string transformers_missing() {
  static const std::string why = [] {
    const std::string python = ::python();
    if (python.empty()) return std::string("no Python found at configure time (set -DNANOGPT_PYTHON=/path/to/python)");
    try {
      const auto r = runtime::run_process(
          {python, "-c",
           "import importlib.util as u, sys; "
           "sys.exit(0 if u.find_spec('transformers') and u.find_spec('torch') else 1)"});
      return r.exit_code == 0 ? std::string()
                              : "'" + python + "' cannot import transformers and torch (run scripts/setup.sh --tests)";
    } catch (const std::exception& e) {
      return std::string(e.what()) + " (run scripts/setup.sh --tests)";
    }
  }();
  return why;
}

// Runs `command` through the shell, its standard output to `out_path`, its standard error to
// `err_path`; returns the exit status.
int run_shell(const std::string& command, const std::string& out_path, const std::string& err_path) {
  const int status = std::system((command + " > '" + out_path + "' 2> '" + err_path + "'").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// The first `lines` lines of a corpus from the repository's data/ folder.
std::string corpus_lines(const std::string& name, size_t lines) {
  const std::string text = slurp(std::string(NANOGPT_SOURCE_DIR) + "/data/" + name + "/input.txt");
  size_t end = 0;
  for (size_t i = 0; i < lines && end != std::string::npos; ++i) end = text.find('\n', end + 1);
  return text.substr(0, end == std::string::npos ? text.size() : end + 1);
}

// One exported model: what it is trained on and with, and the prompts it answers.
struct Case {
  std::string name, architecture;
  std::string train_text, held_out_text;
  std::vector<std::string> prompts;  // the first one also through pipeline(); some have unknown characters
  model::ModelConfig model;
};

model::ModelConfig tiny(const std::string& pos_encoding, const std::string& norm, const std::string& mlp) {
  model::ModelConfig c;
  c.block_size = 232;  // a prompt and 200 new tokens fit: GPT-2's position table ends at block_size
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.dropout = 0.0;
  c.bias = false;
  c.pos_encoding = pos_encoding;
  c.norm = norm;
  c.mlp = mlp;
  c.rope_base = 10000.0;
  return c;
}

std::vector<Case> cases() {
  const std::string shakespeare = corpus_lines("shakespeare_char", 900);
  const std::string tang = corpus_lines("tang_poems", 160);
  const std::string shakespeare_held_out = corpus_lines("shakespeare_char", 1100).substr(shakespeare.size());
  const std::string tang_held_out = corpus_lines("tang_poems", 200).substr(tang.size());
  std::vector<Case> all;
  {
    Case c{"nanoGPT (learned positions, LayerNorm, GELU, tied head)", "GPT2LMHeadModel", shakespeare,
           shakespeare_held_out, {"ROMEO:", "\n", "First Citizen:\nWe are", "Caf\xc3\xa9 \xe2\x82\xac 5: you"},
           tiny("learned", "layernorm", "gelu")};
    all.push_back(c);
  }
  {
    Case c{"Llama (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head)", "LlamaForCausalLM", tang,
           tang_held_out,
           {"\xe6\x98\xa5\xe9\xa3\x8e", "\xe6\x9c\x88", "\xe5\xb1\xb1 moon \xe6\xb0\xb4"},  // 春风, 月, 山 moon 水
           tiny("rope", "rmsnorm", "swiglu")};
    c.model.n_kv_head = 2;
    c.model.tie_embeddings = false;
    c.model.rope_base = 500.0;  // not transformers' default: a base it did not read would change the logits
    all.push_back(c);
  }
  {
    Case c{"GPT-NeoX (RoPE, LayerNorm with biases, GELU)", "GPTNeoXForCausalLM", shakespeare, shakespeare_held_out,
           {"Citizen:", "Where is \xe6\x9c\x88 he?", "KING"},  // no K in its 900 lines
           tiny("rope", "layernorm", "gelu")};
    c.model.bias = true;
    c.model.rope_base = 1000.0;
    all.push_back(c);
  }
  {
    Case c{"GPT-2 (sinusoidal positions, ReLU squared, untied head, biases)", "GPT2LMHeadModel", shakespeare,
           shakespeare_held_out, {"MENENIUS:\n"}, tiny("sinusoidal", "layernorm", "relu2")};
    c.model.bias = true;
    c.model.tie_embeddings = false;
    all.push_back(c);
  }
  return all;
}

// Trains `c` for 100 steps on its text (enough for confident, un-tied greedy choices) into dir/out.
void train_case(const Case& c, const std::string& dir) {
  auto t = nanogpt::testing::tiny_config_on(dir, c.train_text);
  t.model = c.model;
  t.batch_size = 2;
  t.max_iters = 100;
  t.eval_interval = 100;
  t.eval_iters = 1;
  t.log_interval = 100;
  t.learning_rate = 1e-2;
  t.warmup_iters = 10;
  t.lr_decay_iters = 100;
  t.min_lr = 1e-3;
  train::Trainer(t, /*quiet=*/true).run();
}

}  // namespace

TEST(ExportHf, TransformersLoadsTheModelsAndComputesWhatWeDo) {
  if (const std::string why = transformers_missing(); !why.empty()) GTEST_SKIP() << why;
  ScratchDir dir;
  const std::string nanogpt = NANOGPT_BINARY;
  const auto all = cases();
  Json request = {{"models", Json::array()}};
  std::vector<train::LoadedModel> loaded;
  std::vector<std::vector<std::vector<int64_t>>> batches;
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& c = all[i];
    const std::string case_dir = dir / ("case" + std::to_string(i));
    train_case(c, case_dir);
    const std::string hf_dir = case_dir + "/hf";
    const int rc = run_shell(quoted(nanogpt) + " export --out_dir=" + quoted(case_dir + "/out") +
                                 " --format=hf --out=" + quoted(hf_dir),
                             case_dir + "/export.txt", case_dir + "/export.err");
    ASSERT_EQ(rc, 0) << c.name << ": " << slurp(case_dir + "/export.err");
    const std::string printed = slurp(case_dir + "/export.txt");
    EXPECT_NE(printed.find(c.architecture), std::string::npos) << printed;
    loaded.push_back(train::load_model(train::resolve_checkpoint(case_dir + "/out")));

    // A held-out batch: two rows of 64 characters the model did not train on.
    const auto ids = loaded.back().vocab.encode(c.held_out_text, data::UnknownChars::Skip);
    ASSERT_GE(ids.size(), 128u) << c.name;
    batches.push_back({{ids.begin(), ids.begin() + 64}, {ids.begin() + 64, ids.begin() + 128}});
    request["models"].push_back(
        {{"dir", hf_dir}, {"batch", batches.back()}, {"prompts", c.prompts}, {"max_new_tokens", 200},
         {"pipeline_tokens", 20}});
  }

  spit(dir / "request.json", request.dump());
  const std::string script = std::string(NANOGPT_SOURCE_DIR) + "/tests/hf_reference.py";
  const int rc = run_shell(quoted(python()) + " " + quoted(script) + " " + quoted(dir / "request.json") + " " +
                               quoted(dir / "result.json"),
                           dir / "python.txt", dir / "python.err");
  ASSERT_EQ(rc, 0) << slurp(dir / "python.err");
  Json result;
  ASSERT_NO_THROW(result = Json::parse(slurp(dir / "result.json"))) << slurp(dir / "python.err");
  std::cout << "[export_hf] transformers " << result["transformers"].get<std::string>() << "\n";

  int64_t prompts_with_unknown_characters = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& c = all[i];
    SCOPED_TRACE(c.name);
    const Json& theirs = result["models"][i];
    EXPECT_EQ(theirs["class"], c.architecture);
    // Every tensor the class has came from the file, and nothing in the file went unused.
    for (const auto& [kind, keys] : theirs["loading"].items()) EXPECT_TRUE(keys.empty()) << kind << ": " << keys.dump();

    // 1. fp32 logits on the held-out batch.
    torch::Tensor ours;
    {
      torch::NoGradGuard no_grad;
      const auto batch = torch::stack({torch::tensor(batches[i][0]), torch::tensor(batches[i][1])});  // (2, 64)
      ours = loaded[i].model->logits(batch);  // (2, 64, V)
    }
    const auto logits = torch::tensor(theirs["logits"].get<std::vector<float>>())
                            .view(theirs["shape"].get<std::vector<int64_t>>());  // (2, 64, V)
    ASSERT_EQ(logits.sizes(), ours.sizes());
    const double max_diff = (ours - logits).abs().max().item<double>();
    EXPECT_LE(max_diff, 1e-4);
    EXPECT_GT(logits.abs().max().item<double>(), 1.0);  // logits large enough for the comparison to mean something
    std::cout << "[export_hf] " << c.name << ": max |logit difference| " << max_diff << "\n";

    // 2. Greedy text, 200 tokens, from every prompt; characters outside the vocabulary dropped as
    //    --skip_unknown drops them.
    for (size_t p = 0; p < c.prompts.size(); ++p) {
      const std::string& prompt = c.prompts[p];
      SCOPED_TRACE("prompt '" + prompt + "'");
      const Json& answer = theirs["prompts"][p];
      const auto ids = loaded[i].vocab.encode(prompt, data::UnknownChars::Skip);
      EXPECT_EQ(answer["ids"].get<std::vector<int64_t>>(), ids);
      prompts_with_unknown_characters += ids.size() < data::decode_utf8(prompt).size();
      const std::string case_dir = dir / ("case" + std::to_string(i));
      spit(case_dir + "/prompt.txt", prompt);
      const int sample_rc = run_shell(quoted(nanogpt) + " sample --out_dir=" + quoted(case_dir + "/out") +
                                          " --start=FILE:" + quoted(case_dir + "/prompt.txt") +
                                          " --temperature=0 --device=cpu --dtype=float32 --num_samples=1"
                                          " --max_new_tokens=200 --skip_unknown",
                                      case_dir + "/sample.txt", case_dir + "/sample.err");
      ASSERT_EQ(sample_rc, 0) << slurp(case_dir + "/sample.err");
      const std::string expected = answer["decoded_prompt"].get<std::string>() + answer["text"].get<std::string>() +
                                   "\n---------------\n";
      EXPECT_EQ(slurp(case_dir + "/sample.txt"), expected);
      EXPECT_EQ(data::decode_utf8(answer["text"].get<std::string>()).size(), 200u);
    }

    // 3. pipeline("text-generation") gives the prompt and its greedy continuation.
    EXPECT_EQ(theirs["pipeline"], theirs["pipeline_expected"]);
    EXPECT_GT(theirs["pipeline"].get<std::string>().size(), c.prompts[0].size());
  }
  EXPECT_GE(prompts_with_unknown_characters, 3);  // €, 月 and K, é, "moon": the dropping is exercised
}

TEST(ExportHf, WritesTheFilesTransformersReads) {
  ScratchDir dir;
  model::ModelConfig c = tiny("rope", "rmsnorm", "swiglu");
  c.vocab_size = 5;
  c.n_kv_head = 2;
  c.rope_base = 500.0;
  model::GPT gpt(c);
  const auto vocab = data::Vocab::from_text("ab \n\xe6\x9c\x88");  // a, b, space, newline, 月
  const auto written = interop::export_hf(gpt, vocab, 0.1, dir / "hf");
  EXPECT_EQ(written.architecture, "LlamaForCausalLM");
  for (const char* name :
       {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(dir / ("hf/" + std::string(name)))) << name;

  const Json config = Json::parse(slurp(dir / "hf/config.json"));
  EXPECT_EQ(config["rope_theta"], 500.0);  // transformers 4.x
  EXPECT_EQ(config["rope_parameters"]["rope_theta"], 500.0);  // 5.x
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["intermediate_size"], c.mlp_hidden());
  EXPECT_EQ(config["tie_word_embeddings"], true);

  const Json tokenizer = Json::parse(slurp(dir / "hf/tokenizer.json"));
  EXPECT_EQ(tokenizer["model"]["type"], "BPE");
  EXPECT_TRUE(tokenizer["model"]["merges"].empty());
  EXPECT_EQ(tokenizer["decoder"]["type"], "Fuse");
  for (int64_t id = 0; id < vocab.size(); ++id) EXPECT_EQ(tokenizer["model"]["vocab"][vocab.decode_one(id)], id);
  EXPECT_EQ(tokenizer["model"]["vocab"].size(), 5u);
  EXPECT_EQ(Json::parse(slurp(dir / "hf/tokenizer_config.json"))["clean_up_tokenization_spaces"], false);

  io::SafeTensorsReader weights(dir / "hf/model.safetensors");
  EXPECT_EQ(weights.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(static_cast<int64_t>(weights.tensors().size()), written.tensors);
  // The swiglu weights split into gate and up, rows [gate; up] of ours.
  const auto gate = weights.read(*weights.find("model.layers.1.mlp.gate_proj.weight"));
  const auto up = weights.read(*weights.find("model.layers.1.mlp.up_proj.weight"));
  const auto c_fc = gpt->named_parameters()["h.1.mlp.c_fc.weight"];
  EXPECT_TRUE(torch::equal(torch::cat({gate, up}), c_fc));
  EXPECT_EQ(weights.find("lm_head.weight"), nullptr);  // tied: transformers reuses embed_tokens
}

TEST(ExportHf, RefusesWhatNoStockArchitectureHoldsWithOneLineAndWritesNothing) {
  ScratchDir dir;
  struct Refused {
    model::ModelConfig config;
    std::string needle;
    std::vector<std::string> also = {};  // more the message names
  };
  std::vector<Refused> refused;
  auto add = [&](const std::string& pos, const std::string& norm, const std::string& mlp, const std::string& needle) {
    refused.push_back({tiny(pos, norm, mlp), needle});
    refused.back().config.vocab_size = 7;
    return &refused.back().config;
  };
  add("learned", "rmsnorm", "gelu", "norm=rmsnorm");
  add("learned", "layernorm", "swiglu", "mlp=swiglu");
  add("rope", "layernorm", "swiglu", "mlp=swiglu");
  add("rope", "rmsnorm", "gelu", "norm=rmsnorm");
  add("learned", "layernorm", "gelu", "n_kv_head=2")->n_kv_head = 2;
  add("rope", "layernorm", "gelu", "n_kv_head=1")->n_kv_head = 1;
  add("rope", "rmsnorm", "swiglu", "qk_norm")->qk_norm = true;
  add("rope", "rmsnorm", "swiglu", "logit_softcap (30)")->logit_softcap = 30.0;
  // The modern presets: every setting in the way named at once.
  auto* modern = add("rope", "rmsnorm", "relu2", "logit_softcap (15)");
  modern->logit_softcap = 15.0;
  modern->qk_norm = true;
  refused.back().also = {"qk_norm", "norm=rmsnorm, mlp=relu2"};
  const auto vocab = data::Vocab::from_text("abcdefg");
  for (const auto& r : refused) {
    SCOPED_TRACE(r.needle);
    model::GPT gpt(r.config);
    const std::string error = nanogpt::testing::error_of<std::invalid_argument>([&] { interop::export_hf(gpt, vocab, 0.0, dir / "hf"); });
    EXPECT_EQ(error.rfind("[export] --format=hf: ", 0), 0u) << error;
    EXPECT_NE(error.find(r.needle), std::string::npos) << error;
    for (const auto& needle : r.also) EXPECT_NE(error.find(needle), std::string::npos) << error;
    EXPECT_NE(error.find("--format=safetensors"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_FALSE(fs::exists(dir / "hf"));
    EXPECT_EQ(nanogpt::testing::error_of<std::invalid_argument>([&] { interop::hf_architecture(r.config); }), error);
  }
  // A folder that is there and holds something is never written into.
  fs::create_directories(dir / "full");
  spit(dir / "full/keep.txt", "mine");
  model::GPT gpt(tiny("learned", "layernorm", "gelu"));
  std::u32string chars;
  for (char32_t ch = U'A'; chars.size() < 65; ++ch) chars += ch;
  const std::string error =
      nanogpt::testing::error_of([&] { interop::export_hf(gpt, data::Vocab::from_chars(chars), 0.0, dir / "full"); });
  EXPECT_EQ(error.rfind("[export] ", 0), 0u) << error;
  EXPECT_EQ(slurp(dir / "full/keep.txt"), "mine");
}
