// Writes the seed corpora for the fuzz targets: small valid inputs of every format, made by the
// project's own writers so they always match the current formats.
//   fuzz_seeds OUT_DIR   -> OUT_DIR/{vocab,config,data_files,safetensors,checkpoint}/seed_*
// scripts/fuzz.sh runs it before fuzzing (tests/fuzz/seeds/ adds past findings as regressions).
#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/prepare.h"
#include "data/token_file.h"
#include "data/vocab.h"
#include "model/gpt.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using namespace nanogpt;

namespace {

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

// A selector byte followed by a file's bytes (the layout of the multi-format targets).
std::string with_selector(char selector, const std::string& bytes) { return std::string(1, selector) + bytes; }

// A tiny trained-from-nothing checkpoint of `config`, as save_checkpoint writes it.
std::string tiny_checkpoint(const fs::path& dir, const model::ModelConfig& config, const data::Vocab& vocab) {
  torch::manual_seed(0);
  model::GPT gpt(config);
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (auto& item : gpt->named_parameters()) params.emplace_back(item.key(), item.value());
  train::FlatAdamW optimizer(params, {});
  train::CheckpointMeta meta;
  meta.iter = 10;
  meta.best_val_loss = 3.5;
  meta.config_yaml = train::to_yaml(train::TrainConfig{});
  meta.model_config = config;
  meta.vocab = vocab;
  std::mt19937_64 rng(1);
  std::ostringstream sampler;
  sampler << rng;
  meta.sampler_state = sampler.str();
  meta.torch_rng_state = at::detail::getDefaultCPUGenerator().get_state();
  meta.eval_done = true;
  const fs::path path = dir / "ckpt.safetensors";
  train::save_checkpoint(path.string(), gpt, optimizer, meta);
  std::string bytes = slurp(path);
  fs::remove(path);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT_DIR\n");
    return 2;
  }
  try {
    torch::set_num_threads(1);
    const fs::path out = argv[1];
    for (const char* target : {"vocab", "config", "data_files", "safetensors", "checkpoint"})
      fs::create_directories(out / target);
    const fs::path scratch = out / "scratch";
    fs::create_directories(scratch);

    // vocab: texts (ASCII, CJK, beyond the BMP) and serialized vocabularies.
    const std::vector<std::string> texts = {"hello world\n", "First Citizen:\nBefore we proceed any further, hear me speak.\n",
                                            "床前明月光，疑是地上霜。\n", "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z"};
    for (size_t i = 0; i < texts.size(); ++i) {
      spit(out / "vocab" / ("seed_text_" + std::to_string(i)), texts[i]);
      spit(out / "vocab" / ("seed_vocab_" + std::to_string(i)), data::Vocab::from_text(texts[i]).serialize());
    }

    // config: every key with its default, and a few overrides after a NUL.
    train::TrainConfig config;
    spit(out / "config" / "seed_defaults.yaml", train::to_yaml(config));
    spit(out / "config" / "seed_overrides",
         std::string("max_iters: 5\ndevice: cpu\n") + '\0' + "--max_iters=7\n--learning_rate=1e-3\n--bias=True");

    // data_files: token files of both widths (selector 0) and a meta.bin (selector 1).
    const fs::path token_path = scratch / "t.bin";
    data::write_token_file(token_path.string(), {0, 1, 2, 3, 2, 1}, 4);
    spit(out / "data_files" / "seed_tokens_u16", with_selector('\0', slurp(token_path)));
    data::write_token_file(token_path.string(), {0, 70000, 5}, 70001);
    spit(out / "data_files" / "seed_tokens_u32", with_selector('\0', slurp(token_path)));
    spit(scratch / "input.txt", texts[1] + texts[2]);
    data::PrepareOptions prep;
    prep.input = (scratch / "input.txt").string();
    prep.out_dir = (scratch / "prepared").string();
    data::prepare_dataset(prep);
    spit(out / "data_files" / "seed_meta", with_selector('\1', slurp(scratch / "prepared" / "meta.bin")));

    // safetensors: several dtypes, an empty tensor, metadata.
    const fs::path st_path = scratch / "t.safetensors";
    io::write_safetensors(st_path.string(),
                             {{"wte.weight", torch::arange(6, torch::kFloat).reshape({2, 3})},
                              {"h.0.ln_1.weight", torch::ones({3}, torch::kBFloat16)},
                              {"ids", torch::arange(3, torch::kLong)},
                              {"mask", torch::tensor({true, false})},
                              {"empty", torch::zeros({0, 4})}},
                             {{"format", "pt"}, {"vocab", "nanogpt-vocab/1 2\nab"}});
    spit(out / "safetensors" / "seed_tensors", slurp(st_path));
    io::write_safetensors(st_path.string(), {}, {});
    spit(out / "safetensors" / "seed_empty", slurp(st_path));

    // checkpoint: real checkpoints (selector 0) and recipes (selector 1, FuzzedDataProvider bytes).
    model::ModelConfig tiny;
    tiny.vocab_size = 3;
    tiny.block_size = 4;
    tiny.n_layer = 1;
    tiny.n_head = 2;
    tiny.n_embd = 4;
    const auto vocab = data::Vocab::from_text("abc");
    spit(out / "checkpoint" / "seed_ckpt_rope", with_selector('\0', tiny_checkpoint(scratch, tiny, vocab)));
    tiny.pos_encoding = "learned";
    tiny.norm = "rmsnorm";
    tiny.bias = true;
    tiny.n_kv_head = 1;
    spit(out / "checkpoint" / "seed_ckpt_learned", with_selector('\0', tiny_checkpoint(scratch, tiny, vocab)));
    spit(out / "checkpoint" / "seed_recipe_zeros", with_selector('\1', std::string(64, '\0')));
    std::string pattern;
    for (int i = 0; i < 256; ++i) pattern.push_back(static_cast<char>(i * 37 + 11));
    spit(out / "checkpoint" / "seed_recipe_pattern", with_selector('\1', pattern));

    fs::remove_all(scratch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
