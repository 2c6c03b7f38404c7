// The server's front door (see connections.h).
#include "serve/connections.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace nanogpt::serve {

using Clock = std::chrono::steady_clock;

namespace {

thread_local int answering = -1;

// A refused client has this long to stop sending before its connection is closed: closing a socket
// with unread bytes resets it, and the client may lose the answer it has not read yet.
constexpr auto kDrainTime = std::chrono::seconds(2);
constexpr size_t kReadChunk = 16384;
constexpr int kReadsATurn = 64;

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool same_letters(std::string_view a, std::string_view b) {  // ASCII, case-insensitive
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// What a request's head says of its body, or why it is refused before its body is read.
struct Head {
  size_t body_bytes = 0;
  bool expects_continue = false;
  std::string forwarded;  // the head as the worker gets it: without Expect (answered here)
  int refusal = 0;        // an HTTP status, or 0
  std::string message, code;
};

Head read_head(std::string_view head, size_t max_body_bytes) {
  Head h;
  const auto refuse = [&](int status, std::string message, const char* code) {
    h.refusal = status;
    h.message = std::move(message);
    h.code = code;
    return h;
  };
  const size_t line_end = head.find("\r\n");
  const std::string_view request_line = head.substr(0, line_end);
  const std::string_view method = request_line.substr(0, request_line.find(' '));
  h.forwarded.append(head.substr(0, line_end + 2));
  bool has_length = false;
  for (size_t at = line_end + 2; at < head.size();) {
    const size_t end = head.find("\r\n", at);
    const std::string_view line = head.substr(at, end - at);
    at = end + 2;
    const size_t colon = line.find(':');
    const std::string_view name = colon == std::string_view::npos ? line : trimmed(line.substr(0, colon));
    const std::string_view value = colon == std::string_view::npos ? std::string_view() : trimmed(line.substr(colon + 1));
    if (same_letters(name, "Expect") && same_letters(value, "100-continue")) {
      h.expects_continue = true;
      continue;
    }
    h.forwarded.append(line).append("\r\n");
    if (same_letters(name, "Transfer-Encoding"))
      return refuse(411, fmt::format("a request body must come with a Content-Length header (Transfer-Encoding: {} is not "
                                     "accepted): send the JSON as it is, with its length",
                                     value),
                    "length_required");
    if (same_letters(name, "Content-Encoding") && !same_letters(value, "identity"))
      return refuse(415, fmt::format("compressed request bodies (Content-Encoding: {}) are not accepted: send the JSON "
                                     "uncompressed",
                                     value),
                    "unsupported_encoding");
    if (same_letters(name, "Content-Length")) {
      const bool digits = !value.empty() && value.size() <= 18 &&
                          std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits) return refuse(400, fmt::format("Content-Length ({}) must be a number of bytes", value), "invalid_header");
      const size_t length = std::stoull(std::string(value));
      if (has_length && length != h.body_bytes)
        return refuse(400, "the request has two different Content-Length headers", "invalid_header");
      has_length = true;
      h.body_bytes = length;
    }
  }
  if (!has_length && (method == "POST" || method == "PUT" || method == "PATCH"))
    return refuse(411, "a request body needs a Content-Length header", "length_required");
  if (h.body_bytes > max_body_bytes)
    return refuse(413,
                  fmt::format("the request body is too large ({} bytes; at most {}, see --max_body_bytes)", h.body_bytes,
                              max_body_bytes),
                  "body_too_large");
  return h;
}

}  // namespace

int current_connection() { return answering; }

bool client_gone(int sock) {
  if (sock < 0) return false;
  pollfd p{sock, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

struct Connection {
  int sock = -1;
  std::string in;               // received, not yet handed to a worker
  Clock::time_point since;      // idle: since the last request; reading: the request's first byte
  bool reading = false;         // a request has begun to arrive
  bool continued = false;       // "100 Continue" sent for this request
  bool closed_by_client = false;  // the client sent its last byte
  bool busy = false;            // a worker is answering it
  bool draining = false;        // refused: its bytes are read and dropped until it closes
};

struct Connections::Impl {
  ConnectionLimits limits;
  RequestRunner run;
  RefusalBody body;
  RefusalCounter counted;
  int epoll_fd = -1, wake_fd = -1;
  std::unordered_map<int, std::unique_ptr<Connection>> connections;  // the watcher's own
  int64_t counted_open = 0;  // connections but the refused ones being drained (the watcher's)
  std::atomic<int64_t> open{0};

  std::mutex mutex;  // guards what follows
  std::condition_variable work_ready;
  std::deque<int> added;                            // accepted, for the watcher
  std::deque<std::pair<Connection*, bool>> returned;  // answered (and whether it stays open), for the watcher
  std::deque<std::pair<Connection*, std::string>> requests;  // whole requests, for the workers
  bool stop_workers = false, stop_watcher = false, shut = false;

  std::thread watcher;
  std::vector<std::thread> workers;

  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }
  void arm(Connection& c, bool first) {
    epoll_event e{};
    e.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
    e.data.fd = c.sock;
    ::epoll_ctl(epoll_fd, first ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.sock, &e);
  }
  void close(Connection& c) {
    if (!c.draining) --counted_open;
    ::close(c.sock);  // (also leaves the epoll set)
    --open;
    connections.erase(c.sock);
  }
  void refuse(Connection& c, int status, const std::string& message, const std::string& code);
  void take(Connection& c);
  void examine(Connection& c);
  void sweep();
  void watch();
  void work();
};

void Connections::Impl::refuse(Connection& c, int status, const std::string& message, const std::string& code) {
  const std::string json = body(status, message, code);
  const std::string reply =
      fmt::format("HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n{}",
                  status, reason_phrase(status), json.size(), status == 503 ? "Retry-After: 1\r\n" : "", json);
  [[maybe_unused]] const ssize_t sent = ::send(c.sock, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(c.sock, SHUT_WR);
  counted(status);
  if (!c.draining) --counted_open;
  c.draining = true;
  c.reading = false;
  std::string().swap(c.in);
  c.since = Clock::now();
  arm(c, false);
}

// Reads what the connection has sent (up to a whole request and a bit), then examines it.
void Connections::Impl::take(Connection& c) {
  char chunk[kReadChunk];
  const size_t cap = limits.max_head_bytes + limits.max_body_bytes + kReadChunk;
  for (int reads = 0; reads < kReadsATurn; ++reads) {  // then the other connections' turn
    const size_t want = c.draining ? sizeof chunk : std::min(sizeof chunk, cap - std::min(cap, c.in.size()));
    if (want == 0) break;  // more than a request: the rest waits for the worker
    const ssize_t got = ::recv(c.sock, chunk, want, MSG_DONTWAIT);
    if (got > 0) {
      if (c.draining) continue;
      if (!c.reading && c.in.empty()) c.since = Clock::now();
      c.reading = true;
      c.in.append(chunk, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    c.closed_by_client = true;  // 0: the client's last byte; < 0: reset
    if (c.draining || got < 0) return close(c);
    break;
  }
  if (c.draining) return arm(c, false);
  examine(c);
}

// A whole request goes to a worker; a refused one is answered here; otherwise wait for more bytes.
void Connections::Impl::examine(Connection& c) {
  if (c.in.empty()) {
    if (c.closed_by_client) return close(c);
    if (c.reading) c.since = Clock::now();  // idle from now
    c.reading = false;
    return arm(c, false);
  }
  c.reading = true;
  const size_t end = c.in.find("\r\n\r\n");
  if (end == std::string::npos || end + 4 > limits.max_head_bytes) {
    if (c.in.size() > limits.max_head_bytes || end != std::string::npos)
      return refuse(c, 431, fmt::format("the request line and headers are larger than {} bytes", limits.max_head_bytes),
                    "headers_too_large");
    if (c.closed_by_client) return close(c);
    return arm(c, false);
  }
  const size_t head_bytes = end + 4;
  Head head = read_head(std::string_view(c.in).substr(0, head_bytes), limits.max_body_bytes);
  if (head.refusal) return refuse(c, head.refusal, head.message, head.code);
  const size_t total = head_bytes + head.body_bytes;
  if (c.in.size() < total) {
    if (c.closed_by_client) return close(c);
    if (head.expects_continue && !c.continued) {
      static const std::string go_on = "HTTP/1.1 100 Continue\r\n\r\n";
      [[maybe_unused]] const ssize_t sent = ::send(c.sock, go_on.data(), go_on.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      c.continued = true;
    }
    return arm(c, false);
  }
  std::string request = std::move(head.forwarded);
  request.append(c.in, head_bytes, head.body_bytes);
  c.in.erase(0, total);
  c.reading = false;
  c.continued = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stop_workers) return refuse(c, 503, "the server is shutting down", "shutting_down");
    c.busy = true;
    requests.emplace_back(&c, std::move(request));
  }
  work_ready.notify_one();
}

// Drops connections past their time: a request that has not arrived whole (408), an idle one, a
// refused one still sending.
void Connections::Impl::sweep() {
  const auto now = Clock::now();
  std::vector<Connection*> late;
  for (auto& [sock, c] : connections) {
    if (c->busy) continue;
    const auto limit = c->draining ? std::chrono::duration_cast<std::chrono::milliseconds>(kDrainTime)
                       : c->reading ? limits.request_timeout
                                    : limits.keep_alive_timeout;
    if (now - c->since > limit) late.push_back(c.get());
  }
  for (Connection* c : late) {
    if (c->reading)
      refuse(*c, 408,
             fmt::format("the request did not arrive whole within {} s (see --timeout)", limits.request_timeout.count() / 1000.0),
             "request_timeout");
    else
      close(*c);
  }
}

void Connections::Impl::watch() {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (true) {
    const int n = ::epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), 50);
    std::deque<int> new_socks;
    std::deque<std::pair<Connection*, bool>> done;
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mutex);
      new_socks.swap(added);
      done.swap(returned);
      stopping = stop_watcher;
    }
    for (int sock : new_socks) {
      auto c = std::make_unique<Connection>();
      c->sock = sock;
      c->since = Clock::now();
      Connection& ref = *c;
      connections.emplace(sock, std::move(c));
      ++counted_open;
      arm(ref, true);
      if (counted_open > limits.max_connections)
        refuse(ref, 503, fmt::format("too many connections ({} open): retry shortly", limits.max_connections),
               "too_many_connections");
    }
    for (auto [c, keep] : done) {
      c->busy = false;
      if (!keep || stopping) close(*c);
      else examine(*c);  // the next request may be here already
    }
    if (stopping) break;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd) {
        uint64_t count;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd, &count, sizeof count);
        continue;
      }
      auto it = connections.find(events[i].data.fd);
      if (it != connections.end() && !it->second->busy) take(*it->second);
    }
    if (Clock::now() - last_sweep > std::chrono::milliseconds(50)) {
      sweep();
      last_sweep = Clock::now();
    }
  }
  // The workers have ended: every connection closes, those whose request never ran included.
  while (!connections.empty()) close(*connections.begin()->second);
}

void Connections::Impl::work() {
  while (true) {
    std::pair<Connection*, std::string> job;
    {
      std::unique_lock<std::mutex> lock(mutex);
      work_ready.wait(lock, [&] { return stop_workers || !requests.empty(); });
      if (requests.empty()) return;  // stopping, and nothing left to answer
      job = std::move(requests.front());
      requests.pop_front();
    }
    bool keep = false;
    answering = job.first->sock;
    try {
      keep = run(job.first->sock, std::move(job.second));
    } catch (...) {
      keep = false;  // (the runner answers what it can; a connection it could not answer closes)
    }
    answering = -1;
    {
      std::lock_guard<std::mutex> lock(mutex);
      returned.emplace_back(job.first, keep);
    }
    wake();
  }
}

Connections::Connections(const ConnectionLimits& limits, RequestRunner run, RefusalBody body, RefusalCounter counted)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.limits = limits;
  m.run = std::move(run);
  m.body = std::move(body);
  m.counted = std::move(counted);
  m.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  m.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m.epoll_fd < 0 || m.wake_fd < 0)
    throw std::system_error(errno, std::generic_category(), "[serve] cannot watch connections (epoll)");
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.fd = m.wake_fd;
  ::epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, m.wake_fd, &e);
  for (int64_t i = 0; i < std::max<int64_t>(1, limits.workers); ++i) m.workers.emplace_back([&m] { m.work(); });
  m.watcher = std::thread([&m] { m.watch(); });
}

Connections::~Connections() {
  shutdown();
  ::close(impl_->epoll_fd);
  ::close(impl_->wake_fd);
}

void Connections::add(int sock) {
  auto& m = *impl_;
  ++m.open;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    if (!m.shut) {
      m.added.push_back(sock);
      m.wake();
      return;
    }
  }
  ::close(sock);
  --m.open;
}

void Connections::shutdown() {
  auto& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    if (m.shut) return;
    m.shut = true;
    m.stop_workers = true;
  }
  m.work_ready.notify_all();
  for (auto& t : m.workers) t.join();  // they answer what is queued, then end
  {
    std::lock_guard<std::mutex> lock(m.mutex);
    m.stop_watcher = true;
  }
  m.wake();
  m.watcher.join();
}

int64_t Connections::open() const { return impl_->open.load(); }

}  // namespace nanogpt::serve
