// The server's front door. One thread watches every open connection (epoll) and reads each request
// whole before a worker thread runs it: the head (request line and headers) up to a bound, the body
// up to --max_body_bytes by its Content-Length, all within --timeout seconds of the request's first
// byte. A silent or trickling client so costs a descriptor and the bytes it sent, never a worker; a
// body that cannot be bounded before it is read (chunked, compressed, without a length) is refused
// unread; connections past --max_connections are refused at once. Refusals are answered here, as
// HTTP 4xx/5xx with a JSON body, and the connection closes; a complete request goes to a worker,
// which returns the connection here when it stays open.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace nanogpt::serve {

struct ConnectionLimits {
  int64_t max_connections = 1024;  // open at once (idle, sending, being answered); more get 503 at once
  int64_t workers = 96;            // requests answered at once (their threads)
  size_t max_head_bytes = 32768;   // request line and headers
  size_t max_body_bytes = 1 << 20;
  std::chrono::milliseconds request_timeout{10000};     // a request's head and body, from its first byte
  std::chrono::milliseconds keep_alive_timeout{5000};   // an idle connection between requests
};

/// Answers one whole request (head and body, as the client sent them but for an Expect header) on
/// the connection `sock`; returns whether the connection stays open for another request.
using RequestRunner = std::function<bool(int sock, std::string request)>;
/// The JSON body of a refusal: (HTTP status, message, error code).
using RefusalBody = std::function<std::string(int status, const std::string& message, const std::string& code)>;
/// Called for every refusal sent here (the status), for the server's metrics.
using RefusalCounter = std::function<void(int status)>;

class Connections {
 public:
  Connections(const ConnectionLimits& limits, RequestRunner run, RefusalBody body, RefusalCounter counted);
  ~Connections();  // shutdown()
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  /// Takes a freshly accepted connection (and closes it when done). From the accepting thread.
  void add(int sock);
  /// Closes every connection not being answered, waits for the workers to finish the requests they
  /// run, and joins the threads. Connections added afterwards are closed at once.
  void shutdown();
  /// Connections open now.
  int64_t open() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The connection whose request this thread is answering (a worker's), or -1.
int current_connection();

/// Whether the client of `sock` has closed its side or reset the connection (a request's handler
/// then stops work the client can no longer receive). Bytes it sent after its request do not count.
bool client_gone(int sock);

}  // namespace nanogpt::serve
