// The kernels' instruction sets (see kernel_choice.h).
#include "model/fast/kernel_choice.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

namespace nanogpt::model {
namespace {

struct KernelChoice {
  bool clones = true;        // each loop's widest clone (or AVX2 build), not its baseline build
  bool clones_avx2 = false;  // each loop's AVX2 + FMA build in place of a clone
  bool avx2 = false;         // AVX2 + FMA intrinsics
  bool avx512 = false;       // AVX-512F intrinsics
  bool bf16 = false;         // AVX512-BF16
  bool vnni = false;         // AVX512-VNNI (with AVX512-BW) for the int8 products
};

const KernelChoice& kernel_choice() {
  static const KernelChoice chosen = [] {
    KernelChoice c;
    const char* env = std::getenv("NANOGPT_KERNELS");
    const std::string cap = env ? env : "";
    if (!cap.empty() && cap != "avx512f" && cap != "avx2" && cap != "portable")
      fmt::print(stderr,
                 "[model] warning: NANOGPT_KERNELS={} is not a kernel set (avx512f, avx2 or portable): ignored\n",
                 cap);
    if (cap == "portable") {
      c.clones = false;
      return c;
    }
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = __builtin_cpu_supports("avx512f");
    // The loops' AVX2 + FMA builds on a CPU with both and no AVX-512 (the clones have AVX2 or FMA).
    c.clones_avx2 = c.avx2 && (cap == "avx2" || !avx512);
    if (cap == "avx2" || !avx512) return c;
    c.avx512 = true;
    if (cap == "avx512f") return c;
    c.bf16 = __builtin_cpu_supports("avx512bf16");
    c.vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#endif
    return c;
  }();
  return chosen;
}

}  // namespace

bool avx512_kernels() { return kernel_choice().avx512; }
bool avx2_kernels() { return kernel_choice().avx2; }
bool avx512_bf16_kernels() { return kernel_choice().bf16; }
bool vnni_kernels() { return kernel_choice().vnni; }
bool simd_kernels() { return kernel_choice().clones; }
bool simd_capped_at_avx2() { return kernel_choice().clones_avx2; }

}  // namespace nanogpt::model
