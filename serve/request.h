// The body of POST /v1/completions, parsed and checked against the server's limits, in OpenAI's
// shapes: a bad field is a RequestError naming it (HTTP 4xx with OpenAI's error body), never a crash.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/vocab.h"
#include "model/generate.h"
#include "serve/options.h"

namespace nanogpt::serve {

/// A client's mistake: the HTTP status (400, 401, 404, 413, 503 ...), OpenAI's error "type" and
/// "code", and the request field it concerns ("" when none).
struct RequestError : std::runtime_error {
  RequestError(int status, std::string message, std::string param = "", std::string code = "invalid_value",
               std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)),
        status(status),
        param(std::move(param)),
        code(std::move(code)),
        type(std::move(type)) {}
  int status;
  std::string param, code, type;
  /// {"error": {"message", "type", "param", "code"}}; param null when empty.
  nlohmann::json body() const;
};

struct CompletionRequest {
  std::vector<std::vector<int64_t>> prompts;  // one or more, each non-empty token ids
  std::vector<std::string> prompt_texts;      // the same, as text (for echo)
  int64_t max_tokens = 16;                    // OpenAI's default
  model::SamplingOptions sampling;            // temperature (default 1), top_k (0 = off), top_p
  std::vector<std::string> stop;              // up to 4 strings; the text ends before the first found
  std::optional<uint64_t> seed;               // choice i draws from seed + i; absent: a random seed
  int64_t n = 1;                              // choices per prompt
  std::optional<int64_t> logprobs;            // 0 .. 5 alternatives per token; absent: no logprobs
  bool echo = false;                          // the prompt before the generated text
  bool stream = false;                        // server-sent events
  /// An extension of OpenAI's fields: beam search of this width (model::beam_search) instead of
  /// sampling; 0 = off (at most --max_beam, and beam x prompts x max_tokens at most --max_beam_tokens).
  /// The n best beams are the choices (n <= beam); temperature, top_k, top_p and
  /// seed do not apply, logprobs is refused. Streamed, each choice arrives whole in one event.
  int64_t beam = 0;
};

/// The body of POST /v1/attention: every head's attention weights over prompt + completion.
struct AttentionRequest {
  std::vector<int64_t> tokens;   // prompt + completion, token ids (1 .. the limit)
  int64_t prompt_tokens = 0;     // the prompt's share (>= 1)
  int64_t dropped = 0;           // "truncate": true: tokens dropped from the front to fit the limit
  bool html = false;             // "format": "html": the attention explorer page; else JSON
};

/// Parses and checks `body` (the raw request body). Throws RequestError: 400 for invalid JSON, a
/// wrong type, a value out of range or a character outside the vocabulary (naming the field).
CompletionRequest parse_completion_request(const std::string& body, const data::Vocab& vocab,
                                           const ServerOptions& limits);

/// Parses and checks the body of POST /v1/attention: {"prompt": string (non-empty), "completion":
/// string (default ""), "format": "json" | "html", "truncate": bool}; prompt + completion at most
/// `max_tokens` characters (the server's --max_attention_tokens and the model's block_size), or with
/// "truncate": true the last `max_tokens` of them (the window's first token then counts as the
/// prompt when the window starts inside the completion). Throws RequestError 400 naming the field.
AttentionRequest parse_attention_request(const std::string& body, const data::Vocab& vocab, int64_t max_tokens);

/// The body as a JSON object, or RequestError 400 (invalid JSON, not an object).
nlohmann::json parse_json_object(const std::string& body);

/// UTF-8 text -> token ids, or RequestError 400 naming `field` and the first character outside the vocabulary.
std::vector<int64_t> encode_text(const std::string& text, const data::Vocab& vocab, const std::string& field);

}  // namespace nanogpt::serve
