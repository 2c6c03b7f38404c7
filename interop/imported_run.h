// What every import writes: a checkpoint folder that `sample`, `train --init_from=resume` and the
// rest read as if training had written it. An imported model has no generator state of ours, so
// the folder holds the generators a new run with the config's seed starts from.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "io/atomic_dir.h"
#include "model/gpt.h"
#include "train/adamw.h"
#include "train/checkpoint.h"

namespace nanogpt::interop {

/// "[import] <what>" as an error, control characters escaped.
std::runtime_error import_error(const std::string& what);

/// Whether `s` ends with `tail`.
bool ends_with(const std::string& s, const std::string& tail);

/// Sets meta's batch sampler and CPU generator states to those a new run seeded with `seed` starts from.
void fresh_generators(train::CheckpointMeta& meta, uint64_t seed);

/// Writes the checkpoint (train::kLastCheckpoint) and config.yaml (meta.config_yaml) into the staged
/// folder; its commit() then makes the folder appear whole. A null `optimizer` writes the weights
/// only (a model with no optimizer state to carry over: `train --init_from=resume` starts one
/// afresh). `what` tags errors ("import").
void write_checkpoint_folder(const io::StagedDir& staged, model::GPT& gpt, const train::FlatAdamW* optimizer,
                             const train::CheckpointMeta& meta, const char* what);

}  // namespace nanogpt::interop
