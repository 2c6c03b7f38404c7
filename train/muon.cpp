// Newton–Schulz orthogonalisation (see muon.h).
#include "train/muon.h"

namespace nanogpt::train {

torch::Tensor orthogonalize(const torch::Tensor& G, torch::ScalarType dtype, int steps) {
  TORCH_CHECK(G.dim() == 2, "orthogonalize: a matrix is needed, got ", G.dim(), " dimensions");
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  auto X = G.to(dtype);
  const bool tall = G.size(0) > G.size(1);
  if (tall) X = X.t();                               // (r, k) with r <= k: A = X Xᵀ is the small Gram matrix
  X = X / (X.norm().to(torch::kFloat) + 1e-7).to(dtype);  // every singular value <= 1
  for (int i = 0; i < steps; ++i) {
    auto A = X.mm(X.t());                            // (r, r)
    auto B = torch::addmm(A, A, A, /*beta=*/b, /*alpha=*/c);  // b A + c A²
    X = torch::addmm(X, B, X, /*beta=*/a, /*alpha=*/1.0);     // a X + B X
  }
  if (tall) X = X.t();
  return X.to(G.scalar_type());
}

}  // namespace nanogpt::train
