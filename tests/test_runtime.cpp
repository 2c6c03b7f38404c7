// The process's runtime: one OpenMP runtime (LibTorch's own) shared by LibTorch and our parallel
// loops, those loops really running on several threads, the device choice on a machine without a
// GPU, and the environment changed only at start-up, before any thread.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "runtime/device.h"
#include "runtime/environment.h"
#include "runtime/peak_flops.h"
#include "model/fast/dropout.h"

namespace {

// Distinct files mapped into this process whose name is an OpenMP runtime (GNU libgomp, LLVM's
// libomp, Intel's libiomp5, with or without a hash in the name as wheels vendor them).
std::set<std::string> mapped_openmp_runtimes() {
  std::ifstream maps("/proc/self/maps");
  const std::regex openmp(R"((^|/)lib(g|i)?omp[0-9]*(-[0-9a-f]+)?\.so[.0-9]*$)");
  std::set<std::string> files;
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (std::regex_search(path, openmp)) files.insert(path);
  }
  return files;
}

}  // namespace

TEST(Runtime, ExactlyOneOpenMPRuntimeIsMapped) {
  // Make both sides use their runtime: a LibTorch kernel and one of our own parallel loops.
  torch::set_num_threads(2);
  auto a = torch::randn({256, 256});
  auto product = a.matmul(a).sum();
  auto dropped = nanogpt::model::fast_dropout(torch::ones({1 << 16}), 0.5, true);
  ASSERT_TRUE(product.defined() && dropped.defined());
  const auto runtimes = mapped_openmp_runtimes();
  std::string names;
  for (const auto& r : runtimes) names += r + " ";
  EXPECT_EQ(runtimes.size(), 1u) << "OpenMP runtimes mapped: " << names;
}

TEST(Runtime, OurParallelLoopsUseSeveralThreads) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one core: nothing to run in parallel";
  if (!NANOGPT_WITH_OPENMP)  // CMakeLists.txt: LibTorch's libgomp serves g++'s OpenMP code only
    GTEST_SKIP() << "built without LibTorch's OpenMP runtime (a compiler other than g++): our loops run on one thread";
  torch::set_num_threads(2);
  std::mutex m;
  std::set<int> threads;
  // at::parallel_for is compiled in this file: with -fopenmp and LibTorch's runtime it fans out.
  at::parallel_for(0, 1 << 12, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(m);
    threads.insert(at::get_thread_num());
  });
  EXPECT_EQ(threads.size(), 2u);
}

TEST(Runtime, AutoDeviceIsTheCpuWithoutAGpuAndCudaIsAClearError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA GPU is present (tests/test_cuda.cpp covers it)";
  EXPECT_EQ(nanogpt::runtime::resolve_device("auto"), torch::Device(torch::kCPU));
  try {
    nanogpt::runtime::resolve_device("cuda");
    FAIL() << "no error for --device=cuda without a GPU";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA GPU is available"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device=cpu"), std::string::npos) << e.what();
  }
}

TEST(Runtime, AllocationFailuresAreRecognisedAsOutOfMemory) {
  try {
    auto huge = torch::empty({int64_t{1} << 45}, torch::kByte);  // 32 TiB
    FAIL() << "a 32 TiB allocation succeeded";
  } catch (const std::exception& e) {
    EXPECT_TRUE(nanogpt::runtime::is_out_of_memory(e)) << e.what();
  }
  try {
    auto bad = torch::ones({2, 3}).matmul(torch::ones({2, 3}));
    FAIL() << "a shape mismatch went through";
  } catch (const std::exception& e) {
    EXPECT_FALSE(nanogpt::runtime::is_out_of_memory(e)) << e.what();
  }
}

TEST(Runtime, DtypeAutoFollowsTheCpusBf16Support) {
  std::string flags;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::getline(cpuinfo, flags, '\0');
  // An independent reading of the same fact: the kernel's CPU flags.
  const bool bf16 = flags.find(" avx512_bf16") != std::string::npos || flags.find(" amx_bf16") != std::string::npos;
  EXPECT_EQ(nanogpt::runtime::has_fast_bf16(torch::kCPU), bf16);
  EXPECT_EQ(nanogpt::runtime::resolve_dtype("auto", torch::kCPU), bf16 ? "bfloat16" : "float32");
  for (const char* explicit_dtype : {"float32", "bfloat16", "float16"})
    EXPECT_EQ(nanogpt::runtime::resolve_dtype(explicit_dtype, torch::kCPU), explicit_dtype);
  // Sampling: the CPU's choice on the CPU; float32 on a GPU unless asked (no GPU needed to decide).
  EXPECT_EQ(nanogpt::runtime::resolve_sampling_dtype("auto", torch::kCPU), bf16 ? "bfloat16" : "float32");
  EXPECT_EQ(nanogpt::runtime::resolve_sampling_dtype("auto", torch::Device("cuda")), "float32");
  for (const char* explicit_dtype : {"float32", "bfloat16", "float16"}) {
    EXPECT_EQ(nanogpt::runtime::resolve_sampling_dtype(explicit_dtype, torch::Device("cuda")), explicit_dtype);
    EXPECT_EQ(nanogpt::runtime::resolve_sampling_dtype(explicit_dtype, torch::kCPU), explicit_dtype);
  }
}

// Training's "auto" on the CPU is bf16 only where bf16 products are faster than fp32 ones here. An
// independent timing of a larger product than the one the choice is made on: where the two dtypes
// differ by more than 1.5x, the choice must follow it (in between, either is right).
TEST(Runtime, TrainingDtypeAutoTakesBf16OnlyWhereItsProductsAreFaster) {
  using nanogpt::runtime::resolve_training_dtype;
  for (const char* explicit_dtype : {"float32", "bfloat16", "float16"})
    EXPECT_EQ(resolve_training_dtype(explicit_dtype, torch::kCPU), explicit_dtype);
  const std::string chosen = resolve_training_dtype("auto", torch::kCPU);
  if (!nanogpt::runtime::has_fast_bf16(torch::kCPU)) {
    EXPECT_EQ(chosen, "float32");
    return;
  }
  double fp32 = 0.0, bf16 = 0.0;  // alternating rounds, the best of each (as the choice is timed)
  for (int round = 0; round < 3; ++round) {
    fp32 = std::max(fp32, nanogpt::runtime::measure_gemm_flops(torch::kCPU, torch::kFloat, 1024, 512, 1024, 2));
    bf16 = std::max(bf16, nanogpt::runtime::measure_gemm_flops(torch::kCPU, torch::kBFloat16, 1024, 512, 1024, 2));
  }
  const std::string rates = std::to_string(fp32 / 1e9) + " against " + std::to_string(bf16 / 1e9) + " GFLOP/s";
  if (bf16 > 1.5 * fp32) {
    EXPECT_EQ(chosen, "bfloat16") << rates;
  }
  if (fp32 > 1.5 * bf16) {
    EXPECT_EQ(chosen, "float32") << rates;
  }
  EXPECT_TRUE(chosen == "float32" || chosen == "bfloat16") << chosen;
}

// setenv is not thread-safe: the environment changes only in the functions main calls before any
// thread starts (cli/openmp_env.cpp, runtime/environment.cpp), never in code that runs later, such
// as the CUDA plugin making an NCCL group.
TEST(Runtime, OnlyStartUpCodeChangesTheEnvironment) {
  const std::regex changes(R"(\b(setenv|putenv|unsetenv|clearenv)\s*\()");
  const std::set<std::string> start_up = {"cli/openmp_env.cpp", "runtime/environment.cpp"};
  const std::filesystem::path root = NANOGPT_SOURCE_DIR;
  size_t files = 0;
  for (const char* area : {"cli", "data", "interop", "io", "model", "runtime", "serve", "train", "viz"}) {
    if (!std::filesystem::exists(root / area)) continue;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / area)) {
      const auto ext = entry.path().extension();
      if (ext != ".cpp" && ext != ".h") continue;
      ++files;
      const std::string name = std::filesystem::relative(entry.path(), root).string();
      std::ifstream in(entry.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n)
        if (std::regex_search(line, changes) && !start_up.count(name))
          ADD_FAILURE() << name << ":" << n << " changes the environment after start-up: " << line;
    }
  }
  EXPECT_GT(files, 50u);
}

// The NCCL defaults, set in a child process (one thread): a value the user set wins.
TEST(Runtime, NcclDefaultsKeepTheUsersValues) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::unsetenv("TORCH_NCCL_BLOCKING_WAIT");
    ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", 1);
    nanogpt::runtime::set_nccl_defaults();
    const char* wait = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
    const char* async = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    ::_exit(wait && std::string(wait) == "1" && async && std::string(async) == "3" ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "TORCH_NCCL_BLOCKING_WAIT is not 1, or the user's "
                                                                "TORCH_NCCL_ASYNC_ERROR_HANDLING was replaced";
}
