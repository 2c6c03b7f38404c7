// Fuzz target: the parsing of a completion request's body and of an attention request's
// (serve/request.h), as `nanogpt serve` meets them from any client.
//
// Properties checked on every input, beyond "no crash, no UB": the parser either returns a request
// within the limits (every prompt non-empty, in the vocabulary and no longer than the limit;
// max_tokens, n, logprobs and the sampling knobs in range) or throws RequestError with a 4xx status
// and a body of OpenAI's error shape; never any other exception.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "serve/request.h"
#include "tests/fuzz/fuzz_common.h"

using namespace nanogpt;
using nanogpt::fuzz::finding;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const data::Vocab vocab = data::Vocab::from_text("abc \n\xE5\xBA\x8A");  // a few characters, one CJK
  serve::ServerOptions limits;
  limits.max_tokens = 64;
  limits.max_prompt_tokens = 32;
  const std::string body(reinterpret_cast<const char*>(data), size);
  try {
    const auto r = serve::parse_completion_request(body, vocab, limits);
    if (r.prompts.empty() || r.prompts.size() != r.prompt_texts.size()) finding("a request without its prompts");
    for (const auto& p : r.prompts) {
      if (p.empty() || static_cast<int64_t>(p.size()) > limits.max_prompt_tokens) finding("a prompt outside the limits");
      for (int64_t id : p)
        if (id < 0 || id >= vocab.size()) finding("a prompt token outside the vocabulary");
    }
    if (r.max_tokens < 0 || r.max_tokens > limits.max_tokens) finding("max_tokens outside the limit");
    if (r.n < 1 || r.n > limits.max_n) finding("n outside the limit");
    if (r.logprobs && (*r.logprobs < 0 || *r.logprobs > 5)) finding("logprobs outside [0, 5]");
    if (r.beam < 0 || r.beam > limits.max_n || (r.beam > 0 && (r.n > r.beam || r.logprobs))) finding("a bad beam request");
    r.sampling.validate();  // throws (a finding below) when a knob is out of range
  } catch (const serve::RequestError& e) {
    if (e.status < 400 || e.status >= 500) finding("a parse error that is not a 4xx");
    const auto b = e.body();
    if (!b["error"].contains("message") || !b["error"].contains("type") || b.dump().empty()) finding("an error body without its fields");
  } catch (const std::exception& e) {
    finding(std::string("an exception other than RequestError: ") + e.what());
  }
  try {
    const auto a = serve::parse_attention_request(body, vocab, 16);
    const auto T = static_cast<int64_t>(a.tokens.size());
    if (T < 1 || T > 16 || a.prompt_tokens < 1 || a.prompt_tokens > T || a.dropped < 0) finding("an attention request outside the limits");
    for (int64_t id : a.tokens)
      if (id < 0 || id >= vocab.size()) finding("an attention token outside the vocabulary");
  } catch (const serve::RequestError& e) {
    if (e.status < 400 || e.status >= 500) finding("an attention parse error that is not a 4xx");
  } catch (const std::exception& e) {
    finding(std::string("an attention parse: an exception other than RequestError: ") + e.what());
  }
  return 0;
}
