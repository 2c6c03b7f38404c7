// `nanogpt serve`: continuous batching gives each sequence the tokens generate() gives it alone
// (the batched decoder step and SequenceStepper, against model::generate), the request parser
// names the bad field, and the server end to end through real clients (curl; the openai Python
// client in tests/serve_openai_client.py): completions streamed and not, every kind of bad input
// answered 4xx while the server keeps serving, the API key, a full queue, a client hanging up,
// beam search and attention weights against the library, a short load test that leaks nothing,
// SIGTERM ending the streams in flight, and the playground in headless Chromium. Loopback only, on
// ports the system picks.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "data/utf8.h"
#include "model/generate.h"
#include "runtime/device.h"
#include "serve/batcher.h"
#include "serve/metrics.h"
#include "serve/request.h"
#include "serve/server.h"
#include "shell.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train_fixture.h"

using namespace nanogpt;
using namespace nanogpt::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fmt_percent(unsigned char c) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("%") + hex[c >> 4] + hex[c & 15];
}

// Text as Chromium serialises it inside an element.
std::string html_escaped(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : std::string(1, c);
  return out;
}

// ---- Continuous batching against generate() ----

model::GPT tiny_model(const std::string& pos_encoding) {
  torch::manual_seed(7);
  auto c = tiny_model_config();
  c.pos_encoding = pos_encoding;
  c.vocab_size = 23;
  model::GPT m(c);
  m->eval();
  return m;
}

std::vector<int64_t> reference(model::GPT& m, const std::vector<int64_t>& prompt, int64_t n,
                               const model::SamplingOptions& o, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return model::generate(m, prompt, 1, n, o, rng)[0];
}

class Batching : public ::testing::TestWithParam<std::string> {};

// Sequences join and leave a running batch; each one's tokens (greedy, top-k and top-p) are exactly
// those generate() draws for it alone with the same random stream: past block_size too (RoPE's
// sliding cache; a prefill per token for learned positions).
TEST_P(Batching, EachSequenceMatchesGenerateAloneWhateverJoinsOrLeaves) {
  auto m = tiny_model(GetParam());
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  model::SamplingOptions warm;
  warm.temperature = 1.0;
  warm.top_k = 5;
  model::SamplingOptions nucleus;  // top-p: the filters' tensor path (the others take plain loops)
  nucleus.temperature = 0.9;
  nucleus.top_p = 0.8;
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3}, {4}, {5, 6, 7, 8, 9, 10, 11}, {12, 13}};
  const std::vector<model::SamplingOptions> options{greedy, warm, nucleus, greedy};
  const std::vector<int64_t> length{30, 12, 25, 20}, joins{0, 0, 5, 9};  // tokens each, and the step it joins at
  std::vector<std::vector<int64_t>> expected;
  for (size_t i = 0; i < prompts.size(); ++i) expected.push_back(reference(m, prompts[i], length[i], options[i], 100 + i));

  model::SequenceStepper stepper(m);
  std::vector<model::Sequence> seqs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs[i].tokens = prompts[i];
    seqs[i].options = options[i];
    seqs[i].rng.seed(100 + i);
  }
  for (int64_t step = 0; step < 60; ++step) {
    std::vector<model::Sequence*> batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t made = static_cast<int64_t>(seqs[i].tokens.size() - prompts[i].size());
      if (step >= joins[i] && made < length[i]) batch.push_back(&seqs[i]);
    }
    if (batch.empty()) break;
    auto out = stepper.step(batch);
    ASSERT_EQ(out.logits.size(0), static_cast<int64_t>(batch.size()));
  }
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i].tokens, expected[i]) << "sequence " << i;
}

INSTANTIATE_TEST_SUITE_P(Positions, Batching, ::testing::Values("rope", "learned"));

// The decoder's step over sequences with caches of their own gives each row the logits of a
// batch of one, bit for bit (the arithmetic per row does not depend on what else is in the batch),
// in float32 and with bf16 matrices: nine rows, so the products take rows of x several at a time
// (float32: eight, then one; bf16: four, four, then one), all at different positions; 128 columns,
// so that each sum has several steps in either precision.
class DecoderRows : public ::testing::TestWithParam<bool> {};

TEST_P(DecoderRows, WithOwnCachesEqualSteppingAlone) {
  const bool bf16 = GetParam();
  torch::manual_seed(7);
  auto c = tiny_model_config();
  c.pos_encoding = "rope";
  c.vocab_size = 23;
  c.n_embd = 128;
  model::GPT m(c);
  m->eval();
  c10::InferenceMode inference;
  runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, bf16);
  model::Decoder decoder(*m);
  ASSERT_EQ(decoder.bf16_weights(), bf16);
  constexpr size_t kRows = 9;
  std::vector<std::vector<int64_t>> streams;
  for (size_t r = 0; r < kRows; ++r) {  // rows of 3 to 11 tokens: the last goes in the batched step
    std::vector<int64_t> s;
    for (size_t t = 0; t < 3 + r % 5 + r / 3; ++t) s.push_back(static_cast<int64_t>((r * 7 + t * 3) % 23));
    streams.push_back(s);
  }
  std::vector<model::KVCache> alone(kRows), together(kRows);
  for (size_t r = 0; r < kRows; ++r)
    for (size_t t = 0; t + 1 < streams[r].size(); ++t) {
      decoder.step(torch::tensor({streams[r][t]}), alone[r]);
      decoder.step(torch::tensor({streams[r][t]}), together[r]);
    }
  std::vector<torch::Tensor> single;
  std::vector<int64_t> last;
  std::vector<model::KVCache*> caches;
  for (size_t r = 0; r < kRows; ++r) {
    last.push_back(streams[r].back());
    single.push_back(decoder.step(torch::tensor({streams[r].back()}), alone[r]));
    caches.push_back(&together[r]);
  }
  auto batched = decoder.step(torch::tensor(last), caches);
  ASSERT_EQ(batched.size(0), static_cast<int64_t>(kRows));
  for (size_t r = 0; r < kRows; ++r) {
    EXPECT_TRUE(torch::equal(batched[r], single[r][0]))
        << "row " << r << ": max difference " << (batched[r] - single[r][0]).abs().max().item<float>();
    EXPECT_EQ(together[r].length(), alone[r].length());
  }
  EXPECT_THROW(decoder.step(torch::tensor({1, 2}), std::vector<model::KVCache*>{&together[0]}), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Matrices, DecoderRows, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "bf16" : "float32"; });

// A reader that falls behind gets each choice's pending tokens joined into one event: after both
// choices have finished unread, one wait hands over exactly one event each, holding all their
// tokens in order (the greedy text generate() gives) and the finish; then nothing is left.
TEST(Batching, AReaderThatFallsBehindGetsOneEventAChoice) {
  auto m = tiny_model("rope");
  const auto vocab = data::Vocab::from_text("abcdefghijklmnopqrstuvw");  // the model's 23 tokens
  ASSERT_EQ(vocab.size(), 23);
  serve::ServerOptions options;
  serve::Metrics metrics;
  serve::Batcher batcher(m, vocab, options, metrics);
  const auto request = serve::parse_completion_request(
      R"({"prompt": "abc", "max_tokens": 12, "n": 2, "temperature": 0, "logprobs": 0})", vocab, options);
  auto job = batcher.submit(request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (metrics.text(0, 0, 0).find("nanogpt_generated_tokens_total 24\n") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the two choices did not finish";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  const auto tokens = reference(m, request.prompts[0], 12, greedy, 1);
  const std::string expected = vocab.decode(std::vector<int64_t>(tokens.begin() + 3, tokens.end()));
  std::vector<serve::ChoiceEvent> events;
  ASSERT_FALSE(job->wait_events(events, std::chrono::milliseconds(0)));  // these are the last events
  ASSERT_EQ(events.size(), 2u);
  for (const auto& e : events) {
    EXPECT_EQ(e.text, expected) << "choice " << e.index;
    EXPECT_EQ(e.tokens.size(), 12u);
    std::string joined;
    for (const auto& t : e.tokens) joined += t.text;
    EXPECT_EQ(joined, expected);
    EXPECT_EQ(e.finish, std::optional<std::string>("length"));
    EXPECT_EQ(e.generated, 12);
  }
  EXPECT_NE(events[0].index, events[1].index);
  EXPECT_FALSE(job->wait_events(events, std::chrono::milliseconds(0)));
  EXPECT_TRUE(events.empty());
}

// A learned-positions model whose position 10 is NaN: a sequence that reaches it gets non-finite
// logits, one that stays below it never does (its text is that of the model without the NaN).
model::GPT model_nan_from_position_10() {
  auto m = tiny_model("learned");
  torch::NoGradGuard no_grad;
  m->named_parameters()["wpe.weight"][10].fill_(std::numeric_limits<float>::quiet_NaN());
  return m;
}

// One sequence's non-finite logits fail that sequence alone: the step leaves it without a token and
// names its row, and the others in the same steps draw what generate() gives them alone.
TEST(Batching, ASequenceWithNonFiniteLogitsFailsAlone) {
  auto m = model_nan_from_position_10();
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  const std::vector<std::vector<int64_t>> prompts{{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, {15}};
  model::SequenceStepper stepper(m);
  std::vector<model::Sequence> seqs(prompts.size());
  std::vector<model::Sequence*> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs[i].tokens = prompts[i];
    seqs[i].options = greedy;
    batch.push_back(&seqs[i]);
  }
  const auto first = stepper.step(batch);  // the second prompt reaches position 10
  EXPECT_EQ(first.non_finite, std::vector<int64_t>{1});
  EXPECT_EQ(seqs[1].tokens, prompts[1]);
  batch.erase(batch.begin() + 1);
  for (int step = 1; step < 6; ++step) EXPECT_TRUE(stepper.step(batch).non_finite.empty()) << "step " << step;
  EXPECT_EQ(seqs[0].tokens, reference(m, prompts[0], 6, greedy, 0));
  EXPECT_EQ(seqs[2].tokens, reference(m, prompts[2], 6, greedy, 0));
}

// Through the batcher: the failing choice ends with "abort" and its request's error; the choices
// stepped beside it go on to their end with the text they have alone.
TEST(Batching, AChoiceWithNonFiniteLogitsEndsAloneAndTheOthersFinish) {
  auto m = model_nan_from_position_10();
  const auto vocab = data::Vocab::from_text("abcdefghijklmnopqrstuvw");  // the model's 23 tokens
  serve::ServerOptions options;
  serve::Metrics metrics;
  serve::Batcher batcher(m, vocab, options, metrics);
  // one request, so that its three choices join the same steps
  const auto request = serve::parse_completion_request(
      R"({"prompt": ["abc", "defghijklmn", "p"], "max_tokens": 6, "temperature": 0, "logprobs": 0})", vocab, options);
  auto job = batcher.submit(request);
  std::vector<std::string> text(3), finish(3);
  std::vector<serve::ChoiceEvent> events;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (bool more = true; more;) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the choices did not finish";
    more = job->wait_events(events, std::chrono::milliseconds(100));
    for (const auto& e : events) {
      text[e.index] += e.text;
      if (e.finish) finish[e.index] = *e.finish;
    }
  }
  EXPECT_EQ(finish[1], "abort");
  EXPECT_NE(job->error().find("non-finite logits"), std::string::npos) << job->error();
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  for (size_t i : {0, 2}) {
    const auto tokens = reference(m, request.prompts[i], 6, greedy, 0);
    EXPECT_EQ(text[i], vocab.decode(std::vector<int64_t>(tokens.begin() + request.prompts[i].size(), tokens.end())))
        << "choice " << i;
    EXPECT_EQ(finish[i], "length") << "choice " << i;
  }
}

// ---- Request parsing ----

TEST(RequestParsing, ReadsOpenAIFieldsAndDefaults) {
  const auto vocab = data::Vocab::from_text("abc\n");
  serve::ServerOptions limits;
  auto r = serve::parse_completion_request(R"({"prompt": "ab", "max_tokens": 5, "temperature": 0, "stop": ["\n"],
      "n": 2, "logprobs": 3, "echo": true, "stream": true, "seed": 4, "top_p": 0.5, "top_k": 2, "model": "x"})",
                                           vocab, limits);
  EXPECT_EQ(r.prompts, (std::vector<std::vector<int64_t>>{{1, 2}}));
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.temperature, 0.0);
  EXPECT_EQ(r.sampling.top_p, 0.5);
  EXPECT_EQ(r.sampling.top_k, 2);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(*r.logprobs, 3);
  EXPECT_TRUE(r.echo && r.stream);
  EXPECT_EQ(*r.seed, 4u);
  auto d = serve::parse_completion_request(R"({"prompt": ["a", "b"]})", vocab, limits);
  EXPECT_EQ(d.prompts.size(), 2u);
  EXPECT_EQ(d.max_tokens, 16);  // OpenAI's defaults
  EXPECT_EQ(d.sampling.temperature, 1.0);
  EXPECT_FALSE(d.logprobs.has_value());
}

TEST(RequestParsing, EachBadFieldIsA400NamingIt) {
  const auto vocab = data::Vocab::from_text("abc\n");
  serve::ServerOptions limits;
  limits.max_tokens = 100;
  const std::vector<std::pair<std::string, std::string>> cases{
      {R"({"prompt": "ab")", ""},  // invalid JSON
      {R"([1, 2])", ""},
      {R"({})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": ["a", 5]})", "prompt"},
      {R"({"prompt": "abz"})", "prompt"},  // z is not in the vocabulary
      {R"({"prompt": ""})", "prompt"},
      {"{\"prompt\": \"a\\udc00\"}", ""},  // a lone surrogate: not valid JSON
      {R"({"prompt": "a", "temperature": -1})", "temperature"},
      {R"({"prompt": "a", "temperature": "nan"})", "temperature"},
      {R"({"prompt": "a", "temperature": 1e400})", ""},  // out of double's range: not valid JSON for the parser
      {R"({"prompt": "a", "top_p": 0})", "top_p"},
      {R"({"prompt": "a", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "a", "max_tokens": 1e30})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 99999999999999999999999})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 101})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": -1})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": "5"})", "max_tokens"},
      {R"({"prompt": "a", "n": 0})", "n"},
      {R"({"prompt": "a", "logprobs": 6})", "logprobs"},
      {R"({"prompt": "a", "stream": "yes"})", "stream"},
      {R"({"prompt": "a", "stop": 3})", "stop"},
      {R"({"prompt": "a", "stop": ["a", "b", "c", "\n", "ab"]})", "stop"},
      {R"({"prompt": "a", "top_k": -2})", "top_k"},
  };
  for (const auto& [body, field] : cases) {
    try {
      serve::parse_completion_request(body, vocab, limits);
      ADD_FAILURE() << "accepted " << body;
    } catch (const serve::RequestError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.param, field) << body;
      if (!field.empty()) {
        EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      }
      const json b = e.body();
      EXPECT_TRUE(b["error"].contains("message") && b["error"].contains("type") && b["error"].contains("code")) << b;
    }
  }
}

// A request the queue could never hold is refused for good (400 naming --queue), not "retry
// shortly"; a beam search is bounded on its own (--max_beam, --max_beam_tokens: beam x prompts x
// max_tokens), since it holds the model's thread while every stream waits.
TEST(RequestParsing, WhatCouldNeverBeQueuedAndOversizedBeamsAre400) {
  const auto vocab = data::Vocab::from_text("abc\n");
  serve::ServerOptions limits;
  limits.queue = 4;
  limits.max_beam = 3;
  limits.max_beam_tokens = 60;
  const auto refused = [&](const std::string& body) -> serve::RequestError {
    try {
      serve::parse_completion_request(body, vocab, limits);
    } catch (const serve::RequestError& e) {
      return e;
    }
    ADD_FAILURE() << "accepted " << body;
    return serve::RequestError(0, "");
  };
  auto never = refused(R"({"prompt": ["a", "b"], "n": 3})");  // 6 sequences, the queue holds 4
  EXPECT_EQ(never.status, 400);
  EXPECT_EQ(never.param, "n");
  EXPECT_NE(std::string(never.what()).find("6 sequences"), std::string::npos) << never.what();
  EXPECT_NE(std::string(never.what()).find("--queue"), std::string::npos) << never.what();
  EXPECT_EQ(serve::parse_completion_request(R"({"prompt": ["a", "b"], "n": 2})", vocab, limits).n, 2);

  EXPECT_EQ(refused(R"({"prompt": "a", "beam": 4})").param, "beam");
  auto wide = refused(R"({"prompt": ["a", "b"], "beam": 3, "max_tokens": 11})");  // 66 tokens to search
  EXPECT_EQ(wide.status, 400);
  EXPECT_EQ(wide.param, "max_tokens");
  EXPECT_NE(std::string(wide.what()).find("--max_beam_tokens"), std::string::npos) << wide.what();
  EXPECT_EQ(serve::parse_completion_request(R"({"prompt": ["a", "b"], "beam": 3, "max_tokens": 10})", vocab, limits).beam, 3);
  EXPECT_EQ(serve::parse_completion_request(R"({"prompt": "a", "max_tokens": 100})", vocab, limits).max_tokens, 100);
}

TEST(RequestParsing, ApiKeyComparisonIsExact) {
  EXPECT_TRUE(serve::constant_time_equal("secret", "secret"));
  EXPECT_FALSE(serve::constant_time_equal("secreT", "secret"));
  EXPECT_FALSE(serve::constant_time_equal("secret1", "secret"));
  EXPECT_FALSE(serve::constant_time_equal("", "secret"));
  EXPECT_FALSE(serve::constant_time_equal("secret", ""));
}

// ---- The server, end to end ----

// `nanogpt serve --port=0 ARGS` as a child process; the port is read from its start-up line.
class ServerProcess {
 public:
  ServerProcess(const std::string& dir, const std::string& args) : log_(dir + "/serve." + std::to_string(count_++) + ".log") {
    pid_ = fork();
    if (pid_ == 0) {
      const std::string cmd = "exec " + std::string(NANOGPT_BINARY) + " serve --port=0 " + args + " >" + log_ + " 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    const std::regex listening("on http://127\\.0\\.0\\.1:(\\d+) ");
    for (int i = 0; i < 600 && port_ == 0; ++i) {  // up to 60 s (the model loads on a busy machine)
      std::smatch m;
      const std::string text = read_text(log_);
      if (std::regex_search(text, m, listening)) port_ = std::stoi(m[1]);
      else if (exited()) break;
      else std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  std::string log() const { return read_text(log_); }
  /// SIGTERM, then its exit status (waits up to `seconds`; -1 if still running).
  int terminate(double seconds) {
    kill(pid_, SIGTERM);
    for (int i = 0; i < seconds * 100; ++i) {
      if (exited()) return status_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  bool exited() {
    if (done_) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      done_ = true;
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return done_;
  }

 private:
  static inline int count_ = 0;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool done_ = false;
  int status_ = -1;
};

struct Reply {
  int status = 0;
  std::string body, headers;
};

class ServeHttp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (shell("command -v curl >/dev/null 2>&1") != 0) return;
    dir_ = new TempDir("serve");
    const std::string d = dir_->path;
    auto c = tiny_config_on(d, "\u5E8A\u524D\u660E\u6708\u5149\uFF0C\u7591\u662F\u5730\u4E0A\u971C\u3002\n" + tang_poems_head(20000));
    c.max_iters = 60;  // enough for probabilities that differ (the playground's shading)
    c.eval_interval = 30;
    c.lr_decay_iters = 60;
    std::ofstream(d + "/zh.yaml") << train::to_yaml(c);
    train_rc_ = shell(std::string(NANOGPT_BINARY) + " train " + d + "/zh.yaml >" + d + "/train.out 2>&1");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!dir_) GTEST_SKIP() << "no curl on PATH (scripts/setup.sh --tests installs it): the HTTP tests need a client";
    ASSERT_EQ(train_rc_, 0) << read_text(dir_->path + "/train.out");
  }
  static std::string path(const std::string& name) { return dir_->path + "/" + name; }
  // float32: the texts are compared with generate() in this process, which runs without autocast
  static std::string out_dir() { return "--out_dir=" + path("out") + " --num_threads=1 --dtype=float32"; }

  /// curl: METHOD url with `body` (sent from a file, so any bytes go) and extra curl arguments.
  static Reply curl(const std::string& method, const std::string& url, const std::string& body = "",
                    const std::string& extra = "") {
    static int n = 0;
    const std::string stem = path("curl." + std::to_string(n++));
    std::string cmd = "curl -s -S -X " + method + " -D " + stem + ".head -o " + stem + ".body -w '%{http_code}' " + extra;
    if (!body.empty()) {
      std::ofstream(stem + ".req", std::ios::binary) << body;
      cmd += " -H 'Content-Type: application/json' --data-binary @" + stem + ".req";
    }
    cmd += " '" + url + "' >" + stem + ".code 2>" + stem + ".err";
    shell(cmd);
    Reply r;
    const std::string code = read_text(stem + ".code");
    r.status = code.empty() ? 0 : std::atoi(code.c_str());
    r.body = read_text(stem + ".body");
    r.headers = read_text(stem + ".head");
    return r;
  }

  /// The `data:` events of a server-sent-events body, in order ("[DONE]" kept as a string).
  static std::vector<json> events(const std::string& sse) {
    std::vector<json> out;
    std::istringstream in(sse);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("data: ", 0) != 0) continue;
      const std::string payload = line.substr(6);
      out.push_back(payload == "[DONE]" ? json("[DONE]") : json::parse(payload));
    }
    return out;
  }

  /// POST `request` to /v1/completions streamed (stream: true, curl -N): its events, checked to be
  /// an event stream of at least one event ending in data: [DONE].
  static std::vector<json> streamed_events(const ServerProcess& server, json request) {
    request["stream"] = true;
    auto sse = curl("POST", server.url("/v1/completions"), request.dump(), "-N");
    EXPECT_EQ(sse.status, 200) << sse.body;
    EXPECT_NE(sse.headers.find("text/event-stream"), std::string::npos) << sse.headers;
    auto ev = events(sse.body);
    EXPECT_GE(ev.size(), 2u) << sse.body;
    if (!ev.empty()) {
      EXPECT_EQ(ev.back(), json("[DONE]")) << sse.body;
    }
    return ev;
  }

  static TempDir* dir_;
  static int train_rc_;
};

TempDir* ServeHttp::dir_ = nullptr;
int ServeHttp::train_rc_ = -1;

const std::string kPrompt = "\u5E8A\u524D\u660E\u6708\u5149";  // 床前明月光

// --stream_interval joins the tokens that come faster than it: with a second between events, a
// 30-token greedy stream of this small model (a few milliseconds of work) arrives as its first
// event, one more with the rest and the finish, and [DONE], and is still the whole text. The end
// does not wait out the interval: the stream is over well within the second (waiting, it would
// take two). A negative interval is one error line.
TEST_F(ServeHttp, TokensFasterThanTheStreamIntervalShareAnEvent) {
  ServerProcess server(dir_->path, out_dir() + " --stream_interval=1000");
  ASSERT_GT(server.port(), 0) << server.log();
  const json request{{"prompt", kPrompt}, {"max_tokens", 30}, {"temperature", 0}};
  auto plain = curl("POST", server.url("/v1/completions"), request.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const auto start = std::chrono::steady_clock::now();
  const auto ev = streamed_events(server, request);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0) << "the stream waited for its interval after the last token";
  ASSERT_GE(ev.size(), 2u);
  EXPECT_LE(ev.size(), 3u);  // the first token, the rest with the finish, then [DONE]
  std::string text;
  for (size_t i = 0; i + 1 < ev.size(); ++i) text += ev[i]["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, json::parse(plain.body)["choices"][0]["text"].get<std::string>());

  const auto bad = run_nanogpt("serve " + out_dir() + " --stream_interval=-1", dir_->path);
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--stream_interval (-1)"), std::string::npos) << bad.err;
}

// A greedy completion over HTTP is generate()'s text for the prompt; streamed, it arrives as whole
// characters in events ending in data: [DONE], and is the same text.
TEST_F(ServeHttp, CompletionsMatchGenerateStreamedAndNot) {
  ServerProcess server(dir_->path, out_dir());
  ASSERT_GT(server.port(), 0) << server.log();
  auto loaded = train::load_model(train::resolve_checkpoint(path("out")));
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  std::mt19937_64 rng(0);
  const auto prompt = loaded.vocab.encode(kPrompt);
  auto tokens = model::generate(loaded.model, prompt, 1, 40, greedy, rng)[0];
  const std::string expected = loaded.vocab.decode(std::vector<int64_t>(tokens.begin() + prompt.size(), tokens.end()));

  const json request{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 2}};
  auto plain = curl("POST", server.url("/v1/completions"), request.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json j = json::parse(plain.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], expected);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 40);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  const auto& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 40u);
  for (size_t i = 0; i < 40; ++i) {  // greedy: each token is the likeliest, with the top alternative's log-probability
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), lp["top_logprobs"][i][lp["tokens"][i].get<std::string>()].get<double>(), 1e-9);
  }

  const auto ev = streamed_events(server, request);
  ASSERT_GE(ev.size(), 2u);
  std::string text;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    const std::string piece = ev[i]["choices"][0]["text"];
    EXPECT_NO_THROW(loaded.vocab.encode(piece)) << "event " << i << " is not whole characters";
    text += piece;
  }
  EXPECT_EQ(text, expected);
  EXPECT_EQ(ev[ev.size() - 2]["choices"][0]["finish_reason"], "length");

  // stop strings end the text before them; echo puts the prompt in front
  const std::string first = expected.substr(0, expected.find('\n') == std::string::npos ? 0 : expected.find('\n'));
  auto stopped = curl("POST", server.url("/v1/completions"),
                      json{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}, {"stop", "\n"}, {"echo", true}}.dump());
  ASSERT_EQ(stopped.status, 200) << stopped.body;
  const json s = json::parse(stopped.body);
  if (expected.find('\n') != std::string::npos) {
    EXPECT_EQ(s["choices"][0]["text"], kPrompt + first);
    EXPECT_EQ(s["choices"][0]["finish_reason"], "stop");
  }
  auto models = curl("GET", server.url("/v1/models"));
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["object"], "model");
  auto tok = curl("POST", server.url("/tokenize"), json{{"content", kPrompt}}.dump());
  ASSERT_EQ(tok.status, 200) << tok.body;
  EXPECT_EQ(json::parse(tok.body)["tokens"].get<std::vector<int64_t>>(), prompt);
  auto detok = curl("POST", server.url("/detokenize"), json{{"tokens", prompt}}.dump());
  EXPECT_EQ(json::parse(detok.body)["content"], kPrompt);
  auto metrics = curl("GET", server.url("/metrics"));
  EXPECT_NE(metrics.body.find("nanogpt_generated_tokens_total"), std::string::npos);
  EXPECT_NE(metrics.body.find("nanogpt_time_to_first_token_seconds_bucket"), std::string::npos);
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// A subword model spells characters its vocabulary lacks in byte pieces, so a token can end inside a
// character: every streamed event still holds whole characters (the unfinished bytes wait for the
// rest), the events add up to the plain reply's text, and every body is JSON.
TEST_F(ServeHttp, ABpeModelStreamsWholeCharactersWhenBytePiecesSplitThem) {
  const std::string d = path("bpe");
  auto c = tiny_config_on(d, tang_poems_head(30000));
  c.max_iters = 20;
  c.eval_interval = 20;
  c.lr_decay_iters = 20;
  c.tokenizer = "bpe";
  c.vocab_size = 300;  // far fewer pieces than the poems have characters: most are spelt in bytes
  std::ofstream(d + "/bpe.yaml") << train::to_yaml(c);
  ASSERT_EQ(shell(std::string(NANOGPT_BINARY) + " train " + d + "/bpe.yaml >" + d + "/train.out 2>&1"), 0)
      << read_text(d + "/train.out");
  ServerProcess server(d, "--out_dir=" + d + "/out --num_threads=1 --dtype=float32");
  ASSERT_GT(server.port(), 0) << server.log();
  int split_characters = 0;  // tokens that were not whole characters
  for (int seed = 1; seed <= 3; ++seed) {
    const json request{{"prompt", kPrompt + "\U0001F600"}, {"max_tokens", 60}, {"temperature", 1.0}, {"seed", seed}, {"logprobs", 1}};
    auto plain = curl("POST", server.url("/v1/completions"), request.dump());
    ASSERT_EQ(plain.status, 200) << plain.body;
    const json j = json::parse(plain.body);
    const std::string text = j["choices"][0]["text"];
    for (const auto& token : j["choices"][0]["logprobs"]["tokens"])
      split_characters += token.get<std::string>().find("\uFFFD") != std::string::npos;
    const auto ev = streamed_events(server, request);
    ASSERT_GE(ev.size(), 2u);
    std::string joined;
    for (size_t i = 0; i + 1 < ev.size(); ++i) {
      const std::string piece = ev[i]["choices"][0]["text"];
      EXPECT_NO_THROW(data::decode_utf8(piece)) << "event " << i;
      joined += piece;
    }
    // Bytes the model leaves that never make a character are U+FFFD in both forms; a character cut
    // between two events would be U+FFFD in the stream only.
    EXPECT_EQ(joined, text) << "seed " << seed;
  }
  EXPECT_GT(split_characters, 0) << "no token ended inside a character: the test did not test";
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// A request's greedy text is the same alone or beside others streaming at the same time.
TEST_F(ServeHttp, GreedyTextIsTheSameAloneOrBesideOthers) {
  // --dtype=auto: bfloat16 where the CPU has it, so the batched bf16 products are checked too
  ServerProcess server(dir_->path, out_dir() + " --parallel=8 --dtype=auto");
  ASSERT_GT(server.port(), 0) << server.log();
  const json greedy{{"prompt", kPrompt}, {"max_tokens", 60}, {"temperature", 0}};
  auto alone = curl("POST", server.url("/v1/completions"), greedy.dump());
  ASSERT_EQ(alone.status, 200) << alone.body;
  std::vector<std::future<Reply>> others;
  for (int i = 0; i < 5; ++i)  // sampled, of other lengths and prompts, joining around it
    others.push_back(std::async(std::launch::async, [&, i] {
      return curl("POST", server.url("/v1/completions"),
                  json{{"prompt", i % 2 ? "\u660E\u6708" : "\u5E8A"}, {"max_tokens", 30 + 20 * i}, {"stream", true},
                       {"seed", i}}.dump(), "-N");
    }));
  auto beside = curl("POST", server.url("/v1/completions"), greedy.dump());
  for (auto& o : others) EXPECT_EQ(o.get().status, 200);
  ASSERT_EQ(beside.status, 200) << beside.body;
  EXPECT_EQ(json::parse(beside.body)["choices"][0]["text"], json::parse(alone.body)["choices"][0]["text"]);
  // A seeded sampled request is reproducible too, batched or not.
  const json seeded{{"prompt", kPrompt}, {"max_tokens", 30}, {"temperature", 0.9}, {"seed", 42}, {"n", 3}};
  auto a = json::parse(curl("POST", server.url("/v1/completions"), seeded.dump()).body);
  auto b = json::parse(curl("POST", server.url("/v1/completions"), seeded.dump()).body);
  EXPECT_EQ(a["choices"], b["choices"]);
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// Every kind of bad input gets a 4xx with OpenAI's error body naming the field; the server keeps serving.
TEST_F(ServeHttp, BadInputGets4xxNamingTheFieldAndServingGoesOn) {
  ServerProcess server(dir_->path, out_dir() + " --max_tokens=500");
  ASSERT_GT(server.port(), 0) << server.log();
  const std::string url = server.url("/v1/completions");
  const std::vector<std::tuple<std::string, int, std::string>> cases{
      {"{\"prompt\": ", 400, ""},                                                  // invalid JSON
      {R"({"prompt": 12})", 400, "prompt"},                                        // wrong type
      {R"({"prompt": "hello"})", 400, "prompt"},                                   // outside the vocabulary
      {R"({"prompt": "床", "temperature": NaN})", 400, ""},                         // NaN is not JSON
      {R"({"prompt": "床", "temperature": "NaN"})", 400, "temperature"},
      {R"({"prompt": "床", "temperature": -0.5})", 400, "temperature"},
      {R"({"prompt": "床", "top_p": 0})", 400, "top_p"},
      {R"({"prompt": "床", "top_p": 1.01})", 400, "top_p"},
      {R"({"prompt": "床", "max_tokens": 1e300})", 400, "max_tokens"},
      {R"({"prompt": "床", "max_tokens": 501})", 400, "max_tokens"},
      {R"({"prompt": "床", "n": 1000000})", 400, "n"},
      {R"({"prompt": "床", "beam": 9})", 400, "beam"},          // beyond --max_n
      {R"({"prompt": "床", "beam": "4"})", 400, "beam"},
      {R"({"prompt": "床", "beam": 2, "n": 3})", 400, "n"},      // more choices than beams
      {R"({"prompt": "床", "beam": 2, "logprobs": 1})", 400, "logprobs"},
  };
  for (const auto& [body, status, field] : cases) {
    auto r = curl("POST", url, body);
    EXPECT_EQ(r.status, status) << body << " -> " << r.body;
    const json e = json::parse(r.body, nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << r.body;
    EXPECT_TRUE(e["error"].contains("message") && e["error"].contains("type") && e["error"].contains("code")) << r.body;
    if (!field.empty()) {
      EXPECT_EQ(e["error"]["param"], field) << r.body;
    }
    EXPECT_EQ(curl("GET", server.url("/health")).status, 200) << "after " << body;
  }
  // a 100 MB body: refused from its length (413), whole or streamed in
  {
    std::ofstream big(path("big.json"), std::ios::binary);
    big << R"({"prompt": ")";
    const std::string chunk(1 << 20, 'a');
    for (int i = 0; i < 100; ++i) big << chunk;
    big << "\"}";
  }
  auto big = curl("POST", url, "", "-H 'Content-Type: application/json' --data-binary @" + path("big.json"));
  EXPECT_EQ(big.status, 413) << big.body;
  EXPECT_NE(big.body.find("too large"), std::string::npos) << big.body;
  auto missing = curl("GET", server.url("/v2/nothing"));
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(curl("POST", server.url("/tokenize"), R"({"content": "hello"})").status, 400);
  EXPECT_EQ(curl("POST", server.url("/detokenize"), R"({"tokens": [-1]})").status, 400);
  const std::string too_long(3 * 16, 'x');  // the test model's block_size is 16
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"completion": "床"})", "prompt"},
           {R"({"prompt": ""})", "prompt"},
           {R"({"prompt": "hello"})", "prompt"},
           {R"({"prompt": "床", "completion": 7})", "completion"},
           {json{{"prompt", "床"}, {"completion", std::string(20 * 3, ' ')}}.dump(), "completion"},
           {R"({"prompt": "床", "format": "xml"})", "format"},
           {R"({"prompt": "床", "truncate": "yes"})", "truncate"}}) {
    auto r = curl("POST", server.url("/v1/attention"), body);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    EXPECT_EQ(json::parse(r.body, nullptr, false)["error"]["param"], field) << body << " -> " << r.body;
  }
  auto ok = curl("POST", url, json{{"prompt", kPrompt}, {"max_tokens", 5}}.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// With a key every endpoint but /health (and the page) needs it. A full queue is 503 with
// Retry-After, and the request fits once the queue has room; a queue that could not hold a whole
// request within the limits (--max_n x --max_prompts) is refused at start-up.
TEST_F(ServeHttp, ApiKeyAndFullQueue) {
  // (bounded: a server that starts would serve for ever)
  const auto small = shell_captured("timeout 60 " + std::string(NANOGPT_BINARY) + " serve --port=0 " + out_dir() + " --queue=2",
                                    dir_->path);
  EXPECT_NE(small.rc, 0);
  EXPECT_NE(small.err.find("--queue (2)"), std::string::npos) << small.err;
  EXPECT_NE(small.err.find("--max_prompts"), std::string::npos) << small.err;
  std::ofstream(path("key.txt")) << "s3cret\n";
  ServerProcess server(dir_->path, out_dir() + " --api_key_file=" + path("key.txt") +
                                       " --parallel=1 --queue=2 --max_n=2 --max_prompts=1 --max_tokens=100000000");
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_EQ(curl("GET", server.url("/health")).status, 200);
  auto refused = curl("GET", server.url("/v1/models"));
  EXPECT_EQ(refused.status, 401);
  EXPECT_EQ(json::parse(refused.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(curl("GET", server.url("/v1/models"), "", "-H 'Authorization: Bearer wrong'").status, 401);
  EXPECT_EQ(curl("GET", server.url("/metrics")).status, 401);
  const std::string key = "-H 'Authorization: Bearer s3cret'";
  EXPECT_EQ(curl("GET", server.url("/v1/models"), "", key).status, 200);
  const auto metrics_show = [&](const std::string& line) {  // waits until /metrics has `line`
    for (int i = 0; i < 6000; ++i) {
      if (curl("GET", server.url("/metrics"), "", key).body.find(line + "\n") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  // The slot: a stream of hours of tokens, in a curl of its own, stopped below.
  std::ofstream(path("endless.json")) << json{{"prompt", kPrompt}, {"max_tokens", 100000000}, {"stream", true}}.dump();
  const auto endless = start({"curl", "-s", "-N", "-o", "/dev/null", "-H", "Authorization: Bearer s3cret", "-H", "Content-Type: application/json",
                               "--data-binary", "@" + path("endless.json"), server.url("/v1/completions")},
                              {}, path("endless"));
  ASSERT_TRUE(metrics_show("nanogpt_busy_slots 1"));
  auto waiting = std::async(std::launch::async, [&] {  // two sequences: the queue is full
    return curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"n", 2}, {"max_tokens", 5}}.dump(), key);
  });
  ASSERT_TRUE(metrics_show("nanogpt_queue_depth 2"));
  auto full = curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"max_tokens", 5}}.dump(), key);
  EXPECT_EQ(full.status, 503) << full.body;
  EXPECT_NE(full.headers.find("Retry-After"), std::string::npos) << full.headers;
  EXPECT_EQ(json::parse(full.body)["error"]["code"], "queue_full") << full.body;
  kill(endless.pid, SIGTERM);  // the stream's client hangs up: its slot frees, the waiting request runs
  wait_for(endless);
  EXPECT_EQ(waiting.get().status, 200);
  EXPECT_EQ(curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"n", 2}}.dump(), key).status, 200);
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// A subword model's pieces hold several characters, so a stop string can start inside a token:
// the reply's text ends before it, and its tokens are every one the text has a part of (those of the
// same request without the stop, up to the one the stop starts in), each text_offset where the token
// starts; streamed, the events' tokens and offsets are the same and their texts add up to the text.
TEST_F(ServeHttp, ABpeModelsTokensAndOffsetsFollowTheTextToAStopString) {
  const std::string d = path("bpe_words");
  auto c = tiny_config(d);  // tiny Shakespeare
  c.eval_interval = 20;
  c.tokenizer = "bpe";
  c.vocab_size = 400;  // English: pieces of several letters
  std::ofstream(d + "/bpe.yaml") << train::to_yaml(c);
  ASSERT_EQ(shell(std::string(NANOGPT_BINARY) + " train " + d + "/bpe.yaml >" + d + "/train.out 2>&1"), 0)
      << read_text(d + "/train.out");
  ServerProcess server(d, "--out_dir=" + d + "/out --num_threads=1 --dtype=float32");
  ASSERT_GT(server.port(), 0) << server.log();
  int tested = 0;
  for (int seed = 1; seed <= 5 && tested < 2; ++seed) {
    json request{{"prompt", "ROMEO:"}, {"max_tokens", 60}, {"temperature", 1.0}, {"seed", seed}, {"logprobs", 1}};
    const json whole = json::parse(curl("POST", server.url("/v1/completions"), request.dump()).body)["choices"][0];
    const std::string text = whole["text"];
    const auto& tokens = whole["logprobs"]["tokens"];
    // A stop string that starts on the last letter of a piece of several, found nowhere before; in
    // ASCII text (a byte piece the model drew is U+FFFD in the token list, 3 bytes for its 1).
    size_t at = 0, k = 0, stop_at = std::string::npos;
    std::string stop;
    const auto ascii = [](const std::string& t) { return std::all_of(t.begin(), t.end(), [](char ch) { return ch > 0; }); };
    for (; k < tokens.size() && stop_at == std::string::npos; at += tokens[k++].get<std::string>().size()) {
      const size_t size = tokens[k].get<std::string>().size();
      if (!ascii(tokens[k].get<std::string>())) break;
      if (size < 2 || at + size + 2 > text.size()) continue;
      stop = text.substr(at + size - 1, 3);
      if (ascii(stop) && text.find(stop) == at + size - 1) stop_at = at + size - 1;
    }
    if (stop_at == std::string::npos) continue;
    ++tested;
    request["stop"] = stop;
    const json stopped = json::parse(curl("POST", server.url("/v1/completions"), request.dump()).body)["choices"][0];
    EXPECT_EQ(stopped["text"], text.substr(0, stop_at)) << "stop " << json(stop);
    EXPECT_EQ(stopped["finish_reason"], "stop");
    const json expected_tokens(std::vector<json>(tokens.begin(), tokens.begin() + static_cast<int64_t>(k)));
    const json expected_offsets(std::vector<json>(whole["logprobs"]["text_offset"].begin(),
                                                  whole["logprobs"]["text_offset"].begin() + static_cast<int64_t>(k)));
    EXPECT_EQ(stopped["logprobs"]["tokens"], expected_tokens) << "stop " << json(stop);
    EXPECT_EQ(stopped["logprobs"]["text_offset"], expected_offsets);
    size_t offset = 0;  // the offsets are where each token starts
    for (size_t i = 0; i < k; ++i) {
      EXPECT_EQ(whole["logprobs"]["text_offset"][i], offset) << "token " << i;
      offset += tokens[i].get<std::string>().size();
    }
    const auto ev = streamed_events(server, request);
    std::string joined;
    json streamed_tokens = json::array(), streamed_offsets = json::array();
    for (size_t i = 0; i + 1 < ev.size(); ++i) {
      const json& choice = ev[i]["choices"][0];
      joined += choice["text"].get<std::string>();
      for (const auto& t : choice["logprobs"]["tokens"]) streamed_tokens.push_back(t);
      for (const auto& o : choice["logprobs"]["text_offset"]) streamed_offsets.push_back(o);
    }
    EXPECT_EQ(joined, stopped["text"]);
    EXPECT_EQ(streamed_tokens, expected_tokens);
    EXPECT_EQ(streamed_offsets, expected_offsets);
  }
  EXPECT_GT(tested, 0) << "no piece of several letters was followed by a stop string found nowhere before it";
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// A client that hangs up, streamed or not, frees its slot: with one slot, the next request is served at once.
TEST_F(ServeHttp, ClientHangingUpFreesItsSlot) {
  ServerProcess server(dir_->path, out_dir() + " --parallel=1 --max_tokens=100000000");
  ASSERT_GT(server.port(), 0) << server.log();
  for (const bool stream : {true, false}) {
    // hours of tokens, cut after a second by curl's --max-time
    curl("POST", server.url("/v1/completions"),
         json{{"prompt", kPrompt}, {"max_tokens", 100000000}, {"stream", stream}}.dump(), "-N --max-time 1");
    const auto t0 = std::chrono::steady_clock::now();
    auto next = curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"max_tokens", 5}}.dump(),
                     "--max-time 60");
    EXPECT_EQ(next.status, 200) << (stream ? "streamed: " : "not streamed: ") << next.body;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  }
  auto metrics = curl("GET", server.url("/metrics")).body;
  EXPECT_NE(metrics.find("nanogpt_busy_slots 0"), std::string::npos) << metrics;
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// The extension field beam: the choices are model::beam_search's best beams for the prompt, in
// order, streamed or not; POST /v1/attention gives the model's attention_maps for a text, as JSON
// (the explorer's data) or as the explorer page, and keeps the last block_size characters when asked.
TEST_F(ServeHttp, BeamAndAttentionMatchTheLibrary) {
  ServerProcess server(dir_->path, out_dir());
  ASSERT_GT(server.port(), 0) << server.log();
  auto loaded = train::load_model(train::resolve_checkpoint(path("out")));
  const auto prompt = loaded.vocab.encode(kPrompt);
  model::BeamOptions width3;
  width3.width = 3;
  const auto beams = model::beam_search(loaded.model, prompt, 9, width3);
  ASSERT_EQ(beams.size(), 3u);
  const auto text_of = [&](const model::Beam& b) {
    return loaded.vocab.decode(std::vector<int64_t>(b.tokens.begin() + static_cast<int64_t>(prompt.size()), b.tokens.end()));
  };
  const json request{{"prompt", kPrompt}, {"max_tokens", 9}, {"beam", 3}, {"n", 2}};
  auto plain = curl("POST", server.url("/v1/completions"), request.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json j = json::parse(plain.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(j["choices"][i]["text"], text_of(beams[i])) << "beam " << i;
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 18);
  json streamed = request;
  streamed["stream"] = true;
  auto ev = events(curl("POST", server.url("/v1/completions"), streamed.dump(), "-N").body);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev.back(), json("[DONE]"));
  for (size_t e = 0; e < 2; ++e)
    EXPECT_EQ(ev[e]["choices"][0]["text"], text_of(beams[ev[e]["choices"][0]["index"].get<size_t>()]));

  // attention: the weights of attention_maps over prompt + completion (the lower triangle, 4 decimals)
  const std::string completion = text_of(beams[0]);
  auto att = curl("POST", server.url("/v1/attention"), json{{"prompt", kPrompt}, {"completion", completion}}.dump());
  ASSERT_EQ(att.status, 200) << att.body;
  const json a = json::parse(att.body);
  std::vector<int64_t> ids = beams[0].tokens;
  const auto T = static_cast<int64_t>(ids.size());
  ASSERT_EQ(a["tokens"].size(), static_cast<size_t>(T));
  EXPECT_EQ(a["prompt"], prompt.size());
  const auto maps = loaded.model->attention_maps(torch::tensor(ids, torch::kLong).view({1, T}));
  ASSERT_EQ(a["layers"].size(), maps.size());
  for (size_t l = 0; l < maps.size(); ++l) {
    ASSERT_EQ(a["layers"][l].size(), static_cast<size_t>(maps[l].size(1)));
    for (int64_t h = 0; h < maps[l].size(1); ++h)
      for (int64_t q = 0; q < T; ++q)
        for (int64_t k = 0; k <= q; ++k)
          ASSERT_NEAR(a["layers"][l][h][q * (q + 1) / 2 + k].get<double>(), maps[l][0][h][q][k].item<double>(), 6e-5)
              << "layer " << l << " head " << h << " query " << q << " key " << k;
  }
  // the explorer page, with the same data
  auto page = curl("POST", server.url("/v1/attention"), json{{"prompt", kPrompt}, {"completion", completion}, {"format", "html"}}.dump());
  ASSERT_EQ(page.status, 200);
  EXPECT_NE(page.headers.find("text/html"), std::string::npos);
  EXPECT_NE(page.body.find("attentionExplorer"), std::string::npos);
  EXPECT_NE(page.body.find(a["layers"][0][0].dump().substr(0, 40)), std::string::npos);
  // truncate: the last block_size (16) characters, the prompt's share what is left of it (at least 1)
  const std::string longer = completion + completion;  // 5 + 18 characters
  auto cut = curl("POST", server.url("/v1/attention"), json{{"prompt", kPrompt}, {"completion", longer}, {"truncate", true}}.dump());
  ASSERT_EQ(cut.status, 200) << cut.body;
  const json c = json::parse(cut.body);
  EXPECT_EQ(c["tokens"].size(), 16u);
  EXPECT_EQ(c["dropped"], 7);
  EXPECT_EQ(c["prompt"], 1);
  std::string window;
  for (const auto& t : c["tokens"]) window += t.get<std::string>();
  const auto all = loaded.vocab.encode(kPrompt + longer);
  EXPECT_EQ(loaded.vocab.encode(window), std::vector<int64_t>(all.end() - 16, all.end()));
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// A few seconds of scripts/serve_load.py (streams read to the end, slow readers, clients hanging
// up or resetting mid-stream, beams, bad and idle requests): afterwards the server holds as many
// file descriptors and threads as before, no busy slot and an empty queue, and still serves.
TEST_F(ServeHttp, ShortLoadLeaksNoSlotThreadOrDescriptor) {
  const std::string python = std::string(NANOGPT_PYTHON).empty() ? "python3" : NANOGPT_PYTHON;
  if (shell(python + " -c 'import json' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python to run scripts/serve_load.py";
  const std::string cmd = python + " " + NANOGPT_SOURCE_DIR + "/scripts/serve_load.py --nanogpt=" + NANOGPT_BINARY +
                          " --out_dir=" + path("out") + " --seconds=4 --warmup=2 --clients=8 --parallel=4 --timeout=2 --no_rss" +
                          " --log=" + path("load.log") + " -- --num_threads=1 >" + path("load.out") + " 2>&1";
  const int rc = shell(cmd);
  const std::string out = read_text(path("load.out"));
  EXPECT_EQ(rc, 0) << out << read_text(path("load.log")).substr(0, 3000);
  EXPECT_NE(out.find("[load] no leak"), std::string::npos) << out;
  EXPECT_NE(out.find("\"stream:ok\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"hangup:ok\""), std::string::npos) << out;
}

// scripts/serve_bench.py parses the streams itself (chunked transfer, server-sent events): against a
// running server, every request of 1 and of 3 clients is counted, with all its tokens (this model's
// tokens are characters, and a stream without a stop string runs to max_tokens).
TEST_F(ServeHttp, TheBenchmarkScriptCountsEveryStreamedToken) {
  const std::string python = std::string(NANOGPT_PYTHON).empty() ? "python3" : NANOGPT_PYTHON;
  if (shell(python + " -c 'import json' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python to run scripts/serve_bench.py";
  ServerProcess server(dir_->path, out_dir());
  ASSERT_GT(server.port(), 0) << server.log();
  const std::string cmd = python + " " + NANOGPT_SOURCE_DIR + "/scripts/serve_bench.py " + server.url("") +
                          " --clients 1,3 --tokens 25 --requests-per-client 2 >" + path("bench.out") + " 2>&1";
  const int rc = shell(cmd);
  const std::string out = read_text(path("bench.out"));
  ASSERT_EQ(rc, 0) << out;
  for (const int clients : {1, 3}) {
    const std::string row = "| " + std::to_string(clients) + " | " + std::to_string(2 * clients) + " | 0 | " +
                            std::to_string(2 * clients * 25) + " | ";
    EXPECT_NE(out.find(row), std::string::npos) << "no row starting " << row << " in\n" << out;
  }
  EXPECT_EQ(server.terminate(20), 0) << server.log();
}

// SIGTERM: the stream in flight gets a final event and [DONE], new requests are refused, exit 0.
TEST_F(ServeHttp, SigtermEndsStreamsWithAFinalEventAndExitsZero) {
  ServerProcess server(dir_->path, out_dir() + " --max_tokens=100000000");
  ASSERT_GT(server.port(), 0) << server.log();
  auto stream = std::async(std::launch::async, [&] {
    return curl("POST", server.url("/v1/completions"),
                json{{"prompt", kPrompt}, {"max_tokens", 100000000}, {"stream", true}}.dump(), "-N --max-time 60");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(server.terminate(20), 0) << server.log();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  auto r = stream.get();
  EXPECT_EQ(r.status, 200);
  auto ev = events(r.body);
  ASSERT_GE(ev.size(), 2u) << r.body.substr(0, 500);
  EXPECT_EQ(ev.back(), json("[DONE]"));
  EXPECT_EQ(ev[ev.size() - 2]["choices"][0]["finish_reason"], "abort");
  EXPECT_NE(server.log().find("[serve] stopped"), std::string::npos) << server.log();
}

// The openai Python client, streamed and not (tests/serve_openai_client.py).
TEST_F(ServeHttp, OpenAIPythonClient) {
  const std::string python = NANOGPT_PYTHON;
  if (python.empty() || shell(python + " -c 'import openai' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "the openai package is not importable from " << (python.empty() ? "(no python)" : python)
                 << " (scripts/setup.sh --tests installs it)";
  ServerProcess server(dir_->path, out_dir() + " --api_key=k3y");
  ASSERT_GT(server.port(), 0) << server.log();
  const std::string cmd = python + " " + NANOGPT_SOURCE_DIR + "/tests/serve_openai_client.py " + server.url("/v1") +
                          " k3y >" + path("openai.out") + " 2>&1";
  EXPECT_EQ(shell(cmd), 0) << read_text(path("openai.out"));
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// The playground page in headless Chromium: the prompt 床前明月光 filled in (from the address, as if
// typed), the greedy text streamed into the page, each character shaded by the probability the
// API's logprobs give it; beside it the beam column holds the API's beam result, and the attention
// explorer below shows the greedy text (its last block_size characters) with the API's weights.
TEST_F(ServeHttp, PlaygroundStreamsShadesBeamsAndExploresAttention) {
  std::string browser;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    if (browser.empty() && shell(std::string("command -v ") + name + " >/dev/null 2>&1") == 0) browser = name;
  if (browser.empty()) GTEST_SKIP() << "no chromium on PATH (scripts/setup.sh --tests installs it): browser check skipped";
  ServerProcess server(dir_->path, out_dir());
  ASSERT_GT(server.port(), 0) << server.log();
  std::string encoded;
  for (unsigned char c : kPrompt) encoded += fmt_percent(c);
  const std::string page = server.url("/") + "#prompt=" + encoded + "&max_tokens=20&temperature=0&beam=3&run";
  const std::string flags = " --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=30000 "
                            "--user-data-dir=" + path("chromium-profile") + " ";
  // The page sets <body data-done="1"> when the three columns and the explorer have finished (or
  // data-error). Virtual time stops for a pending fetch, but not always between one request's end and
  // the next one's start on a loaded machine, so Chromium may dump the page early: load it again then.
  std::string dom;
  for (int attempt = 0; attempt < 4; ++attempt) {
    ASSERT_EQ(shell(browser + flags + "--dump-dom '" + page + "' >" + path("dom.html") + " 2>/dev/null"), 0);
    dom = read_text(path("dom.html"));
    const size_t open = dom.find("<body");
    ASSERT_NE(open, std::string::npos) << dom.substr(0, 2000);
    const std::string body = dom.substr(open, dom.find('>', open) - open);
    ASSERT_EQ(body.find("data-error"), std::string::npos) << body;
    if (body.find("data-done=\"1\"") != std::string::npos) break;
    std::cerr << "the page was dumped before it finished (attempt " << attempt + 1 << "): loading it again\n";
  }
  const size_t begin = dom.find("id=\"greedy\"");
  ASSERT_NE(begin, std::string::npos) << dom.substr(0, 2000);
  const std::string column = dom.substr(begin, dom.find("</div>", begin) - begin);
  EXPECT_NE(column.find("data-done=\"1\""), std::string::npos) << "the stream did not finish: " << column;
  // <span class="tok" data-p="P" data-tip="..." style="background-color: rgba(255, 140, 0, A);">TEXT</span>
  // (alpha 1 is serialised as rgb(...); a tip's quotes as &quot;)
  const std::regex span("<span class=\"tok\" data-p=\"([0-9.]+)\" data-tip=\"[^\"]*\" "
                        "style=\"background-color: rgba?\\(255, 140, 0(?:, ([0-9.]+))?\\);?\">([^<]*)</span>");
  std::vector<std::tuple<double, double, std::string>> shown;
  for (auto it = std::sregex_iterator(column.begin(), column.end(), span); it != std::sregex_iterator(); ++it)
    shown.emplace_back(std::stod((*it)[1]), (*it)[2].matched ? std::stod((*it)[2]) : 1.0, (*it)[3]);
  auto api = curl("POST", server.url("/v1/completions"),
                  json{{"prompt", kPrompt}, {"max_tokens", 20}, {"temperature", 0}, {"logprobs", 0}}.dump());
  ASSERT_EQ(api.status, 200) << api.body;
  const json lp = json::parse(api.body)["choices"][0]["logprobs"];
  ASSERT_EQ(shown.size(), lp["tokens"].size()) << column;
  for (size_t i = 0; i < shown.size(); ++i) {
    const double p = std::exp(lp["token_logprobs"][i].get<double>());
    EXPECT_EQ(std::get<2>(shown[i]), html_escaped(lp["tokens"][i].get<std::string>())) << "token " << i;
    EXPECT_NEAR(std::get<0>(shown[i]), p, 1e-5) << "token " << i;
    EXPECT_NEAR(std::get<1>(shown[i]), 1 - p, 5e-3) << "token " << i;  // the shading: darker when less likely
  }

  // the beam column: the API's best beam (width 3)
  auto beam = curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"max_tokens", 20}, {"beam", 3}}.dump());
  ASSERT_EQ(beam.status, 200) << beam.body;
  const size_t beamed = dom.find("id=\"beamed\"");
  ASSERT_NE(beamed, std::string::npos);
  std::smatch m;
  const std::string beam_column = dom.substr(beamed, dom.find("</div>", beamed) - beamed);
  ASSERT_TRUE(std::regex_search(beam_column, m, std::regex("<span class=\"beam\">([^<]*)</span>"))) << beam_column;
  EXPECT_EQ(m[1].str(), html_escaped(json::parse(beam.body)["choices"][0]["text"].get<std::string>()));

  // the explorer: the last 16 characters of prompt + greedy text, each with the API's weight for the last one
  const std::string greedy_text = json::parse(api.body)["choices"][0]["text"];
  auto att = curl("POST", server.url("/v1/attention"),
                  json{{"prompt", kPrompt}, {"completion", greedy_text}, {"truncate", true}}.dump());
  ASSERT_EQ(att.status, 200) << att.body;
  const json a = json::parse(att.body);
  std::string expected_text;  // as the explorer shows whitespace, and as Chromium writes an attribute
  for (const auto& t : a["tokens"]) {
    const std::string token = t;
    expected_text += token == "\n" ? "\u23CE\n" : token == "\t" ? "\u21E5" : token == "&" ? "&amp;" : token == "\"" ? "&quot;" : token;
  }
  ASSERT_TRUE(std::regex_search(dom, m, std::regex("id=\"explore-status\"[^>]* data-text=\"([^\"]*)\" data-weights=\"([^\"]*)\" data-done=\"1\"")))
      << dom.substr(dom.find("explore-status"), 600);
  EXPECT_EQ(m[1].str(), expected_text);
  std::vector<double> weights;
  std::stringstream list(m[2].str());
  for (std::string w; std::getline(list, w, ',');) weights.push_back(std::stod(w));
  const auto T = a["tokens"].size();
  ASSERT_EQ(weights.size(), T);
  for (size_t k = 0; k < T; ++k)  // layer 0, head 0, the last token's row
    EXPECT_NEAR(weights[k], a["layers"][0][0][(T - 1) * T / 2 + k].get<double>(), 1e-4) << "key " << k;
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

}  // namespace

// ---- The front door: what no client can make the server do ----

// A connection to 127.0.0.1:port with send and receive timeouts of `seconds`; -1 when refused.
int connect_to(int port, double seconds = 10.0) {
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{static_cast<time_t>(seconds), static_cast<suseconds_t>((seconds - static_cast<time_t>(seconds)) * 1e6)};
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(sock, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(sock);
    return -1;
  }
  return sock;
}

// What the server sends on `sock` until it closes the connection or stays silent for the socket's timeout.
std::string read_reply(int sock) {
  std::string reply;
  char buffer[4096];
  for (ssize_t n; (n = ::recv(sock, buffer, sizeof buffer, 0)) > 0;) reply.append(buffer, static_cast<size_t>(n));
  return reply;
}

// Sends `head`, then `filler` again and again until `bytes` are sent or the server stops taking them;
// then the reply.
std::string send_raw(int port, const std::string& head, const std::string& filler, size_t bytes) {
  const int sock = connect_to(port);
  if (sock < 0) return "";
  bool open = ::send(sock, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size());
  for (size_t sent = 0; open && sent < bytes; sent += filler.size())
    open = ::send(sock, filler.data(), filler.size(), MSG_NOSIGNAL) > 0;
  const std::string reply = read_reply(sock);
  ::close(sock);
  return reply;
}

// The server's peak resident memory so far (VmHWM), in MB.
double peak_rss_mb(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return -1.0;
}

// Bodies and headers that cannot be bounded before they are read are refused unread: a 200 MB
// chunked body (411), a gzip bomb that inflates to 400 MB (415), a 50 MB header line (431), a POST
// without a length (411), a length past --max_body_bytes (413). Each answer is JSON; the server's
// peak memory stays within 64 MB of where it was, and it keeps answering.
TEST_F(ServeHttp, BodiesThatCannotBeBoundedAreRefusedUnread) {
  ServerProcess server(dir_->path, out_dir());
  ASSERT_GT(server.port(), 0) << server.log();
  ASSERT_EQ(curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"max_tokens", 5}}.dump()).status, 200);
  const double before = peak_rss_mb(server.pid());
  ASSERT_GT(before, 0.0);
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  const std::string chunk = "4000\r\n" + std::string(0x4000, ' ') + "\r\n";
  const auto expect_refusal = [&](const std::string& reply, int status, const std::string& code) {
    EXPECT_EQ(reply.rfind("HTTP/1.1 " + std::to_string(status), 0), 0u) << reply.substr(0, 300);
    const size_t body = reply.find("\r\n\r\n");
    ASSERT_NE(body, std::string::npos) << reply.substr(0, 300);
    const json e = json::parse(reply.substr(body + 4), nullptr, false);
    ASSERT_FALSE(e.is_discarded()) << reply.substr(0, 300);
    EXPECT_EQ(e["error"]["code"], code) << reply.substr(0, 300);
    EXPECT_LT(peak_rss_mb(server.pid()), before + 64.0) << code;
    EXPECT_EQ(curl("GET", server.url("/health")).status, 200) << "after " << code;
  };
  expect_refusal(send_raw(server.port(), post + "Transfer-Encoding: chunked\r\n\r\n", chunk, 200u << 20), 411,
                 "length_required");
  ASSERT_EQ(shell("head -c 400000000 /dev/zero | gzip -1 >" + path("bomb.gz")), 0);
  const std::string bomb = read_text(path("bomb.gz"));
  expect_refusal(send_raw(server.port(),
                          post + "Content-Encoding: gzip\r\nContent-Length: " + std::to_string(bomb.size()) + "\r\n\r\n" + bomb,
                          "", 0),
                 415, "unsupported_encoding");
  expect_refusal(send_raw(server.port(), "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: ", std::string(1 << 16, 'a'),
                          50u << 20),
                 431, "headers_too_large");
  expect_refusal(send_raw(server.port(), post + "\r\n{\"prompt\": \"x\"}", "", 0), 411, "length_required");
  expect_refusal(send_raw(server.port(), post + "Content-Length: 1000000000\r\n\r\n", "", 0), 413, "body_too_large");
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// Slow clients hold no thread: with two of them, 200 clients each sending a request a byte every
// half second leave /health answering at once; each of them gets 408 once --timeout has passed since
// its first byte. Connections past --max_connections get 503 at once, and are taken again once
// others close.
TEST_F(ServeHttp, TricklingClientsAndManyConnectionsLeaveTheServerAnswering) {
  ServerProcess server(dir_->path, out_dir() + " --connections=2 --timeout=3");
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<int> slow;
  for (int i = 0; i < 200; ++i) {
    const int sock = connect_to(server.port());
    ASSERT_GE(sock, 0);
    slow.push_back(sock);
  }
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (size_t at = 0; trickling && at < request.size(); ++at) {
      for (int sock : slow) ::send(sock, &request[at], 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  for (int i = 0; i < 3; ++i) {
    const auto health = curl("GET", server.url("/health"), "", "--max-time 2");
    EXPECT_EQ(health.status, 200) << health.body;
  }
  trickling = false;
  trickle.join();
  for (int sock : {slow.front(), slow.back()}) {
    const std::string reply = read_reply(sock);
    EXPECT_EQ(reply.rfind("HTTP/1.1 408", 0), 0u) << reply;
  }
  for (int sock : slow) ::close(sock);

  ServerProcess capped(dir_->path, out_dir() + " --max_connections=3");
  ASSERT_GT(capped.port(), 0) << capped.log();
  std::vector<int> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(connect_to(capped.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto refused = curl("GET", capped.url("/health"));
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.headers.find("Retry-After"), std::string::npos) << refused.headers;
  EXPECT_EQ(json::parse(refused.body, nullptr, false)["error"]["code"], "too_many_connections") << refused.body;
  for (int sock : idle) ::close(sock);
  int status = 0;
  for (int i = 0; i < 50 && status != 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status = curl("GET", capped.url("/health")).status;
  }
  EXPECT_EQ(status, 200);
  EXPECT_EQ(server.terminate(30), 0) << server.log();
  EXPECT_EQ(capped.terminate(30), 0) << capped.log();
}

// A POST body is JSON, said so by its Content-Type (415 otherwise: curl's -d alone sends a form);
// without an API key the server answers only to its own names (a page elsewhere cannot reach it
// through a name of its own that resolves here), unless --allowed_hosts names them.
TEST_F(ServeHttp, JsonBodiesAndOwnHostNamesOnly) {
  ServerProcess server(dir_->path, out_dir() + " --allowed_hosts=proxy.example,other.example");
  ASSERT_GT(server.port(), 0) << server.log();
  const std::string request = json{{"prompt", kPrompt}, {"max_tokens", 3}}.dump();
  std::ofstream(path("form.req")) << request;
  const auto form = curl("POST", server.url("/v1/completions"), "", "--data-binary @" + path("form.req"));
  EXPECT_EQ(form.status, 415) << form.body;
  EXPECT_EQ(json::parse(form.body, nullptr, false)["error"]["code"], "unsupported_media_type") << form.body;
  EXPECT_EQ(curl("POST", server.url("/v1/completions"), request, "-H 'Content-Type: application/json; charset=utf-8'").status,
            200);
  const auto rebound = curl("GET", server.url("/v1/models"), "", "-H 'Host: attacker.example:8080'");
  EXPECT_EQ(rebound.status, 403) << rebound.body;
  EXPECT_EQ(json::parse(rebound.body, nullptr, false)["error"]["code"], "host_not_allowed") << rebound.body;
  EXPECT_EQ(curl("GET", server.url("/v1/models"), "", "-H 'Host: localhost:8080'").status, 200);
  EXPECT_EQ(curl("GET", server.url("/v1/models"), "", "-H 'Host: other.example'").status, 200);
  EXPECT_EQ(server.terminate(30), 0) << server.log();

  std::ofstream(path("host_key.txt")) << "k\n";
  ServerProcess keyed(dir_->path, out_dir() + " --api_key_file=" + path("host_key.txt"));
  ASSERT_GT(keyed.port(), 0) << keyed.log();
  EXPECT_EQ(curl("GET", keyed.url("/v1/models"), "", "-H 'Host: any.example' -H 'Authorization: Bearer k'").status, 200);
  EXPECT_EQ(keyed.terminate(30), 0) << keyed.log();
}

// The curl lines of the README and of docs/serving.md run as written, but for the port, against a
// server of a small Shakespeare model: each exits 0 with an HTTP success (curl's `fail` option,
// from a .curlrc of the test's own), the key line included (a server without a key ignores one).
TEST_F(ServeHttp, TheDocumentedCurlLinesRunAsWritten) {
  const std::string dir = path("docs");
  auto c = tiny_config(dir);
  c.model.block_size = 64;  // the attention example's text is 20 characters
  std::ofstream(dir + "/shakespeare.yaml") << train::to_yaml(c);
  ASSERT_EQ(shell(std::string(NANOGPT_BINARY) + " train " + dir + "/shakespeare.yaml >" + dir + "/train.out 2>&1"), 0)
      << read_text(dir + "/train.out");
  ServerProcess server(dir, "--out_dir=" + c.out_dir + " --num_threads=1");
  ASSERT_GT(server.port(), 0) << server.log();
  std::ofstream(dir + "/.curlrc") << "fail\n";
  std::ofstream(dir + "/key.txt") << "any\n";
  size_t ran = 0;
  for (const std::string doc : {"README.md", "docs/serving.md"}) {
    std::istringstream lines(read_text(std::string(NANOGPT_SOURCE_DIR) + "/" + doc));
    bool in_sh = false;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("```", 0) == 0) in_sh = !in_sh && line == "```sh";
      if (!in_sh || line.rfind("curl ", 0) != 0) continue;
      for (std::string more; !line.empty() && line.back() == '\\' && std::getline(lines, more);) line.back() = ' ', line += more;
      const std::string written = line;
      for (const std::string address : {"localhost:8080", "127.0.0.1:8080"})
        for (size_t at; (at = line.find(address)) != std::string::npos;)
          line.replace(at, address.size(), "127.0.0.1:" + std::to_string(server.port()));
      const int rc = shell("cd " + dir + " && CURL_HOME=" + dir + " " + line + " >" + dir + "/curl.out 2>&1");
      EXPECT_EQ(rc, 0) << doc << ": " << written << "\n" << read_text(dir + "/curl.out");
      ++ran;
    }
  }
  EXPECT_GE(ran, 6u) << "the docs lost their curl lines";
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}

// ---- On a GPU: the slots in a static KV cache, each step a CUDA graph's replay ----

namespace {

// What each choice of a request received: its text, its tokens, the largest log-probability among them.
struct ChoiceSeen {
  std::string text;
  size_t tokens = 0;
  double max_logprob = -HUGE_VAL;
};

// `requests` submitted to `batcher` 3 ms apart (later ones join a running batch), each one's events
// read until its job ends (60 s at most): by request, each choice's ChoiceSeen; the jobs' errors.
std::vector<std::map<int64_t, ChoiceSeen>> run_joining(serve::Batcher& batcher,
                                                       const std::vector<serve::CompletionRequest>& requests,
                                                       std::vector<std::string>* errors) {
  std::vector<std::shared_ptr<serve::Job>> jobs;
  for (const auto& request : requests) {
    jobs.push_back(batcher.submit(request));
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  std::vector<std::map<int64_t, ChoiceSeen>> seen(jobs.size());
  for (size_t r = 0; r < jobs.size(); ++r) {
    std::vector<serve::ChoiceEvent> events;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (bool more = true; more;) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "request " << r << " still running after 60 s";
        break;
      }
      more = jobs[r]->wait_events(events, std::chrono::milliseconds(100));
      for (const auto& e : events) {
        auto& choice = seen[r][e.index];
        choice.text += e.text;
        choice.tokens += e.tokens.size();
        for (const auto& t : e.tokens) choice.max_logprob = std::max(choice.max_logprob, static_cast<double>(t.logprob));
      }
    }
    errors->push_back(jobs[r]->error());
  }
  return seen;
}

}  // namespace


// The GPU's batching on the CPU (--static_slots: the same code without the graphs): choices of
// several requests join and leave the static cache's slots (moving down as others finish), each
// one's greedy text is generate()'s alone, past block_size too (RoPE sliding; learned positions
// recomputing the window), with stop strings and log-probabilities as the CPU's batching gives them.
TEST(Batching, StaticSlotsGiveEachChoiceItsGreedyTextWhateverJoinsOrLeaves) {
  for (const std::string pos : {"rope", "learned"}) {
    SCOPED_TRACE(pos);
    auto m = tiny_model(pos);
    const auto vocab = data::Vocab::from_text("abcdefghijklmnopqrstuvw");
    serve::ServerOptions options;
    options.static_slots = true;
    options.parallel = 4;  // fewer slots than choices: some wait for others to leave
    serve::Metrics metrics;
    model::SamplingOptions greedy;
    greedy.temperature = 0.0;
    const std::vector<std::string> bodies = {
        R"({"prompt": "abc", "max_tokens": 30, "n": 2, "temperature": 0, "logprobs": 1})",
        R"({"prompt": "q", "max_tokens": 7, "temperature": 0})",
        R"({"prompt": ["defghijklmnopqrs", "tu"], "max_tokens": 20, "temperature": 0})",
        R"({"prompt": "vwab", "max_tokens": 25, "temperature": 0, "stop": ["k"]})"};
    std::vector<serve::CompletionRequest> requests;
    std::vector<std::map<int64_t, std::string>> expected(bodies.size());  // before the model's thread runs
    for (size_t r = 0; r < bodies.size(); ++r) {
      const auto request = serve::parse_completion_request(bodies[r], vocab, options);
      for (size_t p = 0; p < request.prompts.size(); ++p) {
        const auto& prompt = request.prompts[p];
        const auto all = reference(m, prompt, request.max_tokens, greedy, 1);
        std::string text = vocab.decode(std::vector<int64_t>(all.begin() + prompt.size(), all.end()));
        if (!request.stop.empty() && text.find(request.stop[0]) != std::string::npos) text.resize(text.find(request.stop[0]));
        for (int64_t i = 0; i < request.n; ++i) expected[r][static_cast<int64_t>(p) * request.n + i] = text;
      }
      requests.push_back(request);
    }
    serve::Batcher batcher(m, vocab, options, metrics);
    std::vector<std::string> errors;
    const auto seen = run_joining(batcher, requests, &errors);
    for (size_t r = 0; r < requests.size(); ++r) {
      const auto& request = requests[r];
      EXPECT_EQ(errors[r], "");
      for (const auto& [index, want] : expected[r]) {
        const auto& choice = seen[r].at(index);
        EXPECT_EQ(choice.text, want) << "request " << r << " choice " << index;
        if (request.logprobs) {
          EXPECT_LE(choice.max_logprob, 0.0);
        }
        if (request.stop.empty()) {
          EXPECT_EQ(choice.tokens, static_cast<size_t>(request.max_tokens));
        }
      }
    }
  }
}


// --max_context N on the CPU: the slots are a static cache of N positions, and each choice's greedy
// text is that of a window of its last N tokens: for learned positions sample.py's recompute of the
// last N tokens, for RoPE the general path of the same weights in a model whose block_size is N (its
// cache slides at N). A beam search of width 1 (greedy) recomputes its last N tokens. Choices join
// and leave (4 slots, 5 choices); the window is not block_size's (some text differs from it).
TEST(Batching, MaxContextGivesEachChoiceTheGreedyTextOfItsWindow) {
  constexpr int64_t N = 3;
  for (const std::string pos : {"rope", "learned"}) {
    SCOPED_TRACE(pos);
    auto m = tiny_model(pos);
    {
      // Sharper attention over values that outweigh the residual stream: which tokens are in the window
      // matters to the next token (at random initialisation it hardly does).
      torch::NoGradGuard no_grad;
      for (auto& p : m->named_parameters()) {
        if (p.key().find("q_proj") != std::string::npos || p.key().find("k_proj") != std::string::npos) p.value().mul_(3);
        if (p.key().find("v_proj") != std::string::npos) p.value().mul_(16);
      }
    }
    const auto vocab = data::Vocab::from_text("abcdefghijklmnopqrstuvw");
    serve::ServerOptions options;
    options.max_context = N;
    options.parallel = 4;
    serve::Metrics metrics;
    model::SamplingOptions greedy;
    greedy.temperature = 0.0;
    auto recompute = [&](std::vector<int64_t> seq, int64_t n, int64_t window) {  // sample.py, greedy
      torch::NoGradGuard no_grad;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t begin = std::max<int64_t>(0, static_cast<int64_t>(seq.size()) - window);
        auto idx = torch::tensor(std::vector<int64_t>(seq.begin() + begin, seq.end()), torch::kLong).view({1, -1});
        seq.push_back(m->forward(idx).first.argmax(-1).item<int64_t>());
      }
      return seq;
    };
    auto shorter = m->config();
    shorter.block_size = N;
    model::GPT windowed(shorter);
    if (pos == "rope") {
      torch::NoGradGuard no_grad;
      auto from = m->named_parameters();
      for (auto& p : windowed->named_parameters()) p.value().copy_(from[p.key()]);
    }
    const std::vector<std::string> bodies = {
        R"({"prompt": "abc", "max_tokens": 30, "n": 2, "temperature": 0})",
        R"({"prompt": ["defghijklmnopqrs", "t"], "max_tokens": 20, "temperature": 0})",
        R"({"prompt": "vwab", "max_tokens": 25, "temperature": 0})",
        R"({"prompt": "hgfedcba", "max_tokens": 12, "beam": 1})"};
    std::vector<serve::CompletionRequest> requests;
    std::vector<std::map<int64_t, std::string>> expected(bodies.size());
    int64_t other_than_block_size = 0;
    for (size_t r = 0; r < bodies.size(); ++r) {
      const auto request = serve::parse_completion_request(bodies[r], vocab, options);
      for (size_t p = 0; p < request.prompts.size(); ++p) {
        const auto& prompt = request.prompts[p];
        const auto all = pos == "rope" && request.beam == 0 ? reference(windowed, prompt, request.max_tokens, greedy, 1)
                                                            : recompute(prompt, request.max_tokens, N);
        const std::string text = vocab.decode(std::vector<int64_t>(all.begin() + prompt.size(), all.end()));
        if (all != recompute(prompt, request.max_tokens, m->config().block_size)) ++other_than_block_size;
        for (int64_t i = 0; i < request.n; ++i) expected[r][static_cast<int64_t>(p) * request.n + i] = text;
      }
      requests.push_back(request);
    }
    EXPECT_GT(other_than_block_size, 0) << "every text of a window of " << N << " is block_size's";
    serve::Batcher batcher(m, vocab, options, metrics);
    std::vector<std::string> errors;
    const auto seen = run_joining(batcher, requests, &errors);
    for (size_t r = 0; r < requests.size(); ++r) {
      EXPECT_EQ(errors[r], "");
      for (const auto& [index, want] : expected[r]) EXPECT_EQ(seen[r].at(index).text, want) << "request " << r << " choice " << index;
    }
  }
}

// A GPU server (fp32; TF32 is off for LibTorch's fp32 products unless asked) against the library on
// the CPU: greedy text and its logprobs, streamed and not, a stop string, greedy text alone and
// beside sampled requests joining and leaving (other buckets), n choices, beam search, and a
// client hanging up; it stops on SIGTERM.
TEST_F(ServeHttp, OnTheGpuGreedyTextAndTheProtocolAreTheCpus) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ServerProcess server(dir_->path, out_dir() + " --device=cuda --parallel=16");
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_EQ(server.log().find("capture failed"), std::string::npos) << server.log();
  auto loaded = train::load_model(train::resolve_checkpoint(path("out")));
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  std::mt19937_64 rng(0);
  const auto prompt = loaded.vocab.encode(kPrompt);
  auto tokens = model::generate(loaded.model, prompt, 1, 40, greedy, rng)[0];
  const std::string expected = loaded.vocab.decode(std::vector<int64_t>(tokens.begin() + prompt.size(), tokens.end()));
  const json request{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 2}};
  auto plain = curl("POST", server.url("/v1/completions"), request.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json j = json::parse(plain.body);
  EXPECT_EQ(j["choices"][0]["text"], expected);
  const auto& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 40u);
  for (size_t i = 0; i < 40; ++i)
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), lp["top_logprobs"][i][lp["tokens"][i].get<std::string>()].get<double>(), 1e-9);
  const auto ev = streamed_events(server, request);
  std::string text;
  for (size_t i = 0; i + 1 < ev.size(); ++i) text += ev[i]["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, expected);
  if (expected.find('\n') != std::string::npos) {
    auto stopped = json::parse(curl("POST", server.url("/v1/completions"),
                                    json{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}, {"stop", "\n"}}.dump())
                                   .body);
    EXPECT_EQ(stopped["choices"][0]["text"], expected.substr(0, expected.find('\n')));
    EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  }
  std::vector<std::future<Reply>> others;
  for (int i = 0; i < 9; ++i)
    others.push_back(std::async(std::launch::async, [&, i] {
      return curl("POST", server.url("/v1/completions"),
                  json{{"prompt", i % 2 ? "\u660E\u6708" : "\u5E8A"}, {"max_tokens", 20 + 15 * i}, {"stream", true},
                       {"n", 1 + i % 3}}.dump(), "-N");
    }));
  auto beside = curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}}.dump());
  for (auto& o : others) EXPECT_EQ(o.get().status, 200);
  ASSERT_EQ(beside.status, 200) << beside.body;
  EXPECT_EQ(json::parse(beside.body)["choices"][0]["text"], expected);
  auto beam = curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"max_tokens", 10}, {"beam", 3}, {"n", 3}}.dump());
  ASSERT_EQ(beam.status, 200) << beam.body;
  EXPECT_EQ(json::parse(beam.body)["choices"].size(), 3u);
  shell("curl -s -m 0.3 -N -H 'Content-Type: application/json' --data '{\"prompt\": \"" + kPrompt + "\", \"max_tokens\": 4000, \"stream\": true}' '" +
        server.url("/v1/completions") + "' >/dev/null 2>&1");  // hangs up mid-stream
  auto after = curl("POST", server.url("/v1/completions"), json{{"prompt", kPrompt}, {"max_tokens", 40}, {"temperature", 0}}.dump());
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(json::parse(after.body)["choices"][0]["text"], expected);
  EXPECT_EQ(server.terminate(30), 0) << server.log();
}
