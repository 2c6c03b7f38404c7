// What `nanogpt serve` listens on and the limits it holds every client to: safe by default
// (loopback only, bounded bodies, prompts, outputs, slots, queue and connections, timeouts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nanogpt::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";   // loopback unless told otherwise (0.0.0.0: every interface)
  int port = 8080;                  // 0 = any free port (printed when listening)
  std::string api_key;              // non-empty: every endpoint but /health needs "Authorization: Bearer KEY"
  std::string model_name = "nanogpt";  // the id /v1/models lists
  int64_t parallel = 8;             // slots: sequences generated together, one batched pass per token
  int64_t queue = 128;              // sequences waiting for a slot; more gets 503 with Retry-After (>= max_n x max_prompts)
  int64_t max_body_bytes = 1 << 20;       // a larger request body gets 413
  int64_t max_prompt_tokens = 8192;       // characters of one prompt
  int64_t max_tokens = 4096;              // the most a request may ask to generate (max_tokens)
  int64_t max_n = 8;                      // choices per prompt (n)
  int64_t max_prompts = 16;               // prompts in one request (a list)
  int64_t max_beam = 8;                   // beam search's width (beam)
  int64_t max_beam_tokens = 4096;         // beam x prompts x max_tokens of one beam request: it holds the model's thread
  int64_t max_attention_tokens = 256;     // characters POST /v1/attention looks at (and the model's block_size)
  int64_t connections = 96;               // requests answered at once (their threads); more wait their turn
  int64_t max_connections = 1024;         // connections open at once, idle ones included; more get 503 at once
  int64_t read_timeout_s = 10;            // a request's head and body arrive within this, from its first byte (408)
  int64_t write_timeout_s = 10;           // a client that reads nothing for this long is dropped
  double drain_timeout_s = 5.0;           // on SIGTERM: streams in flight end within this
  std::vector<std::string> allowed_hosts;  // without an API key: Host headers taken beyond this machine's own ("*": any)
  double stream_interval_ms = 2.0;        // a stream's events at most this often: faster tokens are joined
  bool bf16 = false;                      // the model's products in bfloat16 (CPU autocast, as `sample --dtype=bfloat16`)
  bool static_slots = false;              // the slots in a static KV cache, one graph-safe step a token (a model on a GPU: always)
  int64_t max_context = 0;                // tokens a prediction sees at most, each slot's cache length (> 0: static slots); 0 = block_size
};

}  // namespace nanogpt::serve
