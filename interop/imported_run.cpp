// A checkpoint folder of a new run, for the importers (see imported_run.h).
#include "interop/imported_run.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "data/batch_sampler.h"
#include "io/atomic_file.h"
#include "io/text.h"

namespace nanogpt::interop {

std::runtime_error import_error(const std::string& what) { return std::runtime_error(io::printable("[import] " + what)); }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

void fresh_generators(train::CheckpointMeta& meta, uint64_t seed) {
  meta.sampler_state = data::BatchSampler(torch::zeros({2}, torch::kInt32), 1, 1, seed).state();
  meta.torch_rng_state = at::make_generator<at::CPUGeneratorImpl>(seed).get_state();
}

void write_checkpoint_folder(const io::StagedDir& staged, model::GPT& gpt, const train::FlatAdamW* optimizer,
                             const train::CheckpointMeta& meta, const char* what) {
  if (optimizer) train::save_checkpoint(staged / train::kLastCheckpoint, gpt, *optimizer, meta);
  else train::save_checkpoint(staged / train::kLastCheckpoint, gpt, meta);
  io::write_bytes_atomically(staged / "config.yaml", meta.config_yaml, what);
}

}  // namespace nanogpt::interop
