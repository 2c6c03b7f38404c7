// `nanogpt import --format=hf` (interop/hf_import.h) against transformers itself: tiny GPT-2 and Llama
// models with random weights and tokenizers trained on Shakespeare, all made at test time by
// tests/hf_import_reference.py (no hub). Our logits within 1e-5 of transformers' in fp32, greedy
// continuations of 100 tokens equal (a CJK prompt included), import -> export --format=hf ->
// transformers the same logits again, the other subcommands working on the folder, refusals in one
// line, and a fine-tune (prepare --tokenizer_from, train --init_from) whose val loss falls.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "data/vocab.h"
#include "interop/hf_import.h"
#include "io/safetensors.h"
#include "model/generate.h"
#include "shell.h"
#include "test_files.h"
#include "train/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using nanogpt::testing::error_of;
using nanogpt::testing::run_nanogpt;
using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;
using nanogpt::testing::spit;
using Json = nlohmann::json;

std::string python() { return nanogpt::testing::project_python(); }

std::string reference_command(const std::string& args) {
  return "'" + python() + "' '" + std::string(NANOGPT_SOURCE_DIR) + "/tests/hf_import_reference.py' " + args;
}

int run(const std::string& command) { return nanogpt::testing::shell_quiet(command); }

constexpr const char* kEnglish =
    "First Citizen:\nBefore we proceed any further, hear me speak. You are all resolved rather to die than to famish?";
constexpr const char* kChinese = "中文字符测试，你好世界。";

class HfImport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (run("'" + python() + "' -c 'import tokenizers, transformers, torch'") != 0) {
      skip_ = "'" + python() + "' cannot import tokenizers, transformers and torch (run scripts/setup.sh --tests)";
      return;
    }
    dir_ = new ScratchDir();
    const std::string corpus = std::string(NANOGPT_SOURCE_DIR) + "/data/shakespeare_char/input.txt";
    ASSERT_EQ(run(reference_command("tokenizers '" + corpus + "' '" + (*dir_ / "tok") + "'")), 0);
    ASSERT_EQ(run(reference_command("models '" + (*dir_ / "tok") + "' '" + (*dir_ / "hf") + "'")), 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  // Imports hf/<name> with the program into a new folder; returns it.
  static std::string import(const std::string& name) {
    const std::string out = *dir_ / ("ours_" + name);
    if (fs::exists(out)) return out;
    const auto r = run_nanogpt("import --format=hf '" + (*dir_ / ("hf/" + name)) + "' --out_dir='" + out + "'", dir_->path);
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("[import] wrote"), std::string::npos) << r.out;
    return out;
  }

  // transformers' logits of `ids` and greedy continuation of `prompt` for the folder `model_dir`.
  static Json reference(const std::string& model_dir, const std::vector<int64_t>& ids,
                        const std::vector<int64_t>& prompt, int64_t new_tokens) {
    static int n = 0;
    const std::string request = *dir_ / ("request" + std::to_string(n) + ".json"),
                      result = *dir_ / ("result" + std::to_string(n++) + ".json");
    spit(request, Json{{"ids", {ids}}, {"greedy", prompt}, {"max_new_tokens", new_tokens}}.dump());
    EXPECT_EQ(run(reference_command("run '" + model_dir + "' '" + request + "' '" + result + "'")), 0);
    return Json::parse(slurp(result));
  }

  // Our fp32 logits against transformers' for `name`, and the greedy continuations of an English
  // and a Chinese prompt, 100 tokens each, through the sampler's fast decoder and its general path.
  static void expect_same_as_transformers(const std::string& name) {
    auto loaded = nanogpt::train::load_model(import(name) + "/" + nanogpt::train::kLastCheckpoint);
    const auto ids = loaded.vocab.encode(kEnglish);
    ASSERT_GT(ids.size(), 20u);
    for (const char* prompt_text : {kEnglish, kChinese}) {
      SCOPED_TRACE(name + " with the prompt " + prompt_text);
      const auto prompt = loaded.vocab.encode(prompt_text);
      const Json ref = reference(*dir_ / ("hf/" + name), ids, prompt, 100);
      torch::Tensor logits;
      {
        torch::NoGradGuard no_grad;
        logits = loaded.model->logits(torch::tensor(ids).unsqueeze(0));  // (1, T, V)
      }
      const auto expected = torch::tensor(ref["logits"].get<std::vector<float>>()).view(logits.sizes());
      EXPECT_LT((logits - expected).abs().max().item<float>(), 1e-5) << "logits spread " << expected.std().item<float>();
      const auto greedy = ref["greedy"].get<std::vector<int64_t>>();
      ASSERT_EQ(greedy.size(), 100u);
      for (bool fast : {true, false}) {
        nanogpt::model::SamplingOptions options;
        options.temperature = 0.0;
        options.fast_decoder = fast;
        std::mt19937_64 rng(1);
        auto ours = nanogpt::model::generate(loaded.model, prompt, 1, 100, options, rng)[0];
        ours.erase(ours.begin(), ours.begin() + static_cast<int64_t>(prompt.size()));
        EXPECT_EQ(ours, greedy) << (fast ? "fast decoder" : "general path");
        EXPECT_EQ(loaded.vocab.decode(ours), loaded.vocab.decode(greedy));
      }
    }
  }

  static inline ScratchDir* dir_ = nullptr;
  static inline std::string skip_;
};

TEST_F(HfImport, Gpt2GivesTransformersLogitsAndGreedyText) { expect_same_as_transformers("gpt2"); }

TEST_F(HfImport, LlamaWithGroupedQueryAttentionFromShardsGivesTransformersLogitsAndGreedyText) {
  expect_same_as_transformers("llama");
}

TEST_F(HfImport, Llama3WithATiedHeadGivesTransformersLogitsAndGreedyText) { expect_same_as_transformers("llama3"); }

TEST_F(HfImport, ExportedBackToTransformersGivesTheSameLogits) {
  for (const char* name : {"gpt2", "llama"}) {
    SCOPED_TRACE(name);
    const std::string ours = import(name), exported = *dir_ / (std::string("exported_") + name);
    const auto r = run_nanogpt("export --format=hf --out_dir='" + ours + "' --out='" + exported + "'", dir_->path);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(slurp(exported + "/tokenizer.json"), slurp(*dir_ / (std::string("hf/") + name + "/tokenizer.json")));
    const auto vocab = nanogpt::train::load_model(ours + "/" + nanogpt::train::kLastCheckpoint).vocab;
    const auto ids = vocab.encode(kEnglish);
    const Json original = reference(*dir_ / (std::string("hf/") + name), ids, {ids[0]}, 1);
    const Json back = reference(exported, ids, {ids[0]}, 1);
    const auto a = torch::tensor(original["logits"].get<std::vector<float>>());
    const auto b = torch::tensor(back["logits"].get<std::vector<float>>());
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_LT((a - b).abs().max().item<float>(), 1e-5);
  }
}

// The folder holds the weights, fp32, and no optimizer state: AdamW's zero moments would be twice
// the model's size. The checkpoint is the parameters' bytes and a small rest (metadata, RNG state).
TEST_F(HfImport, TheFolderHoldsTheWeightsWithoutOptimizerState) {
  const std::string checkpoint = import("gpt2") + "/" + nanogpt::train::kLastCheckpoint;
  EXPECT_FALSE(nanogpt::train::read_checkpoint_meta(checkpoint).optimizer_state);
  nanogpt::io::SafeTensorsReader reader(checkpoint, "test");
  uint64_t weight_bytes = 0;
  for (const auto& t : reader.tensors()) {
    EXPECT_TRUE(t.name.rfind("model.", 0) == 0 || t.name.rfind("rng.", 0) == 0) << t.name;
    if (t.name.rfind("model.", 0) == 0) weight_bytes += t.end - t.begin;
  }
  const auto loaded = nanogpt::train::load_model(checkpoint);
  EXPECT_EQ(weight_bytes, static_cast<uint64_t>(loaded.model->num_params(/*non_embedding=*/false)) * 4);
  EXPECT_LT(reader.file_size(), weight_bytes + 4 * 1024 * 1024);
}

TEST_F(HfImport, SampleAndAttentionWorkOnTheImportedFolder) {
  const std::string ours = import("gpt2");
  auto r = run_nanogpt("sample --out_dir='" + ours + "' --start='To be' --max_new_tokens=20 --temperature=0", dir_->path);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("To be", 0), 0u) << r.out;
  r = run_nanogpt("attention --out_dir='" + ours + "' --start='To be or not to be' --out='" + (*dir_ / "att.png") + "'",
                  dir_->path);
  EXPECT_EQ(r.rc, 0) << r.err;
}

// The val losses of a run's [eval] lines, in order.
std::vector<double> val_losses(const std::string& log) {
  std::vector<double> losses;
  const std::regex line(R"(\[eval\] iter \d+ \| train [0-9.]+ \| val ([0-9.]+))");
  for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) losses.push_back(std::stod((*it)[1]));
  return losses;
}

TEST_F(HfImport, FineTuningFromTheImportedWeightsLowersTheValLoss) {
  for (const char* name : {"gpt2", "llama"}) {
    SCOPED_TRACE(name);
    const std::string ours = import(name), data = *dir_ / (std::string("data_") + name),
                      run_dir = *dir_ / (std::string("finetune_") + name), text = *dir_ / "shakespeare.txt";
    spit(text, slurp(std::string(NANOGPT_SOURCE_DIR) + "/data/shakespeare_char/input.txt").substr(0, 100000));
    auto r = run_nanogpt("prepare --tokenizer_from='" + ours + "' --input '" + text + "' --out_dir='" + data + "'",
                         dir_->path);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("tokenizer=hf"), std::string::npos) << r.out;
    // The prepared tokens are the imported tokenizer's own (no <s> per line).
    const auto vocab = nanogpt::train::load_model(ours + "/" + nanogpt::train::kLastCheckpoint).vocab;
    r = run_nanogpt("train '" + std::string(NANOGPT_SOURCE_DIR) + "/configs/finetune_shakespeare.yaml' --out_dir='" +
                        run_dir + "' --dataset='" + data + "' --init_from='" + ours +
                        "' --device=cpu --max_iters=15 --eval_interval=5 --eval_iters=4 --batch_size=4 "
                        "--gradient_accumulation_steps=1 --learning_rate=1e-3",
                    dir_->path);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("[ckpt] weights from"), std::string::npos) << r.out;
    const auto losses = val_losses(r.out);
    ASSERT_EQ(losses.size(), 4u) << r.out;  // iters 0, 5, 10, 15
    EXPECT_LT(losses.back(), losses.front() - 0.05) << r.out;
    // The fine-tuned model keeps the architecture and the tokenizer: it samples, and it exports.
    const auto tuned = nanogpt::train::load_model(nanogpt::train::resolve_checkpoint(run_dir));
    EXPECT_TRUE(tuned.vocab == vocab);
    EXPECT_EQ(nanogpt::model::to_json(tuned.model->config()).dump(),
              nanogpt::model::to_json(nanogpt::train::load_model(ours + "/" + nanogpt::train::kLastCheckpoint).model->config()).dump());
  }
  // The imported folder itself resumes as a run (step 0 of it) on the same tokens.
  const std::string ours = import("gpt2");
  const auto r = run_nanogpt("train '" + ours + "/config.yaml' --out_dir='" + ours + "' --init_from=resume --dataset='" + (*dir_ / "data_gpt2") +
                                 "' --device=cpu --max_iters=2 --eval_interval=2 --eval_iters=1 --batch_size=2",
                             dir_->path);
  EXPECT_EQ(r.rc, 0) << r.err;
  // It started AdamW afresh and saved it with the weights.
  const auto resumed = nanogpt::train::read_checkpoint_meta(ours + "/" + nanogpt::train::kLastCheckpoint);
  EXPECT_EQ(resumed.iter, 2);
  EXPECT_TRUE(resumed.optimizer_state);
  // A dataset of another tokenizer is refused, naming the way to make the right one.
  const auto refused = run_nanogpt("train '" + std::string(NANOGPT_SOURCE_DIR) + "/configs/finetune_shakespeare.yaml' --out_dir='" + (*dir_ / "refused_run") + "' --init_from='" + ours +
                                       "' --dataset='" + std::string(NANOGPT_SOURCE_DIR) +
                                       "/data/shakespeare_char' --device=cpu --max_iters=1",
                                   dir_->path);
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(refused.err.find("--tokenizer_from"), std::string::npos) << refused.err;
  // A folder that is not there is named with the way to make it.
  const auto missing = run_nanogpt("train '" + std::string(NANOGPT_SOURCE_DIR) + "/configs/finetune_shakespeare.yaml' --out_dir='" +
                                       (*dir_ / "refused_run2") + "' --init_from=gpt2 --device=cpu --max_iters=1",
                                   dir_->path);
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("[train] --init_from=gpt2: no such checkpoint or folder"), std::string::npos) << missing.err;
}

TEST_F(HfImport, AnythingElseIsRefusedInOneLineNamingIt) {
  const std::string src = *dir_ / "hf/gpt2";
  auto variant = [&](const std::string& name, const std::function<void(Json&)>& change) {
    const std::string dst = *dir_ / ("variant_" + name);
    fs::create_directories(dst);
    for (const auto& f : fs::directory_iterator(src)) fs::copy_file(f.path(), dst + "/" + f.path().filename().string(),
                                                                    fs::copy_options::overwrite_existing);
    Json config = Json::parse(slurp(dst + "/config.json"));
    change(config);
    spit(dst + "/config.json", config.dump());
    return dst;
  };
  const std::string other = variant("bert", [](Json& c) { c["architectures"] = {"BertForMaskedLM"}; });
  std::string e = error_of([&] { nanogpt::interop::import_hf(other, *dir_ / "refused1"); });
  EXPECT_NE(e.find("[import]"), std::string::npos);
  EXPECT_NE(e.find("'BertForMaskedLM'"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;

  const std::string scaled = variant("scaled", [](Json& c) { c["scale_attn_by_inverse_layer_idx"] = true; });
  e = error_of([&] { nanogpt::interop::import_hf(scaled, *dir_ / "refused2"); });
  EXPECT_NE(e.find("scale_attn_by_inverse_layer_idx"), std::string::npos) << e;

  // One layer more than the file holds: the tensors of layer 2 are missing.
  const std::string deeper = variant("deeper", [](Json& c) { c["n_layer"] = 3; });
  e = error_of([&] { nanogpt::interop::import_hf(deeper, *dir_ / "refused3"); });
  EXPECT_NE(e.find("lacks the tensor"), std::string::npos) << e;
  EXPECT_NE(e.find("h.2."), std::string::npos) << e;

  // A vocabulary padded past the tokenizer (nanoGPT's 50304 for GPT-2's 50257) is refused at import,
  // not by every command after it; nothing is written.
  const std::string padded = variant("padded", [](Json& c) { c["vocab_size"] = c["vocab_size"].get<int64_t>() + 64; });
  e = error_of([&] { nanogpt::interop::import_hf(padded, *dir_ / "refused_padded"); });
  EXPECT_NE(e.find("padded"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(*dir_ / "refused_padded"));

  Json llama = Json::parse(slurp(*dir_ / "hf/llama/config.json"));
  const std::string llama_dir = *dir_ / "variant_rope";
  fs::create_directories(llama_dir);
  for (const auto& f : fs::directory_iterator(*dir_ / "hf/llama"))
    fs::copy_file(f.path(), llama_dir + "/" + f.path().filename().string(), fs::copy_options::overwrite_existing);
  llama["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  spit(llama_dir + "/config.json", llama.dump());
  e = error_of([&] { nanogpt::interop::import_hf(llama_dir, *dir_ / "refused4"); });
  EXPECT_NE(e.find("rope_scaling of type 'llama3'"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(*dir_ / "refused4"));
}

}  // namespace
