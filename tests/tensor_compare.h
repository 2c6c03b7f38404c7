// Shared by the model test suites: how far one tensor is from a reference.
#pragma once

#include <torch/torch.h>

namespace nanogpt::testing {

/// max |a - b| / max |b|, in fp64: one number per tensor, independent of where the large values sit.
inline double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a64 = a.to(torch::kDouble), b64 = b.to(torch::kDouble);
  return ((a64 - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace nanogpt::testing
