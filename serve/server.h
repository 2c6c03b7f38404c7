// `nanogpt serve`'s HTTP server: OpenAI's /v1/completions (JSON, or server-sent events when
// streaming), /v1/models, /tokenize, /detokenize, /health, /metrics and the playground page at /,
// on cpp-httplib, over the continuous batcher (serve/batcher.h).
#pragma once

#include <memory>

#include "data/vocab.h"
#include "model/generate.h"
#include "serve/options.h"

namespace nanogpt::serve {

class Server {
 public:
  /// `model` and `vocab` must outlive the server; the server holds the model in eval mode.
  Server(model::GPT& model, const data::Vocab& vocab, const ServerOptions& options,
         model::Quantize quantize = model::Quantize::none);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds options.host:options.port (port 0: a free port) and returns the port. Throws
  /// std::runtime_error ("[serve] ...") when it cannot.
  int bind();
  /// Serves until stop(); returns once every connection has ended.
  void run();
  /// From any thread (a signal watcher): refuses new completions (503), ends the streams in flight
  /// with a final event (finish_reason "abort") within options.drain_timeout_s, stops accepting and
  /// makes run() return.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Whether `given` equals `expected`, in time that depends only on their lengths' maximum (no early exit).
bool constant_time_equal(const std::string& given, const std::string& expected);

}  // namespace nanogpt::serve
