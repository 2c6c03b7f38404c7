// The nanoGPT bridge (interop/nanogpt_bridge.h): our checkpoint through nanoGPT's format and back is
// bit for bit the same; a checkpoint of an independent PyTorch GPT laid out like nanoGPT's
// (tests/nanogpt_reference.py) imports and gives its logits and its next AdamW step; and what
// cannot cross (a BPE vocabulary, no meta.pkl, a pickle that would run code, RoPE) is refused with
// one clear line and nothing written. The tests that need Python with torch skip, saying why,
// without it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "data/batch_sampler.h"
#include "data/utf8.h"
#include "interop/nanogpt_bridge.h"
#include "interop/nanogpt_config.h"
#include "io/safetensors.h"
#include "runtime/subprocess.h"
#include "test_files.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/config.h"

using namespace nanogpt;
using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;
using nanogpt::testing::spit;
namespace fs = std::filesystem;

namespace {

const interop::PythonBridge& bridge() {
  static const auto found = interop::PythonBridge::find(NANOGPT_PYTHON, NANOGPT_SOURCE_DIR);
  return found;
}

// Why the bridge's Python cannot run the bridge here, or "" when it can (asked without importing torch).
std::string python_missing() {
  static const std::string why = [] {
    try {
      const auto r = runtime::run_process({bridge().python, "-c",
                                           "import importlib.util as u, sys; "
                                           "sys.exit(0 if u.find_spec('torch') and u.find_spec('safetensors') else 1)"});
      return r.exit_code == 0 ? std::string()
                              : "'" + bridge().python + "' lacks torch or safetensors (run scripts/setup.sh, or set NANOGPT_PYTHON)";
    } catch (const std::exception& e) {
      return std::string(e.what()) + " (run scripts/setup.sh, or set NANOGPT_PYTHON)";
    }
  }();
  return why;
}

#define SKIP_WITHOUT_PYTHON()                                      \
  if (const std::string why = python_missing(); !why.empty()) \
  GTEST_SKIP() << why

void expect_refusal(const std::string& error, const std::string& tag, const std::string& needle) {
  EXPECT_EQ(error.rfind(tag + " ", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_NE(error.find(needle), std::string::npos) << error;
}

// Nothing named `name`, nor a staging folder of it, in `dir`.
void expect_nothing_written(const ScratchDir& dir, const std::string& name) {
  for (const auto& entry : fs::directory_iterator(dir.path))
    EXPECT_NE(entry.path().filename().string().rfind(name, 0), 0u) << entry.path();
}

model::ModelConfig tiny_model(bool bias, int64_t vocab_size) {
  model::ModelConfig m;
  m.vocab_size = vocab_size;
  m.block_size = 8;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 16;
  m.bias = bias;
  m.dropout = 0.1;
  m.pos_encoding = "learned";
  m.norm = "layernorm";
  return m;
}

// One of our training checkpoints with nothing at a default value: random weights (LayerNorm's
// too), random moments, a step count, a training config of its own.
struct OurCheckpoint {
  model::GPT gpt{nullptr};
  std::unique_ptr<train::FlatAdamW> optimizer;
  train::CheckpointMeta meta;
  train::TrainConfig config;

  explicit OurCheckpoint(model::ModelConfig m, const std::string& text = "To be, or not to be:\nthat is the question.") {
    const auto vocab = data::Vocab::from_text(text);
    m.vocab_size = vocab.size();
    torch::manual_seed(3);
    gpt = model::GPT(m);
    std::vector<std::pair<std::string, torch::Tensor>> params;
    torch::NoGradGuard no_grad;
    for (auto& item : gpt->named_parameters()) {
      item.value().normal_(0.0, 0.3);
      params.emplace_back(item.key(), item.value());
    }
    optimizer = std::make_unique<train::FlatAdamW>(params, train::FlatAdamW::Options{});
    auto state = optimizer->state();
    state[0].second = torch::tensor(int64_t{7});
    for (size_t i = 1; i < state.size(); ++i) state[i].second = torch::rand_like(state[i].second);
    optimizer->load_state(state);
    config.model = m;
    config.dataset = "data/tiny";
    config.learning_rate = 2e-3;
    config.min_lr = 2e-4;
    config.max_iters = 300;
    config.lr_decay_iters = 300;
    config.warmup_iters = 20;
    config.beta2 = 0.99;
    config.batch_size = 5;
    config.eval_interval = 50;
    config.always_save_checkpoint = false;
    meta.iter = 12;
    meta.best_val_loss = 1.75;
    meta.config_yaml = train::to_yaml(config);
    meta.model_config = m;
    meta.vocab = vocab;
    meta.sampler_state = data::BatchSampler(torch::zeros({2}, torch::kInt32), 1, 1, /*seed=*/1).state();
    meta.torch_rng_state = at::detail::getDefaultCPUGenerator().get_state();
    meta.eval_done = true;
  }
  void save(const std::string& path) { train::save_checkpoint(path, gpt, *optimizer, meta); }
};

// Runs tests/nanogpt_reference.py into `dir`; returns its expected.safetensors by name.
std::map<std::string, torch::Tensor> make_reference(const ScratchDir& dir, bool bias, std::string* itos = nullptr,
                                                    double* lr = nullptr) {
  std::vector<std::string> argv = {bridge().python, std::string(NANOGPT_SOURCE_DIR) + "/tests/nanogpt_reference.py",
                                   dir.path.string()};
  if (!bias) argv.push_back("--no-bias");
  const auto r = runtime::run_process(argv);
  if (r.exit_code != 0) throw std::runtime_error("nanogpt_reference.py failed: " + r.output);
  auto file = io::read_safetensors(dir / "expected.safetensors", "test");
  if (itos) *itos = file.metadata.at("itos");
  if (lr) *lr = std::stod(file.metadata.at("lr"));
  std::map<std::string, torch::Tensor> tensors(file.tensors.begin(), file.tensors.end());
  return tensors;
}

// Our token ids of nanoGPT's `ids`, and the nanoGPT id of each of ours.
struct IdMap {
  std::vector<int64_t> nano_of_ours;
  std::map<int64_t, int64_t> ours_of_nano;
  IdMap(const std::string& itos_utf8, const data::Vocab& vocab) {
    const std::u32string itos = data::decode_utf8(itos_utf8);
    for (int64_t nano = 0; nano < static_cast<int64_t>(itos.size()); ++nano)
      ours_of_nano[nano] = vocab.encode_chars(itos.substr(static_cast<size_t>(nano), 1))[0];
    nano_of_ours.resize(itos.size());
    for (const auto& [nano, ours] : ours_of_nano) nano_of_ours[static_cast<size_t>(ours)] = nano;
  }
  torch::Tensor ours(const torch::Tensor& nano_ids) const {
    auto out = nano_ids.clone();
    auto* p = out.data_ptr<int64_t>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = ours_of_nano.at(p[i]);
    return out;
  }
  torch::Tensor order() const { return torch::tensor(nano_of_ours, torch::kLong); }
};

void check_reference_logits(bool bias) {
  ScratchDir dir;
  std::string itos;
  const auto expected = make_reference(dir, bias, &itos);
  const auto report = interop::import_nanogpt(dir / "ckpt.pt", dir / "meta.pkl", dir / "ours", bridge());
  EXPECT_EQ(report.iter, 3);
  EXPECT_TRUE(report.optimizer);
  EXPECT_TRUE(report.notes.empty()) << report.notes.front();
  EXPECT_EQ(report.model_config.bias, bias);

  auto loaded = train::load_model(train::resolve_checkpoint(dir / "ours"));
  const IdMap ids(itos, loaded.vocab);
  torch::NoGradGuard no_grad;
  const auto logits = loaded.model->logits(ids.ours(expected.at("x")).unsqueeze(0))[0];  // (T, V), our ids
  const auto reference = expected.at("logits").index_select(1, ids.order());            // (T, V), reordered
  EXPECT_LE((logits - reference).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(loaded.meta.best_val_loss, 2.5);

  const auto config = train::load_config(dir / "ours/config.yaml");
  EXPECT_EQ(config.out_dir, dir / "ours");
  EXPECT_EQ(config.init_from, "resume");
  EXPECT_EQ(config.dataset, "data/shakespeare_char");
  EXPECT_EQ(config.learning_rate, 1e-2);
  EXPECT_EQ(config.beta2, 0.99);
  EXPECT_EQ(config.batch_size, 3);
  EXPECT_EQ(config.max_iters, 100);
  EXPECT_EQ(config.grad_clip, 0.0);
  EXPECT_FALSE(config.always_save_checkpoint);
}

}  // namespace

TEST(NanoGPTBridge, RoundTripThroughNanoGPTIsBitwise) {
  SKIP_WITHOUT_PYTHON();
  ScratchDir dir;
  OurCheckpoint ours(tiny_model(/*bias=*/true, 0));
  ours.save(dir / "ckpt.safetensors");
  EXPECT_EQ(interop::export_nanogpt(dir / "ckpt.safetensors", dir / "nano", bridge()), "tiny");
  std::vector<std::string> written;
  for (const auto& entry : fs::directory_iterator(dir / "nano")) written.push_back(entry.path().filename());
  std::sort(written.begin(), written.end());
  EXPECT_EQ(written, (std::vector<std::string>{"ckpt.pt", "meta.pkl"}));

  const auto report = interop::import_nanogpt(dir / "nano/ckpt.pt", dir / "nano/meta.pkl", dir / "back", bridge());
  EXPECT_TRUE(report.optimizer);
  EXPECT_TRUE(report.notes.empty()) << report.notes.front();
  const auto meta = train::read_checkpoint_meta(report.checkpoint);
  model::GPT back(meta.model_config);
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& item : back->named_parameters()) params.emplace_back(item.key(), item.value());
  train::FlatAdamW optimizer(params, train::FlatAdamW::Options{});
  train::load_checkpoint(report.checkpoint, &back, &optimizer);

  const auto before = ours.gpt->named_parameters(), after = back->named_parameters();
  ASSERT_EQ(before.size(), after.size());
  for (const auto& item : before) EXPECT_TRUE(torch::equal(item.value(), after[item.key()])) << item.key();
  const auto state_before = ours.optimizer->state(), state_after = optimizer.state();
  ASSERT_EQ(state_before.size(), state_after.size());
  for (size_t i = 0; i < state_before.size(); ++i)
    EXPECT_TRUE(torch::equal(state_before[i].second, state_after[i].second)) << state_before[i].first;
  EXPECT_EQ(meta.vocab, ours.meta.vocab);
  EXPECT_EQ(model::to_json(meta.model_config), model::to_json(ours.meta.model_config));
  EXPECT_EQ(meta.iter, 12);
  EXPECT_EQ(meta.best_val_loss, 1.75);
  // The training settings nanoGPT shares with us come back; the rest are this machine's choices.
  auto config = train::parse_config(meta.config_yaml);
  EXPECT_EQ(config.dataset, "data/tiny");
  EXPECT_EQ(config.out_dir, dir / "back");
  config.out_dir = ours.config.out_dir;
  config.init_from = ours.config.init_from;
  EXPECT_EQ(train::to_yaml(config), train::to_yaml(ours.config));
}

TEST(NanoGPTBridge, ReferenceModelWithBiasGivesItsLogitsHere) {
  SKIP_WITHOUT_PYTHON();
  check_reference_logits(/*bias=*/true);
}

TEST(NanoGPTBridge, ReferenceModelWithoutBiasGivesItsLogitsHere) {
  SKIP_WITHOUT_PYTHON();
  check_reference_logits(/*bias=*/false);
}

// The moments, their layout and the step count carry over: one more step here equals torch's AdamW.
TEST(NanoGPTBridge, ImportedAdamWTakesTorchsNextStep) {
  SKIP_WITHOUT_PYTHON();
  ScratchDir dir;
  std::string itos;
  double lr = 0;
  const auto expected = make_reference(dir, /*bias=*/true, &itos, &lr);
  const auto report = interop::import_nanogpt(dir / "ckpt.pt", dir / "meta.pkl", dir / "ours", bridge());
  const auto config = train::load_config(report.config);
  const auto meta = train::read_checkpoint_meta(report.checkpoint);
  model::GPT gpt(meta.model_config);
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& item : gpt->named_parameters()) params.emplace_back(item.key(), item.value());
  train::FlatAdamW optimizer(params, {config.weight_decay, config.beta1, config.beta2});
  train::load_checkpoint(report.checkpoint, &gpt, &optimizer);
  EXPECT_EQ(optimizer.steps(), 3);

  const IdMap ids(itos, meta.vocab);
  optimizer.zero_grad();
  gpt->forward(ids.ours(expected.at("bx")), ids.ours(expected.at("by"))).second.backward();
  optimizer.step(lr);
  for (auto& item : gpt->named_parameters()) {
    // The key bias adds one constant to a query's every score, which softmax removes: its gradient
    // is zero but for rounding, and Adam scales rounding noise up to a step of size lr.
    if (item.key().find("k_proj.bias") != std::string::npos) continue;
    // nanoGPT's name for ours, written out here independently of the bridge.
    std::string name = "after:transformer." + item.key();
    int part = -1;
    for (int p = 0; p < 3; ++p) {
      const std::string proj = std::string(".") + "qkv"[p] + "_proj.";
      if (const auto at = name.find(proj); at != std::string::npos) {
        name.replace(at, proj.size(), ".c_attn.");
        part = p;
      }
    }
    torch::Tensor reference = expected.at(name);
    if (part >= 0) reference = reference.chunk(3, 0)[part];
    if (item.key() == "wte.weight") reference = reference.index_select(0, ids.order());
    EXPECT_LE((item.value() - reference).abs().max().item<double>(), 1e-5) << item.key();
  }
}

TEST(NanoGPTBridge, RefusesSubwordVocabulariesAndPicklesThatWouldRunCode) {
  SKIP_WITHOUT_PYTHON();
  ScratchDir dir;
  make_reference(dir, /*bias=*/true);
  const std::pair<const char*, const char*> cases[] = {
      {"meta_bpe.pkl", "has no itos (keys: 'encoder', 'vocab_size'), so its tokens are not characters: a GPT-2 BPE model"},
      {"meta_subword.pkl", "token 0 is 'th', 2 characters: a subword (BPE) vocabulary"},
      {"meta_evil.pkl", "is not a plain-data pickle: it refers to io.open"}};
  for (const auto& [meta, needle] : cases) {
    SCOPED_TRACE(meta);
    // meta is copied in: C++17 lets a lambda capture a structured binding only this way (clang).
    const auto import = [&, meta = meta] {
      interop::import_nanogpt(dir / "ckpt.pt", dir / meta, dir / "out", bridge());
    };
    expect_refusal(nanogpt::testing::error_of(import), "[import]", needle);
    expect_nothing_written(dir, "out");
  }
  EXPECT_FALSE(fs::exists(dir / "evil_ran")) << "unpickling meta_evil.pkl ran its code";
}

TEST(NanoGPTBridge, RefusesACheckpointWithoutMetaPkl) {
  ScratchDir dir;
  spit(dir / "ckpt.pt", "not read");
  expect_refusal(nanogpt::testing::error_of([&] { interop::import_nanogpt(dir / "ckpt.pt", "", dir / "out", bridge()); }), "[import]",
                 "no meta.pkl given: without one nanoGPT uses the GPT-2 BPE tokenizer, and nanogpt-cpp is character-level");
  expect_refusal(nanogpt::testing::error_of([&] { interop::import_nanogpt(dir / "ckpt.pt", dir / "meta.pkl", dir / "out", bridge()); }),
                 "[import]", "the meta.pkl '" + dir / "meta.pkl" + "' is not a file");
  expect_nothing_written(dir, "out");
}

TEST(NanoGPTBridge, SaysWhenPythonIsMissing) {
  ScratchDir dir;
  spit(dir / "ckpt.pt", "not read");
  spit(dir / "meta.pkl", "not read");
  interop::PythonBridge missing = bridge();
  missing.python = dir / "no-python";
  expect_refusal(nanogpt::testing::error_of([&] { interop::import_nanogpt(dir / "ckpt.pt", dir / "meta.pkl", dir / "out", missing); }),
                 "[import]", "cannot run '" + dir / "no-python" + "': No such file or directory (a Python with torch");
  expect_nothing_written(dir, "out");
}

TEST(NanoGPTBridge, RefusesToExportWhatNanoGPTLacks) {
  ScratchDir dir;
  const std::pair<model::ModelConfig, std::string> cases[] = {
      {[] { auto m = tiny_model(false, 0); m.pos_encoding = "rope"; return m; }(), "has no RoPE (pos_encoding rope)"},
      {[] { auto m = tiny_model(false, 0); m.pos_encoding = "sinusoidal"; return m; }(), "has no sinusoidal positions (pos_encoding sinusoidal)"},
      {[] { auto m = tiny_model(false, 0); m.norm = "rmsnorm"; return m; }(), "has no RMSNorm (norm rmsnorm)"},
      {[] { auto m = tiny_model(false, 0); m.n_kv_head = 1; return m; }(), "has no grouped-query attention (n_kv_head 1 < n_head 2)"},
      {[] { auto m = tiny_model(false, 0); m.qk_norm = true; return m; }(), "has no QK-norm (qk_norm true)"},
      {[] { auto m = tiny_model(false, 0); m.mlp = "relu2"; return m; }(), "has no relu2 MLP (mlp relu2)"},
      {[] { auto m = tiny_model(false, 0); m.tie_embeddings = false; return m; }(), "has no untied head (tie_embeddings false)"},
      {[] { auto m = tiny_model(false, 0); m.logit_softcap = 15; return m; }(), "has no logit soft-capping (logit_softcap 15)"}};
  for (const auto& [m, needle] : cases) {
    SCOPED_TRACE(needle);
    OurCheckpoint(m).save(dir / "ckpt.safetensors");
    expect_refusal(nanogpt::testing::error_of([&] { interop::export_nanogpt(dir / "ckpt.safetensors", dir / "nano", bridge()); }), "[export]",
                   "nanoGPT's model.py " + needle + ", so it cannot load this model");
    expect_nothing_written(dir, "nano");
  }
}

TEST(NanoGPTBridge, NeverWritesIntoAFolderThatHoldsFiles) {
  ScratchDir dir;
  OurCheckpoint(tiny_model(false, 0)).save(dir / "ckpt.safetensors");
  fs::create_directories(dir / "nano");
  spit(dir / "nano/ckpt.pt", "someone's checkpoint");
  expect_refusal(nanogpt::testing::error_of([&] { interop::export_nanogpt(dir / "ckpt.safetensors", dir / "nano", bridge()); }), "[export]",
                 "'" + dir / "nano" + "' is not empty (give a new or empty folder: nothing is overwritten)");
  EXPECT_EQ(slurp(dir / "nano/ckpt.pt"), "someone's checkpoint");
}

// Through the program: one error line and a non-zero exit.
TEST(NanoGPTBridge, CommandsPrintOneErrorLine) {
  ScratchDir dir;
  auto rope = tiny_model(false, 0);
  rope.pos_encoding = "rope";
  OurCheckpoint(rope).save(dir / "rope.safetensors");
  spit(dir / "ckpt.pt", "not read");
  const std::pair<std::string, std::string> cases[] = {
      {"export --ckpt=" + dir / "rope.safetensors" + " --format=nanogpt --out=" + dir / "nano",
       "error: [export] nanoGPT's model.py has no RoPE"},
      {"export --ckpt=" + dir / "rope.safetensors" + " --format=nanogpt", "error: [export] --format=nanogpt writes a folder"},
      {"import-nanogpt --ckpt=" + dir / "ckpt.pt" + " --out_dir=" + dir / "out", "error: [import] no meta.pkl given"}};
  for (const auto& [args, line] : cases) {
    SCOPED_TRACE(args);
    const std::string command = std::string(NANOGPT_BINARY) + " " + args + " 2>" + dir / "stderr" + " >/dev/null";
    const int status = std::system(command.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    const std::string err = slurp(dir / "stderr");
    EXPECT_EQ(err.rfind(line, 0), 0u) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
  expect_nothing_written(dir, "nano");
  expect_nothing_written(dir, "out");
}

// nanoGPT's dicts: a config key of another type keeps our default (and says so); a model_args key
// nanoGPT's GPTConfig lacks means a modified model.py, which is refused.
TEST(NanoGPTBridge, ForeignConfigValuesAreNamed) {
  using Json = nlohmann::ordered_json;
  const Json nano = {{"dataset", "shakespeare_char"}, {"max_iters", 5000.0}, {"learning_rate", 1e-3},
                     {"decay_lr", "yes"}, {"wandb_log", false}, {"device", "cuda"}};
  std::vector<std::string> notes;
  const auto config = interop::train_config_from_nanogpt(nano, tiny_model(false, 65), "out-x", notes);
  EXPECT_EQ(config.dataset, "data/shakespeare_char");
  EXPECT_EQ(config.learning_rate, 1e-3);
  EXPECT_EQ(config.max_iters, train::TrainConfig{}.max_iters);
  EXPECT_EQ(config.device, train::TrainConfig{}.device);
  EXPECT_EQ(config.out_dir, "out-x");
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0], "config 'max_iters' (5000.0) is not an integer: the default 600000 is kept");
  EXPECT_EQ(notes[1], "config 'decay_lr' (\"yes\") is not true or false: the default true is kept");

  Json args = interop::model_args_of(tiny_model(false, 65));
  EXPECT_EQ(model::to_json(interop::config_from_model_args(args)), model::to_json(tiny_model(false, 65)));
  args["n_kv_head"] = 1;
  expect_refusal(nanogpt::testing::error_of([&] { interop::config_from_model_args(args); }), "[import]",
                 "model_args has 'n_kv_head', which nanoGPT's GPTConfig lacks: a modified model.py");
}
