// An export read by someone else's code: tests/reference_export.py, a PyTorch forward pass written
// from the math (float64) under the venv's Python, loads what `nanogpt export` writes and must give
// our logits to 1e-5, for learned, sinusoidal and rotary positions.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "interop/safetensors_export.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "test_files.h"

using namespace nanogpt;
using nanogpt::testing::ScratchDir;
using nanogpt::testing::slurp;

namespace {

// Runs `command` through the shell with its output in `out_path`; returns the exit status.
int run_to_file(const std::string& command, const std::string& out_path) {
  const int status = std::system((command + " > '" + out_path + "' 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A checkpoint of `config` with weights far from their initialisation (every value O(0.3), norms
// around 1), so a mistake in any part of the forward pass moves the logits well past 1e-5.
std::string write_checkpoint(const model::ModelConfig& config, const std::string& path) {
  torch::manual_seed(21);
  model::GPT gpt(config);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : gpt->named_parameters()) {
      auto& p = item.value();
      const bool is_norm_weight = item.key().find("ln_") != std::string::npos && p.dim() == 1 &&
                                  item.key().rfind(".weight") == item.key().size() - 7;
      p.copy_(is_norm_weight ? 1.0 + 0.2 * torch::randn_like(p) : 0.3 * torch::randn_like(p));
    }
  }
  train::FlatAdamW optimizer(*gpt, {});
  train::CheckpointMeta meta;
  meta.iter = 100;
  meta.model_config = config;
  meta.vocab = data::Vocab::from_text(std::string("abcdefghijklmnopqrstuvwxyz").substr(0, config.vocab_size));
  meta.torch_rng_state = at::detail::getDefaultCPUGenerator().get_state();
  train::save_checkpoint(path, gpt, optimizer, meta);
  return path;
}

struct Case {
  const char* name;
  std::string pos_encoding, norm;
  bool bias;
  int64_t n_head, n_kv_head;
};

}  // namespace

TEST(ExportPytorch, IndependentForwardPassGivesTheSameLogits) {
  const std::string python = NANOGPT_PYTHON;
  if (python.empty()) GTEST_SKIP() << "no Python found at configure time (set -DNANOGPT_PYTHON=/path/to/python)";
  ScratchDir dir;
  if (run_to_file("'" + python + "' -c 'import torch'", dir / "probe.txt") != 0)
    GTEST_SKIP() << "'" << python << "' cannot import torch (configure with -DNANOGPT_PYTHON=<the venv's python>)";
  const std::string script = std::string(NANOGPT_SOURCE_DIR) + "/tests/reference_export.py";

  const std::vector<Case> cases = {
      {"learned positions, LayerNorm with bias", "learned", "layernorm", true, 2, 2},
      {"rope, RMSNorm, grouped-query attention", "rope", "rmsnorm", false, 4, 2},
      {"rope, LayerNorm without bias", "rope", "layernorm", false, 2, 2},
      {"sinusoidal positions", "sinusoidal", "layernorm", true, 2, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    model::ModelConfig config;
    config.vocab_size = 13;
    config.block_size = 12;
    config.n_layer = 2;
    config.n_head = c.n_head;
    config.n_kv_head = c.n_kv_head;
    config.n_embd = 32;
    config.bias = c.bias;
    config.pos_encoding = c.pos_encoding;
    config.norm = c.norm;
    config.rope_base = 100.0;  // every pair turns visibly over 12 positions
    train::LoadedModel loaded = train::load_model(write_checkpoint(config, dir / "ckpt.safetensors"));
    interop::export_safetensors(loaded, dir / "model.safetensors");

    const std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};  // a full block
    std::string ids_arg;
    for (int64_t id : ids) ids_arg += (ids_arg.empty() ? "" : ",") + std::to_string(id);
    const int rc = run_to_file("'" + python + "' '" + script + "' '" + (dir / "model.safetensors") + "' " + ids_arg,
                               dir / "reference.json");
    const std::string out = slurp(dir / "reference.json");
    ASSERT_EQ(rc, 0) << out;
    nlohmann::json reference;
    ASSERT_NO_THROW(reference = nlohmann::json::parse(out)) << out;

    torch::Tensor ours;
    {
      torch::NoGradGuard no_grad;
      ours = loaded.model->logits(torch::tensor(ids).unsqueeze(0))[0].to(torch::kDouble);  // (T, V)
    }
    const auto theirs = torch::tensor(reference["logits"].get<std::vector<double>>(), torch::kDouble)
                            .view(reference["shape"].get<std::vector<int64_t>>());
    ASSERT_EQ(theirs.sizes(), ours.sizes());
    const double max_diff = (ours - theirs).abs().max().item<double>();
    const double scale = theirs.abs().max().item<double>();
    EXPECT_LE(max_diff, 1e-5) << "largest logit " << scale;
    EXPECT_GT(scale, 1.0);  // logits large enough for the comparison to mean something
    std::cout << "[export] " << c.name << ": max |logit difference| " << max_diff << " (largest logit " << scale
              << ")\n";
  }
}
