# Included before find_package(Torch): decides whether this build has CUDA support (the plugin
# libnanogpt_cuda.so) and lets a CUDA LibTorch configure on a machine without the CUDA toolkit.
#
# LibTorch's CUDA builds (the PyTorch wheel's, the official cu1xx archives) look for the toolkit in
# their own CMake config (Caffe2/public/cuda.cmake: nvcc, enable_language(CUDA), the toolkit's
# libraries) and stop configuring without it ("Your installed Caffe2 version uses CUDA but I cannot
# find the CUDA libraries"). Our code links LibTorch's CPU half only; CUDA comes in with the plugin,
# which alone needs the toolkit's headers. So: probe for a working CUDA compiler first, and without
# one skip the plugin, and answer cuda.cmake's include guard (`if(TARGET torch::cudart) return()`)
# with an empty target, so that Caffe2's config takes CUDA as found and does not look for it.
# The CUDA targets it would have made (torch::cudart, CUDA::*) are then missing: nothing of ours
# links them in such a build (the `torch` and `torch_cuda` targets are not used).
#
# Sets NANOGPT_CUDA_TOOLKIT (ON/OFF) and, when OFF, NANOGPT_NO_CUDA_REASON.
option(NANOGPT_CUDA "Build the CUDA plugin when LibTorch has CUDA and the CUDA toolkit is found (OFF: CPU only)" ON)

set(NANOGPT_CUDA_TOOLKIT OFF)
if(NOT NANOGPT_CUDA)
  set(NANOGPT_NO_CUDA_REASON "configured with -DNANOGPT_CUDA=OFF")
else()
  # check_language tries nvcc in a scratch project and caches CMAKE_CUDA_COMPILER (NOTFOUND when it
  # fails): the same compiler Caffe2's enable_language(CUDA) then uses. nvcc: -DCMAKE_CUDA_COMPILER,
  # else $CUDACXX, else the first on PATH, else /usr/local/cuda/bin/nvcc (where Caffe2 looks too).
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(NANOGPT_NVCC nvcc PATHS /usr/local/cuda/bin DOC "The CUDA compiler tried for the CUDA plugin")
    mark_as_advanced(NANOGPT_NVCC)
    if(NANOGPT_NVCC)
      set(ENV{CUDACXX} "${NANOGPT_NVCC}")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(NANOGPT_CUDA_TOOLKIT ON)
  else()
    string(CONCAT NANOGPT_NO_CUDA_REASON "no working CUDA toolkit (nvcc) found; for GPU runs install the toolkit "
                  "of LibTorch's CUDA version and configure a fresh build folder")
  endif()
endif()

# The GPUs the plugin's own kernels (model/cuda/*.cu) are compiled for. Without a list LibTorch's
# config asks the GPU of the building machine, and without one falls back to a list that starts
# at Maxwell (5.0), which CUDA 13's nvcc refuses. CUDA 13 runs Turing (7.5) and later: one cubin
# for each generation, and PTX for the newest so that later GPUs compile it at load time.
if(NANOGPT_CUDA_TOOLKIT AND NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX" CACHE STRING
      "GPU architectures of the CUDA plugin's kernels (LibTorch's variable; set it to build for fewer)")
endif()

if(NOT NANOGPT_CUDA_TOOLKIT AND NOT TARGET torch::cudart)
  add_library(torch::cudart INTERFACE IMPORTED)  # see above: Caffe2's cuda.cmake then returns at once
endif()
