// Which hand-written CPU kernels run: the widest the CPU has, or as the environment variable
// NANOGPT_KERNELS caps them, so that one machine can run (and the tests can check) the code that
// narrower CPUs run:
//   (unset)   AVX512-BF16 dot products, AVX-512 intrinsics and each loop's widest clone (simd.h);
//   avx512f   no bf16 dot products and no AVX512-VNNI;
//   avx2      AVX2 + FMA intrinsics, and each loop's AVX2 build, as a laptop without AVX-512 runs
//             (on a CPU without AVX2 and FMA, the same as portable for the intrinsics);
//   portable  no intrinsics, and every loop built for several instruction sets runs its baseline
//             build (plain x86-64, or whatever the target is: 64-bit Arm has no clones at all).
#pragma once

namespace nanogpt::model {

/// Whether the kernels may use AVX-512 intrinsics: the CPU has AVX-512F and NANOGPT_KERNELS is
/// neither `avx2` nor `portable`.
bool avx512_kernels();
/// Whether they may use AVX2 + FMA intrinsics (where avx512_kernels() is false, or for the kernels
/// that have no AVX-512 version): the CPU has both and NANOGPT_KERNELS is not `portable`.
bool avx2_kernels();
/// Whether they may also use AVX512-BF16 (its conversions and dot products): the CPU has it and
/// NANOGPT_KERNELS caps them at none of avx512f, avx2 and portable.
bool avx512_bf16_kernels();
/// Whether the int8 dot products may use AVX512-VNNI (VPDPBUSD): the CPU has it (with AVX512-BW) and
/// NANOGPT_KERNELS caps the kernels at none of avx512f, avx2 and portable.
bool vnni_kernels();
/// Whether a loop built for several instruction sets (simd.h's NANOGPT_KERNEL) runs the clone the
/// CPU picks or its AVX2 build (true), or its baseline build (NANOGPT_KERNELS=portable).
bool simd_kernels();
/// Whether such a loop runs its AVX2 + FMA build in place of a clone: on a CPU with both and without
/// AVX-512, and under NANOGPT_KERNELS=avx2 on one with AVX-512.
bool simd_capped_at_avx2();

}  // namespace nanogpt::model
