// nanogpt serve: sample from a checkpoint over HTTP (OpenAI's /v1/completions, streaming, a
// playground page), many clients at once through continuous batching. The work is in serve/.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "runtime/device.h"
#include "runtime/threads.h"
#include "serve/server.h"
#include "train/checkpoint.h"

namespace nanogpt::cli {
namespace {

struct ServeArgs {
  std::string out_dir = "out";
  std::string ckpt;
  std::string api_key_file;
  std::string quantize = "none";
  std::string dtype = "auto";
  std::string device = "auto";
  int64_t num_threads = 0;
  serve::ServerOptions server;
};

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// Raises this process's limit on open descriptors to `needed` (the soft limit is often 1,024),
// within the hard limit the system sets; one error line when that is too low.
void allow_descriptors(int64_t needed) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      static_cast<int64_t>(limit.rlim_cur) >= needed)
    return;
  if (limit.rlim_max != RLIM_INFINITY && static_cast<int64_t>(limit.rlim_max) < needed)
    throw std::invalid_argument(fmt::format(
        "[serve] --max_connections needs {} open files and this process may open {} (ulimit -Hn): lower "
        "--max_connections or raise the limit",
        needed, static_cast<long long>(limit.rlim_max)));
  limit.rlim_cur = static_cast<rlim_t>(needed);
  setrlimit(RLIMIT_NOFILE, &limit);
}

void run_serve(ServeArgs a) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("[serve] " + m); };
  auto& o = a.server;
  if (!a.api_key_file.empty()) {
    if (!o.api_key.empty()) bad("give --api_key or --api_key_file, not both");
    o.api_key = trimmed(io::read_file(a.api_key_file, "serve"));
    if (o.api_key.empty()) bad("--api_key_file '" + a.api_key_file + "' is empty: put the key on its first line");
  }
  if (o.port < 0 || o.port > 65535) bad(fmt::format("--port ({}) must be in [0, 65535] (0 = any free port)", o.port));
  for (auto [name, value] : {std::pair{"--parallel", o.parallel}, {"--queue", o.queue}, {"--max_body_bytes", o.max_body_bytes},
                             {"--max_prompt_tokens", o.max_prompt_tokens}, {"--max_tokens", o.max_tokens},
                             {"--max_n", o.max_n}, {"--max_prompts", o.max_prompts}, {"--max_beam", o.max_beam},
                             {"--max_beam_tokens", o.max_beam_tokens}, {"--max_attention_tokens", o.max_attention_tokens},
                             {"--connections", o.connections}, {"--max_connections", o.max_connections},
                             {"--timeout", o.read_timeout_s}})
    if (value < 1) bad(fmt::format("{} ({}) must be >= 1", name, value));
  if (o.max_n * o.max_prompts > o.queue)  // else a request within the limits could never be queued
    bad(fmt::format("--queue ({}) must hold a whole request: --max_n ({}) x --max_prompts ({}) = {} sequences; raise "
                    "--queue or lower the other two",
                    o.queue, o.max_n, o.max_prompts, o.max_n * o.max_prompts));
  if (a.quantize != "none" && a.quantize != "int8" && a.quantize != "int4")
    bad("--quantize (" + a.quantize + ") must be none, int8 or int4");
  if (o.max_context < 0) bad(fmt::format("--max_context ({}) must be >= 1 (0 = block_size)", o.max_context));
  if (o.max_context > 0 && a.quantize != "none")
    bad("--quantize " + a.quantize + " runs in the CPU's decoder and --max_context in the static KV cache: drop one");
  if (a.dtype != "auto" && a.dtype != "float32" && a.dtype != "bfloat16")
    bad("--dtype (" + a.dtype + ") must be auto, float32 or bfloat16");
  if (!(o.stream_interval_ms >= 0.0 && o.stream_interval_ms <= 1000.0))
    bad(fmt::format("--stream_interval ({}) must be in [0, 1000] milliseconds (0 = an event a token)", o.stream_interval_ms));
  o.write_timeout_s = o.read_timeout_s;
  allow_descriptors(o.max_connections + 256);  // each connection holds one, and the program a few hundred

  // SIGINT and SIGTERM go to one watcher thread (blocked here, before any thread starts, so every
  // thread inherits the mask): it stops the server, which ends the streams in flight, and main exits 0.
  runtime::block_stop_signals();
  const sigset_t stop_signals = runtime::stop_signal_set();
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error from send(), not the end of the program

  runtime::set_threads(a.num_threads);
  const auto device = runtime::resolve_device(a.device);
  if (device.is_cuda() && a.quantize != "none")
    bad("--quantize " + a.quantize + " runs in the CPU's decoder: drop it, or serve with --device=cpu");
  o.bf16 = runtime::resolve_sampling_dtype(a.dtype, device) == "bfloat16";  // auto: as `sample` on this device
  auto loaded = train::load_model(train::resolve_checkpoint(a.ckpt.empty() ? a.out_dir : a.ckpt), device);
  const int64_t block_size = loaded.model->config().block_size;
  if (o.max_context > block_size)
    bad(fmt::format("--max_context ({}) is longer than the model's block_size ({}): it has seen no longer window; give "
                    "at most {} (0 = block_size)",
                    o.max_context, block_size, block_size));
  const auto quantize = a.quantize == "int8" ? model::Quantize::int8
                        : a.quantize == "int4" ? model::Quantize::int4 : model::Quantize::none;
  if (o.model_name.empty()) o.model_name = std::filesystem::path(loaded.path).parent_path().filename().string();
  if (o.model_name.empty()) o.model_name = "nanogpt";
  serve::Server server(loaded.model, loaded.vocab, o, quantize);
  const int port = server.bind();
  std::atomic<bool> running{true};
  std::thread watcher([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    if (!running.exchange(false)) return;  // woken by main: the server ended on its own
    std::fprintf(stderr, "[serve] %s: stopping (streams in flight end within %.0f s)\n",
                 signal == SIGINT ? "interrupted" : "terminated", o.drain_timeout_s);
    server.stop();
  });
  std::fprintf(stderr, "[serve] %s (%lld parameters, vocabulary of %lld, %s, %s) on http://%s:%d | %lld slots of %lld positions | %s\n",
               loaded.path.c_str(), static_cast<long long>(loaded.model->num_params()),
               static_cast<long long>(loaded.vocab.size()), o.bf16 ? "bfloat16" : "float32", device.str().c_str(),
               o.host.c_str(), port, static_cast<long long>(o.parallel),
               static_cast<long long>(o.max_context > 0 ? o.max_context : block_size),
               o.api_key.empty() ? "no API key" : "API key required");
  if (o.api_key.empty() && o.host != "127.0.0.1" && o.host != "localhost" && o.host != "::1")
    std::fprintf(stderr, "[serve] warning: listening on %s without an API key: anyone who can reach it can use it\n",
                 o.host.c_str());
  std::fflush(stderr);
  server.run();
  if (running.exchange(false)) kill(getpid(), SIGTERM);  // (still blocked in every thread: wakes the watcher)
  watcher.join();
  std::fprintf(stderr, "[serve] stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "serve", "Serve a checkpoint over HTTP: OpenAI's /v1/completions (streaming), a playground page at /, many clients at once");
  auto a = std::make_shared<ServeArgs>();
  auto& o = a->server;
  o.model_name.clear();  // from the checkpoint's folder unless given
  cmd->add_option("--out_dir", a->out_dir, "Training folder: reads ckpt_best.safetensors, else ckpt_last.safetensors")->capture_default_str();
  cmd->add_option("--ckpt", a->ckpt, "A checkpoint file (instead of --out_dir)");
  cmd->add_option("--host", o.host, "Address to listen on (0.0.0.0: every interface; set an API key then)")->capture_default_str();
  cmd->add_option("--port", o.port, "Port; 0 = any free port (printed)")->capture_default_str();
  cmd->add_option("--api_key", o.api_key, "Require 'Authorization: Bearer KEY' on every endpoint but /health and the page");
  cmd->add_option("--api_key_file", a->api_key_file, "Read the API key from this file's first line (keeps it out of `ps`)");
  cmd->add_option("--model_name", o.model_name, "The model's id in /v1/models (default: the checkpoint's folder name)");
  cmd->add_option("--parallel", o.parallel, "Slots: sequences generated together, one batched step per token")->capture_default_str();
  cmd->add_option("--queue", o.queue, "Sequences that may wait for a slot (at least --max_n x --max_prompts); beyond it 503 with Retry-After")->capture_default_str();
  cmd->add_option("--max_body_bytes", o.max_body_bytes, "Largest request body (413 beyond)")->capture_default_str();
  cmd->add_option("--max_prompt_tokens", o.max_prompt_tokens, "Longest prompt, in characters")->capture_default_str();
  cmd->add_option("--max_tokens", o.max_tokens, "Most tokens one request may ask for")->capture_default_str();
  cmd->add_option("--max_n", o.max_n, "Most choices (n) per prompt")->capture_default_str();
  cmd->add_option("--max_prompts", o.max_prompts, "Most prompts in one request (--max_n x --max_prompts <= --queue)")
      ->capture_default_str();
  cmd->add_option("--max_beam", o.max_beam, "Widest beam search (beam)")->capture_default_str();
  cmd->add_option("--max_beam_tokens", o.max_beam_tokens,
                  "Most tokens one beam search request may weigh: beam x prompts x max_tokens (it pauses every stream)")
      ->capture_default_str();
  cmd->add_option("--max_attention_tokens", o.max_attention_tokens,
                  "Longest text POST /v1/attention looks at, in characters (and at most the model's block_size)")
      ->capture_default_str();
  cmd->add_option("--connections", o.connections, "Requests answered at once (their threads); more wait their turn")
      ->capture_default_str();
  cmd->add_option("--max_connections", o.max_connections,
                  "Connections open at once, idle ones included; more get 503 at once")
      ->capture_default_str();
  cmd->add_option("--allowed_hosts", o.allowed_hosts,
                  "Without an API key, Host names answered besides localhost and the server's address (behind a "
                  "proxy: its name; * for any)")
      ->delimiter(',');
  cmd->add_option("--stream_interval", o.stream_interval_ms,
                  "Milliseconds between a stream's events at least: tokens that come faster go together in one "
                  "event (0 = an event a token)")
      ->capture_default_str();
  cmd->add_option("--timeout", o.read_timeout_s,
                  "Seconds a request may take to arrive whole (408 beyond), and a client may take to read an answer")
      ->capture_default_str();
  cmd->add_option("--quantize", a->quantize, "none | int8 | int4: the decoder's weights, as `sample --quantize`")->capture_default_str();
  cmd->add_option("--dtype", a->dtype,
                  "float32 | bfloat16 (the products in bfloat16: CPU autocast, or on a GPU the weights converted once) | "
                  "auto (as `sample`: float32 on a GPU; on a CPU bfloat16 where it multiplies it in hardware)")
      ->capture_default_str();
  cmd->add_option("--device", a->device,
                  "auto | cpu | cuda | cuda:N (auto: a GPU where there is one; there the slots live in a static KV "
                  "cache and each step replays a CUDA graph)")
      ->capture_default_str();
  cmd->add_option("--max_context", o.max_context,
                  "Tokens a prediction sees at most, and each slot's KV cache length (less memory): the last N tokens, "
                  "as a model of block_size N would; RoPE models slide their window past it as past block_size; beam "
                  "search recomputes its last N tokens; 0 = block_size. On a CPU it puts the slots in the static KV "
                  "cache (as on a GPU)")
      ->capture_default_str();
  cmd->add_option("--num_threads", a->num_threads, "CPU threads for the model; 0 = all cores")->capture_default_str();
  for (auto* option : cmd->get_options()) option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->get_option("--allowed_hosts")->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);  // a list: every one given
  cmd->callback([a] { run_serve(*a); });
}

}  // namespace nanogpt::cli
