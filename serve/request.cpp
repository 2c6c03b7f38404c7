// Parsing and checking of a completion request (see request.h).
#include "serve/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace nanogpt::serve {

using nlohmann::json;

json RequestError::body() const {
  return json{{"error",
               {{"message", what()}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", code}}}};
}

json parse_json_object(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw RequestError(400, "the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object()) throw RequestError(400, "the request body must be a JSON object", "", "invalid_json");
  return j;
}

std::vector<int64_t> encode_text(const std::string& text, const data::Vocab& vocab, const std::string& field) {
  try {
    return vocab.encode(text);
  } catch (const std::exception& e) {  // invalid UTF-8, or a character the model has never seen
    throw RequestError(400, fmt::format("{}: {} (the model knows only the {} characters of its training text)", field,
                                        e.what(), vocab.size()),
                       field, "invalid_value");
  }
}

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& message, const char* code = "invalid_value") {
  throw RequestError(400, field + " " + message, field, code);
}

// An integer field: a JSON integer (or a float with an integral value, as some clients send) in [lo, hi].
int64_t integer(const json& j, const std::string& field, int64_t lo, int64_t hi) {
  if (j.is_number_integer() || j.is_number_unsigned()) {
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(field, fmt::format("must be in [{}, {}], got {}", lo, hi, j.dump()));
    const int64_t v = j.get<int64_t>();
    if (v < lo || v > hi) bad(field, fmt::format("must be in [{}, {}], got {}", lo, hi, v));
    return v;
  }
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && v >= static_cast<double>(lo) && v <= static_cast<double>(hi))
      return static_cast<int64_t>(v);
    bad(field, fmt::format("must be an integer in [{}, {}], got {}", lo, hi, j.dump()));
  }
  bad(field, fmt::format("must be an integer, got {}", j.type_name()), "invalid_type");
}

double number(const json& j, const std::string& field) {
  if (!j.is_number()) bad(field, fmt::format("must be a number, got {}", j.type_name()), "invalid_type");
  const double v = j.get<double>();
  if (!std::isfinite(v)) bad(field, "must be a finite number");
  return v;
}

bool boolean(const json& j, const std::string& field) {
  if (!j.is_boolean()) bad(field, fmt::format("must be true or false, got {}", j.type_name()), "invalid_type");
  return j.get<bool>();
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& body, const data::Vocab& vocab,
                                           const ServerOptions& limits) {
  const json j = parse_json_object(body);
  CompletionRequest r;
  r.sampling.temperature = 1.0;  // OpenAI's defaults: no top-k, no top-p
  r.sampling.top_k = 0;
  r.sampling.top_p = 1.0;
  const auto has = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };

  if (!j.contains("prompt")) bad("prompt", "is required (a string, or a list of strings)", "missing_required");
  const json& prompt = j.at("prompt");
  std::vector<std::string> texts;
  if (prompt.is_string()) {
    texts.push_back(prompt.get<std::string>());
  } else if (prompt.is_array()) {
    if (prompt.empty()) bad("prompt", "must hold at least one string");
    if (static_cast<int64_t>(prompt.size()) > limits.max_prompts)
      bad("prompt", fmt::format("holds {} prompts; at most {} in one request", prompt.size(), limits.max_prompts));
    for (const auto& p : prompt) {
      if (!p.is_string()) bad("prompt", fmt::format("must be a string or a list of strings, found a {} in the list", p.type_name()), "invalid_type");
      texts.push_back(p.get<std::string>());
    }
  } else {
    bad("prompt", fmt::format("must be a string or a list of strings, got {}", prompt.type_name()), "invalid_type");
  }
  for (const auto& text : texts) {
    if (static_cast<int64_t>(text.size()) > 4 * limits.max_prompt_tokens)  // before encoding: bytes >= characters / 4
      bad("prompt", fmt::format("is longer than {} characters", limits.max_prompt_tokens));
    auto ids = encode_text(text, vocab, "prompt");
    if (ids.empty()) bad("prompt", "is empty: give at least one character");
    if (static_cast<int64_t>(ids.size()) > limits.max_prompt_tokens)
      bad("prompt", fmt::format("has {} characters; at most {}", ids.size(), limits.max_prompt_tokens));
    r.prompts.push_back(std::move(ids));
    r.prompt_texts.push_back(text);
  }

  if (has("max_tokens")) r.max_tokens = integer(j.at("max_tokens"), "max_tokens", 0, limits.max_tokens);
  if (has("temperature")) {
    r.sampling.temperature = number(j.at("temperature"), "temperature");
    if (r.sampling.temperature < 0.0 || r.sampling.temperature > 100.0)
      bad("temperature", fmt::format("must be in [0, 100] (0 = greedy), got {}", r.sampling.temperature));
  }
  if (has("top_p")) {
    r.sampling.top_p = number(j.at("top_p"), "top_p");
    if (!(r.sampling.top_p > 0.0 && r.sampling.top_p <= 1.0))
      bad("top_p", fmt::format("must be in (0, 1] (1 = off), got {}", r.sampling.top_p));
  }
  if (has("top_k")) r.sampling.top_k = integer(j.at("top_k"), "top_k", 0, vocab.size());
  if (has("n")) r.n = integer(j.at("n"), "n", 1, limits.max_n);
  if (has("seed")) r.seed = static_cast<uint64_t>(integer(j.at("seed"), "seed", std::numeric_limits<int64_t>::min(),
                                                          std::numeric_limits<int64_t>::max()));
  if (has("logprobs")) r.logprobs = integer(j.at("logprobs"), "logprobs", 0, 5);
  if (has("echo")) r.echo = boolean(j.at("echo"), "echo");
  if (has("stream")) r.stream = boolean(j.at("stream"), "stream");
  if (has("stop")) {
    const json& stop = j.at("stop");
    if (stop.is_string()) {
      r.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      if (stop.size() > 4) bad("stop", fmt::format("holds {} strings; at most 4", stop.size()));
      for (const auto& s : stop) {
        if (!s.is_string()) bad("stop", "must be a string or a list of strings", "invalid_type");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", fmt::format("must be a string or a list of strings, got {}", stop.type_name()), "invalid_type");
    }
    for (const auto& s : r.stop) {
      if (s.empty()) bad("stop", "must not hold an empty string");
      if (s.size() > 256) bad("stop", "strings must be at most 256 bytes");
    }
  }
  if (has("beam")) {
    r.beam = integer(j.at("beam"), "beam", 0, limits.max_beam);
    if (r.beam > 0 && r.n > r.beam)
      bad("n", fmt::format("({}) must be at most beam ({}): the choices are the best beams", r.n, r.beam));
    if (r.beam > 0 && r.logprobs) bad("logprobs", "is not available with beam search (beam): leave it out");
    // A search runs whole on the model's thread, every stream paused: its work is bounded on its own.
    const int64_t weighed = r.beam * static_cast<int64_t>(r.prompts.size()) * r.max_tokens;
    if (weighed > limits.max_beam_tokens)
      bad("max_tokens", fmt::format("({}) x beam ({}) x {} prompts = {} tokens to search; a beam search weighs at most {} "
                                    "(the server's --max_beam_tokens): lower max_tokens or beam, or send fewer prompts",
                                    r.max_tokens, r.beam, r.prompts.size(), weighed, limits.max_beam_tokens));
  }
  if (has("model") && !j.at("model").is_string()) bad("model", "must be a string", "invalid_type");
  const int64_t sequences = static_cast<int64_t>(r.prompts.size()) * r.n;
  if (sequences > limits.queue)  // it could never be queued: refused for good, not "retry shortly"
    bad("n", fmt::format("{} prompts x n ({}) = {} sequences; the server queues at most {} (--queue)", r.prompts.size(), r.n,
                         sequences, limits.queue));
  return r;
}

AttentionRequest parse_attention_request(const std::string& body, const data::Vocab& vocab, int64_t max_tokens) {
  const json j = parse_json_object(body);
  const auto text = [&](const char* field, bool required) -> std::string {
    if (!j.contains(field) || j.at(field).is_null()) {
      if (required) bad(field, "is required (a string)", "missing_required");
      return "";
    }
    if (!j.at(field).is_string()) bad(field, fmt::format("must be a string, got {}", j.at(field).type_name()), "invalid_type");
    const std::string s = j.at(field).get<std::string>();
    if (static_cast<int64_t>(s.size()) > 4 * max_tokens) bad(field, fmt::format("is longer than {} characters", max_tokens));
    return s;
  };
  AttentionRequest r;
  r.tokens = encode_text(text("prompt", true), vocab, "prompt");
  if (r.tokens.empty()) bad("prompt", "is empty: give at least one character");
  r.prompt_tokens = static_cast<int64_t>(r.tokens.size());
  const auto completion = encode_text(text("completion", false), vocab, "completion");
  r.tokens.insert(r.tokens.end(), completion.begin(), completion.end());
  const bool truncate = j.contains("truncate") && !j.at("truncate").is_null() && boolean(j.at("truncate"), "truncate");
  if (truncate && static_cast<int64_t>(r.tokens.size()) > max_tokens) {
    r.dropped = static_cast<int64_t>(r.tokens.size()) - max_tokens;
    r.tokens.erase(r.tokens.begin(), r.tokens.begin() + r.dropped);
    r.prompt_tokens = std::max<int64_t>(1, r.prompt_tokens - r.dropped);
  }
  if (static_cast<int64_t>(r.tokens.size()) > max_tokens)
    bad(completion.empty() ? "prompt" : "completion",
        fmt::format("makes {} characters with the prompt; at most {} (the context window, or --max_attention_tokens)",
                    r.tokens.size(), max_tokens));
  if (j.contains("format") && !j.at("format").is_null()) {
    if (!j.at("format").is_string()) bad("format", "must be \"json\" or \"html\"", "invalid_type");
    const std::string format = j.at("format").get<std::string>();
    if (format != "json" && format != "html") bad("format", fmt::format("must be \"json\" or \"html\", got \"{}\"", format));
    r.html = format == "html";
  }
  return r;
}

}  // namespace nanogpt::serve
