// Newton–Schulz orthogonalisation (see muon.h).
#include "train/muon.h"

#include <map>
#include <utility>

namespace nanogpt::train {

torch::Tensor orthogonalize(const torch::Tensor& G, torch::ScalarType dtype, int steps) {
  TORCH_CHECK(G.dim() == 2 || G.dim() == 3, "orthogonalize: a matrix or a batch of them is needed, got ", G.dim(),
              " dimensions");
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  auto X = G.dim() == 2 ? G.unsqueeze(0).to(dtype) : G.to(dtype);  // (k, rows, cols)
  const bool tall = G.size(-2) > G.size(-1);
  if (tall) X = X.transpose(1, 2);  // (k, r, c) with r <= c: A = X Xᵀ is the small Gram matrix
  const auto norms = X.to(torch::kFloat).flatten(1).norm(2, {1}).view({-1, 1, 1});  // (k, 1, 1)
  X = X / (norms + 1e-7).to(dtype);  // every singular value <= 1
  for (int i = 0; i < steps; ++i) {
    auto A = torch::bmm(X, X.transpose(1, 2));                  // (k, r, r)
    auto B = torch::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c);  // b A + c A²
    X = torch::baddbmm(X, B, X, /*beta=*/a, /*alpha=*/1.0);     // a X + B X
  }
  if (tall) X = X.transpose(1, 2);
  X = X.to(G.scalar_type());
  return G.dim() == 2 ? X.squeeze(0) : X.contiguous();
}

std::vector<torch::Tensor> orthogonalize_all(const std::vector<torch::Tensor>& matrices, torch::ScalarType dtype,
                                             int steps) {
  // Same-shaped matrices (a tall one counted as its transpose) go through one batched iteration.
  std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> by_shape;
  for (size_t i = 0; i < matrices.size(); ++i) {
    TORCH_CHECK(matrices[i].dim() == 2, "orthogonalize_all: matrix ", i, " has ", matrices[i].dim(), " dimensions");
    const int64_t r = matrices[i].size(0), c = matrices[i].size(1);
    by_shape[{std::min(r, c), std::max(r, c)}].push_back(i);
  }
  std::vector<torch::Tensor> out(matrices.size());
  for (const auto& [shape, indices] : by_shape) {
    std::vector<torch::Tensor> wide;  // each (r, c), r <= c
    for (const size_t i : indices) wide.push_back(matrices[i].size(0) > matrices[i].size(1) ? matrices[i].t() : matrices[i]);
    const auto O = orthogonalize(torch::stack(wide), dtype, steps);  // (k, r, c)
    for (size_t j = 0; j < indices.size(); ++j) {
      const auto& m = matrices[indices[j]];
      out[indices[j]] = m.size(0) > m.size(1) ? O[static_cast<int64_t>(j)].t() : O[static_cast<int64_t>(j)];
    }
  }
  return out;
}

}  // namespace nanogpt::train
