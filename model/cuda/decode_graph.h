// The decode step as CUDA graphs (the CUDA plugin's "sampling" entry, runtime/cuda_plugin.h): one
// graph per batch-size bucket of a StaticDecoder (model/static_decoder.h), all in one memory pool,
// each recorded by the plugin's capture_graph (a side stream, after one eager run there) and
// replayed on the current stream. The draws read the default CUDA generator's graph-safe philox
// state, so every replay draws new numbers.
#pragma once

#include <memory>

#include "model/static_decoder.h"

namespace nanogpt::model::cuda {

/// An empty set of graphs; StaticDecoder::capture fills it.
std::unique_ptr<StepGraphs> decode_graphs();

}  // namespace nanogpt::model::cuda
