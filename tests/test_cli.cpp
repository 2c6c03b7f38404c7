// The nanogpt program end to end: the summary line, exact resume through the CLI, samples, and
// one clear error line (and a non-zero exit) for each kind of bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <torch/version.h>

#include "data/utf8.h"
#include "shell.h"
#include "train_fixture.h"

using namespace nanogpt::testing;

namespace {

// A tiny config file for the CLI, built from the shared fixture.
std::string write_config(const std::string& dir, const std::string& extra = "") {
  auto c = tiny_config(dir);
  std::string yaml = nanogpt::train::to_yaml(c) + extra;
  std::ofstream(dir + "/tiny.yaml") << yaml;
  return dir + "/tiny.yaml";
}

void expect_one_error_line(const Outcome& r, const std::string& needle) {
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

}  // namespace

TEST(Cli, VersionNamesTheLibTorchItRuns) {
  TempDir dir("cli_version");
  const auto r = run_nanogpt("--version", dir.path);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("nanogpt, LibTorch " + std::string(TORCH_VERSION), 0), 0u) << r.out;
}

// The program ends without the libraries' static destructors (main.cpp), so it flushes its output
// itself: what it could not write is an error, not a silent exit 0 (before, exit() hid it).
TEST(Cli, OutputThatCannotBeWrittenIsAnError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  TempDir dir("cli_full");
  for (const std::string args : {"--version", "sample --help"}) {
    const std::string err = dir.path + "/stderr";
    const int status = std::system((std::string(NANOGPT_BINARY) + " " + args + " >/dev/full 2>" + err + " </dev/null").c_str());
    ASSERT_TRUE(WIFEXITED(status)) << args;
    EXPECT_NE(WEXITSTATUS(status), 0) << args;
    const std::string e = read_text(err);
    EXPECT_NE(e.find("error: could not write all of the output: "), std::string::npos) << args << ": " << e;
  }
}

TEST(Cli, PreparePrintsNanoGPTsSplit) {
  TempDir dir("cli_prepare");
  auto r = run_nanogpt("prepare --input " + std::string(NANOGPT_SOURCE_DIR) + "/data/shakespeare_char/input.txt --out_dir " +
                   dir.path,
               dir.path);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "[data] vocab_size=65 train_tokens=1003854 val_tokens=111540\n");
  auto t = run_nanogpt("prepare --input " + std::string(NANOGPT_SOURCE_DIR) + "/data/tang_poems/input.txt --out_dir " + dir.path + "/tang",
               dir.path);
  EXPECT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(t.out.rfind("[data] vocab_size=7443 ", 0), 0u) << t.out;
}

TEST(Cli, ResumeThroughTheCliIsBitwiseExact) {
  TempDir dir("cli_resume");
  const std::string cfg = write_config(dir.path);
  auto full = run_nanogpt("train " + cfg + " --out_dir=" + dir.path + "/full", dir.path);
  ASSERT_EQ(full.rc, 0) << full.err;
  EXPECT_NE(full.out.find("number of parameters: 0.03M"), std::string::npos) << full.out;
  auto half = run_nanogpt("train " + cfg + " --out_dir=" + dir.path + "/half --max_iters=10", dir.path);
  ASSERT_EQ(half.rc, 0) << half.err;
  auto resumed = run_nanogpt("train " + cfg + " --out_dir=" + dir.path + "/half --init_from=resume", dir.path);
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos);
  auto a = train_losses(dir.path + "/full/metrics.csv"), b = train_losses(dir.path + "/half/metrics.csv");
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::filesystem::exists(dir.path + "/full/config.yaml"));
  EXPECT_TRUE(std::filesystem::exists(dir.path + "/full/train.log"));
}

TEST(Cli, TrainRejectsBadInputWithOneLine) {
  TempDir dir("cli_bad_train");
  const std::string cfg = write_config(dir.path);
  expect_one_error_line(run_nanogpt("train " + cfg + " --max_iters", dir.path), "--max_iters");
  expect_one_error_line(run_nanogpt("train " + cfg + " --=3", dir.path), "--=3");
  expect_one_error_line(run_nanogpt("train " + cfg + " --max_itters=3", dir.path), "max_itters");
  expect_one_error_line(run_nanogpt("train " + cfg + " --max_iters=abc", dir.path), "max_iters");
  expect_one_error_line(run_nanogpt("train " + cfg + " --n_head=5", dir.path), "n_head");
  expect_one_error_line(run_nanogpt("train " + cfg + " --init_from=resume --out_dir=" + dir.path + "/none", dir.path), "no checkpoint");
  expect_one_error_line(run_nanogpt("train " + cfg + " --dataset=" + dir.path + "/missing", dir.path), "input.txt");
  expect_one_error_line(run_nanogpt("train " + dir.path + "/nope.yaml", dir.path), "nope.yaml");
  std::ofstream(dir.path + "/bad.yaml") << "max_iters: 10\nwarmup: 3\n";
  expect_one_error_line(run_nanogpt("train " + dir.path + "/bad.yaml", dir.path), "warmup");
  if (!torch::cuda::is_available())
    expect_one_error_line(run_nanogpt("train " + cfg + " --device=cuda", dir.path), "no CUDA GPU is available");
}

TEST(Cli, SampleIsDeterministicStopsAndHandlesUnknownCharacters) {
  TempDir dir("cli_sample");
  const std::string cfg = write_config(dir.path);
  ASSERT_EQ(run_nanogpt("train " + cfg + " --max_iters=10", dir.path).rc, 0);
  const std::string base = "sample --device=cpu --num_threads=1 --out_dir=" + dir.path + "/out --num_samples=2 --max_new_tokens=40 ";
  auto a = run_nanogpt(base + "--seed=7", dir.path), b = run_nanogpt(base + "--seed=7", dir.path), c = run_nanogpt(base + "--seed=8", dir.path);
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  size_t separators = 0;
  for (size_t at = a.out.find("\n---------------\n"); at != std::string::npos; at = a.out.find("\n---------------\n", at + 1))
    ++separators;
  EXPECT_EQ(separators, 2u) << "nanoGPT's separator after each sample";
  EXPECT_NE(a.err.find("tok/s"), std::string::npos);
  auto batched = run_nanogpt(base + "--seed=7 --batch", dir.path);
  EXPECT_EQ(batched.rc, 0) << batched.err;
  // 40 new tokens past block_size: without the cache, sample.py's recompute, as --exact_window.
  auto nocache = run_nanogpt(base + "--seed=7 --no_cache", dir.path), exact = run_nanogpt(base + "--seed=7 --exact_window", dir.path);
  EXPECT_EQ(nocache.out, exact.out);
  // Beam search prints its beams best first with their log-probabilities; --show_probs a table.
  auto beams = run_nanogpt(base + "--beam=2", dir.path);
  ASSERT_EQ(beams.rc, 0) << beams.err;
  EXPECT_NE(beams.out.find("[beam 1/2] log-probability"), std::string::npos) << beams.out;
  EXPECT_NE(beams.out.find("[beam 2/2] log-probability"), std::string::npos) << beams.out;
  auto probs = run_nanogpt(base + "--seed=7 --show_probs --max_new_tokens=5", dir.path);
  ASSERT_EQ(probs.rc, 0) << probs.err;
  EXPECT_NE(probs.out.find("[probs]"), std::string::npos) << probs.out;
  // --dtype: sample.py's key; the summary line names the dtype the run used.
  auto fp32 = run_nanogpt(base + "--seed=7 --dtype=float32", dir.path), bf16 = run_nanogpt(base + "--seed=7 --dtype=bfloat16", dir.path);
  ASSERT_EQ(fp32.rc, 0) << fp32.err;
  ASSERT_EQ(bf16.rc, 0) << bf16.err;
  EXPECT_NE(fp32.err.find("cpu, float32)"), std::string::npos) << fp32.err;
  EXPECT_NE(bf16.err.find("cpu, bfloat16)"), std::string::npos) << bf16.err;
  expect_one_error_line(run_nanogpt(base + "--dtype=fp8", dir.path), "--dtype");
  // --quantize int8 and int4: the summary line says so, a seed gives the same samples, beam search
  // takes it too, and what cannot run the decoder is one error line.
  for (const std::string q : {"int8", "int4"}) {
    auto once = run_nanogpt(base + "--seed=7 --quantize=" + q, dir.path);
    auto again = run_nanogpt(base + "--seed=7 --quantize=" + q, dir.path);
    ASSERT_EQ(once.rc, 0) << once.err;
    EXPECT_EQ(once.out, again.out) << q;
    EXPECT_NE(once.err.find(q + " weights)"), std::string::npos) << once.err;
    EXPECT_EQ(run_nanogpt(base + "--beam=2 --quantize=" + q, dir.path).rc, 0) << q;
    expect_one_error_line(run_nanogpt(base + "--quantize=" + q + " --no_cache", dir.path), "--no_cache");
    expect_one_error_line(run_nanogpt(base + "--quantize=" + q + " --dtype=float16", dir.path),
                          "quantized weights run in the CPU decoder");
  }
  expect_one_error_line(run_nanogpt(base + "--quantize=int2", dir.path), "--quantize");
  expect_one_error_line(run_nanogpt(base + "--beam=-1", dir.path), "--beam");
  expect_one_error_line(run_nanogpt(base + "--beam=2 --stream", dir.path), "--beam");
  auto stopped = run_nanogpt(base + "--seed=7 --stop=e --start=T --max_new_tokens=400 --temperature=1", dir.path);
  ASSERT_EQ(stopped.rc, 0);
  const auto first = stopped.out.substr(0, stopped.out.find("\n---------------"));
  EXPECT_EQ(first.back(), 'e') << first;
  EXPECT_EQ(first.find('e'), first.size() - 1) << first;
  expect_one_error_line(run_nanogpt(base + "--start=Té", dir.path), "U+00E9");
  auto skipped = run_nanogpt(base + "--start=Té --skip_unknown", dir.path);
  EXPECT_EQ(skipped.rc, 0) << skipped.err;
  EXPECT_NE(skipped.err.find("U+00E9"), std::string::npos);
  expect_one_error_line(run_nanogpt(base + "--temperature=-1", dir.path), "temperature");
  expect_one_error_line(run_nanogpt(base + "--top_p=0", dir.path), "top_p");
  // The decoder's kernel knob (for the tests) with a value it does not know: a warning, and the
  // kernels it would pick anyway (the same samples).
  if (!std::getenv("NANOGPT_KERNELS")) {
    setenv("NANOGPT_KERNELS", "avx512", 1);
    auto unknown = run_nanogpt(base + "--seed=7", dir.path);
    unsetenv("NANOGPT_KERNELS");
    EXPECT_EQ(unknown.rc, 0) << unknown.err;
    EXPECT_EQ(unknown.out, a.out);
    EXPECT_NE(unknown.err.find("warning: NANOGPT_KERNELS=avx512 is not a kernel set"), std::string::npos) << unknown.err;
  }
}

TEST(Cli, BrokenCheckpointsAreClearErrors) {
  TempDir dir("cli_broken_ckpt");
  const std::string cfg = write_config(dir.path);
  ASSERT_EQ(run_nanogpt("train " + cfg + " --max_iters=10", dir.path).rc, 0);
  const std::string good = read_text(dir.path + "/out/ckpt_last.safetensors");
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir.path + "/" + name, std::ios::binary) << bytes;
    return dir.path + "/" + name;
  };
  expect_one_error_line(run_nanogpt("sample --device=cpu --ckpt=" + dir.path + "/missing.safetensors", dir.path), "missing.safetensors");
  expect_one_error_line(run_nanogpt("sample --device=cpu --ckpt=" + write("empty.safetensors", ""), dir.path), "empty");
  expect_one_error_line(run_nanogpt("sample --device=cpu --ckpt=" + write("text.safetensors", "hello, I am not a checkpoint"), dir.path), "not a nanogpt-cpp checkpoint");
  for (size_t cut : {good.size() / 2, good.size() - 100, size_t{40}})
    expect_one_error_line(run_nanogpt("sample --device=cpu --ckpt=" + write("cut.safetensors", good.substr(0, cut)), dir.path), "cut.safetensors");
  expect_one_error_line(run_nanogpt("sample --device=cpu --out_dir=" + dir.path, dir.path), "no checkpoint");
}

TEST(Cli, ChineseModelSamplesValidUtf8) {
  TempDir dir("cli_chinese");
  // Tang poems (4-byte characters included) as a small corpus.
  const std::string text = tang_poems_head(60000) + "𠀀𪚥\n";
  auto c = tiny_config_on(dir.path, text);
  c.max_iters = 30;
  std::ofstream(dir.path + "/zh.yaml") << nanogpt::train::to_yaml(c);
  ASSERT_EQ(run_nanogpt("train " + dir.path + "/zh.yaml", dir.path).rc, 0);
  const std::string start = text.substr(0, 6);  // the first two characters (3 bytes each)
  auto s = run_nanogpt("sample --device=cpu --num_threads=1 --out_dir=" + dir.path + "/out --start=" + start +
                   " --num_samples=1 --max_new_tokens=60 --temperature=1",
               dir.path);
  ASSERT_EQ(s.rc, 0) << s.err;
  const auto cps = nanogpt::data::decode_utf8(s.out);  // throws on invalid UTF-8
  EXPECT_GT(cps.size(), 60u);
  EXPECT_EQ(s.out.rfind(start, 0), 0u);
  int cjk = 0;
  for (char32_t cp : cps) cjk += cp >= 0x4E00;
  EXPECT_GT(cjk, 20);
}

// LibTorch's CUDA half (libtorch_cuda.so, and cuBLAS, cuDNN, NCCL behind it) is mapped only for a
// run that may use a GPU: the dynamic loader's own account (LD_DEBUG=files) of what it opened.
TEST(Cli, OnlyAGpuRunLoadsLibTorchsCudaLibraries) {
  TempDir dir("cli_lazy_cuda");
  const std::string binary = NANOGPT_BINARY;
  const std::string plugin = binary.substr(0, binary.rfind('/')) + "/libnanogpt_cuda.so";
  auto opened = [&](const std::string& args) {  // the loader's trace of `nanogpt args`
    const std::string trace = dir.path + "/trace";
    std::system(("LD_DEBUG=files " + binary + " " + args + " >/dev/null 2>" + trace + " </dev/null").c_str());
    return read_text(trace);
  };
  const std::string none = " --out_dir=" + dir.path + "/no_checkpoint --max_new_tokens=1";
  const std::string help = opened("--help");
  ASSERT_NE(help.find("libtorch_cpu.so"), std::string::npos) << "LD_DEBUG said nothing: " << help.substr(0, 400);
  EXPECT_EQ(help.find("libtorch_cuda.so"), std::string::npos);
  EXPECT_EQ(opened("sample --device=cpu" + none).find("libtorch_cuda.so"), std::string::npos);
  if (!std::filesystem::exists(plugin)) GTEST_SKIP() << "a LibTorch without CUDA: no plugin to load";
  // Asking for a GPU loads the plugin and LibTorch's CUDA half (and, without a GPU, then says so).
  const std::string gpu = opened("sample --device=cuda" + none);
  EXPECT_NE(gpu.find("libnanogpt_cuda.so"), std::string::npos);
  EXPECT_NE(gpu.find("libtorch_cuda.so"), std::string::npos);
  EXPECT_EQ(gpu.find("cannot load CUDA support"), std::string::npos) << gpu.substr(gpu.size() - 400);
  EXPECT_EQ(gpu.find("is not nanogpt's CUDA plugin"), std::string::npos);
}

// The nanogpt program starts LibTorch's OpenMP runtime with a short spin (cli/openmp_env.cpp), set
// before the runtime reads it; a spin count or wait policy of the user's own is kept. Its log also
// names the malloc in use.
TEST(Cli, OpenMpStartsWithAShortSpinUnlessTheUserSetOne) {
  TempDir dir("cli_openmp_spin");
  const std::string config = write_config(dir.path);
  auto r = run_nanogpt("train " + config + " --max_iters=1 --eval_interval=100", dir.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("(OpenMP spin 10000)"), std::string::npos) << r.out;
  // The malloc the build linked (runtime/host_memory.h): tcmalloc, or glibc's with its heap kept;
  // under AddressSanitizer (scripts/sanitize.sh) its own, which takes no mallopt settings.
#if defined(__SANITIZE_ADDRESS__)
  const char* malloc_field = "| malloc system |";
#else
  const char* malloc_field = NANOGPT_WITH_TCMALLOC ? "| malloc tcmalloc |" : "| malloc glibc (heap kept) |";
#endif
  EXPECT_NE(r.out.find(malloc_field), std::string::npos) << r.out;
  const std::string mine = "GOMP_SPINCOUNT=123 " + std::string(NANOGPT_BINARY) + " train " + config +
                           " --max_iters=1 --eval_interval=100 --out_dir=" + dir.path + "/mine >" + dir.path +
                           "/mine.out 2>&1";
  ASSERT_EQ(std::system(mine.c_str()), 0) << read_text(dir.path + "/mine.out");
  EXPECT_NE(read_text(dir.path + "/mine.out").find("(OpenMP spin 123)"), std::string::npos);
}
