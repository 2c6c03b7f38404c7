// The HTTP side of `nanogpt serve` (see server.h).
#include "serve/server.h"

#include <fmt/format.h>
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <random>
#include <stdexcept>
#include <thread>

#include "serve/batcher.h"
#include "serve/connections.h"
#include "serve/metrics.h"
#include "serve/playground_html.h"
#include "serve/request.h"
#include "viz/attention_explorer.h"

namespace nanogpt::serve {

using nlohmann::json;

bool constant_time_equal(const std::string& given, const std::string& expected) {
  const size_t n = std::max(given.size(), expected.size());
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    const unsigned char b = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    diff |= static_cast<unsigned>(a ^ b);
  }
  return diff == 0;
}

namespace {

// The JSON text of a response or event. Generated text can end in a character the model left
// incomplete (a subword tokenizer's byte pieces): such bytes are written as U+FFFD, not thrown on.
std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const RequestError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(json_text(e.body()), "application/json");
}

// `prefix`: the echoed prompt's bytes in front of the generated text (text_offset counts them).
json logprobs_json(const std::vector<TokenInfo>& tokens, bool with_top, size_t prefix) {
  json out{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
           {"text_offset", json::array()}};
  for (const auto& t : tokens) {
    out["tokens"].push_back(t.text);
    out["token_logprobs"].push_back(t.logprob);
    out["text_offset"].push_back(prefix + t.offset);
    if (with_top) {
      json top = json::object();
      for (const auto& [text, lp] : t.top) top[text] = lp;
      out["top_logprobs"].push_back(top);
    }
  }
  if (!with_top) out["top_logprobs"] = nullptr;
  return out;
}

std::string completion_id() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return fmt::format("cmpl-{:x}{:06x}", salt, counter.fetch_add(1));
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// The address and port of a socket's end (getsockname / getpeername).
void socket_address(int sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  ip.clear();
  port = 0;
  if ((peer ? ::getpeername(sock, reinterpret_cast<sockaddr*>(&address), &length)
            : ::getsockname(sock, reinterpret_cast<sockaddr*>(&address), &length)) != 0)
    return;
  char text[INET6_ADDRSTRLEN] = "";
  if (address.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    port = ntohs(a->sin6_port);
  }
  ip = text;
}

// One whole request, read by the front door (serve/connections.h), as cpp-httplib reads it; the
// answer goes to the connection's socket.
class RequestStream : public httplib::Stream {
 public:
  RequestStream(int sock, std::string request, time_t write_timeout_s)
      : sock_(sock), request_(std::move(request)), write_timeout_ms_(static_cast<int>(write_timeout_s * 1000)) {}
  bool is_readable() const override { return at_ < request_.size(); }
  bool is_writable() const override {  // false once the client has gone
    pollfd p{sock_, POLLOUT, 0};
    return ::poll(&p, 1, write_timeout_ms_) > 0 && (p.revents & POLLOUT) && !client_gone(sock_);
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - at_);
    std::copy_n(request_.data() + at_, n, ptr);
    at_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override { return ::send(sock_, ptr, size, MSG_NOSIGNAL); }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { socket_address(sock_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { socket_address(sock_, false, ip, port); }
  // cpp-httplib asks for it only to refuse descriptors past select()'s FD_SETSIZE (1,024), and
  // this stream never selects: it polls. A connection past that count is answered as the others.
  socket_t socket() const override { return -1; }

 private:
  int sock_;
  std::string request_;
  size_t at_ = 0;
  int write_timeout_ms_;
};

// cpp-httplib's server, its connections handed to the front door as they are accepted, and each
// whole request it reads answered by cpp-httplib's own parsing and routing.
class Listener : public httplib::Server {
 public:
  // cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's
  // library): a burst of clients connecting at once overflowed it, and some were reset. Calling
  // listen() again on the bound socket sets a deeper backlog (Linux allows it).
  void deepen_backlog(int backlog) { ::listen(svr_sock_, backlog); }
  /// Answers one request; whether the connection stays open.
  bool answer(httplib::Stream& request) {
    bool closed = false;
    return process_request(request, /*close_connection=*/false, closed, nullptr) && !closed;
  }
  Connections* front_door = nullptr;

 private:
  bool process_and_close_socket(socket_t sock) override {
    front_door->add(sock);
    return true;
  }
};

// The accepting thread's task queue: a connection goes to the front door at once; shutting down
// (the server stopping) waits for the requests being answered.
class FrontDoorQueue : public httplib::TaskQueue {
 public:
  explicit FrontDoorQueue(Connections& door) : door_(door) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { door_.shutdown(); }

 private:
  Connections& door_;
};

// A Host header's name without its port ("[::1]:8080" -> "::1").
std::string host_name(const std::string& host) {
  if (!host.empty() && host.front() == '[') return host.substr(1, host.find(']') - 1);
  return host.substr(0, host.find(':'));
}

// The media type of a Content-Type header, lower case, without parameters.
std::string media_type(const std::string& content_type) {
  std::string type = content_type.substr(0, content_type.find(';'));
  type.erase(std::remove(type.begin(), type.end(), ' '), type.end());
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
  return type;
}

ConnectionLimits connection_limits(const ServerOptions& o) {
  ConnectionLimits limits;
  limits.max_connections = o.max_connections;
  limits.workers = std::max<int64_t>(2, o.connections);
  limits.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
  limits.request_timeout = std::chrono::milliseconds(o.read_timeout_s * 1000);
  return limits;
}

struct Server::Impl {
  Impl(model::GPT& model, const data::Vocab& v, const ServerOptions& o, model::Quantize q)
      : model(model),
        vocab(v),
        options(o),
        batcher(model, v, o, metrics, q),
        front_door(
            connection_limits(o),
            [this](int sock, std::string request) {
              RequestStream stream(sock, std::move(request), options.write_timeout_s);
              return http.answer(stream);
            },
            [](int status, const std::string& message, const std::string& code) {
              return json_text(RequestError(status, message, "", code).body());
            },
            [this](int status) { metrics.request(status); }) {
    http.front_door = &front_door;
  }

  model::GPT& model;
  const data::Vocab& vocab;
  ServerOptions options;
  Metrics metrics;
  Batcher batcher;
  Listener http;
  Connections front_door;  // after http: its workers answer through it, and end first
  std::atomic<int64_t> open_streams{0};
  std::atomic<bool> stopping{false};

  void routes();
  bool host_allowed(const httplib::Request& req) const;
  void completions(const httplib::Request& req, httplib::Response& res);
  void attention(const httplib::Request& req, httplib::Response& res);
};

void Server::Impl::routes() {
  http.new_task_queue = [this] { return new FrontDoorQueue(front_door); };
  http.set_payload_max_length(static_cast<size_t>(options.max_body_bytes));
  http.set_read_timeout(options.read_timeout_s, 0);
  http.set_write_timeout(options.write_timeout_s, 0);
  http.set_keep_alive_timeout(5);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!host_allowed(req)) {
      send_error(res, RequestError(403,
                                   fmt::format("the Host header ({}) names another server: without an API key this "
                                               "one answers only to its own address and localhost (--allowed_hosts "
                                               "adds names, e.g. behind a proxy)",
                                               req.get_header_value("Host")),
                                   "", "host_not_allowed", "permission_error"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.method == "POST" && media_type(req.get_header_value("Content-Type")) != "application/json") {
      send_error(res, RequestError(415,
                                   fmt::format("the body must be JSON, sent with the header 'Content-Type: "
                                               "application/json' (got '{}')",
                                               req.get_header_value("Content-Type")),
                                   "", "unsupported_media_type"));
      return httplib::Server::HandlerResponse::Handled;
    }
    // The page itself holds no data (its requests carry the key); /health is for probes.
    if (options.api_key.empty() || req.path == "/health" || (req.path == "/" && req.method == "GET"))
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.compare(0, prefix.size(), prefix) == 0 && constant_time_equal(auth.substr(prefix.size()), options.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, RequestError(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'", "",
                                 "invalid_api_key", "authentication_error"));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413)
      send_error(res, RequestError(413, "the request body is too large (see --max_body_bytes)", "", "body_too_large"));
    else if (res.status == 404)
      send_error(res, RequestError(404, fmt::format("no such endpoint: {} {}", req.method, req.path), "", "not_found"));
    else
      send_error(res, RequestError(res.status, fmt::format("HTTP {}", res.status), "", "http_error"));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const RequestError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, RequestError(500, e.what(), "", "internal_error", "server_error"));
    } catch (...) {
      send_error(res, RequestError(500, "unknown failure", "", "internal_error", "server_error"));
    }
  });
  http.set_logger([this](const httplib::Request&, const httplib::Response& res) { metrics.request(res.status); });

  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(std::string(kPlaygroundHtml), "text/html; charset=utf-8");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json_text(json{{"status", stopping ? "stopping" : "ok"}}), "application/json");
    if (stopping) res.status = 503;
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json model{{"id", options.model_name}, {"object", "model"}, {"created", unix_time()}, {"owned_by", "nanogpt"}};
    res.set_content(json_text(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.text(batcher.queued(), batcher.busy_slots(), options.parallel),
                    "text/plain; version=0.0.4");
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    const json j = parse_json_object(req.body);
    if (!j.contains("content") || !j.at("content").is_string())
      throw RequestError(400, "content must be a string", "content", "invalid_type");
    const auto ids = encode_text(j.at("content").get<std::string>(), vocab, "content");
    res.set_content(json_text(json{{"tokens", ids}}), "application/json");
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    const json j = parse_json_object(req.body);
    if (!j.contains("tokens") || !j.at("tokens").is_array())
      throw RequestError(400, "tokens must be a list of token ids", "tokens", "invalid_type");
    std::vector<int64_t> ids;
    for (const auto& t : j.at("tokens")) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab.size())
        throw RequestError(400, fmt::format("tokens must be integers in [0, {}), found {}", vocab.size(), json_text(t)),
                           "tokens");
      ids.push_back(t.get<int64_t>());
    }
    res.set_content(json_text(json{{"content", vocab.decode(ids)}}), "application/json");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
  http.Post("/v1/attention", [this](const httplib::Request& req, httplib::Response& res) { attention(req, res); });
}

// A browser on a page of another site can reach a server on this machine through a name that
// resolves here (DNS rebinding): without an API key, only this machine's own names are answered.
bool Server::Impl::host_allowed(const httplib::Request& req) const {
  if (!options.api_key.empty() || !req.has_header("Host")) return true;  // (HTTP/1.0 clients send none)
  const std::string name = host_name(req.get_header_value("Host"));
  if (name == "localhost" || name == "127.0.0.1" || name == "::1" || name == req.local_addr || name == options.host)
    return true;
  return std::any_of(options.allowed_hosts.begin(), options.allowed_hosts.end(),
                     [&](const std::string& allowed) { return allowed == "*" || allowed == name; });
}

// Every head's attention weights over a text (the attention explorer's data, viz/attention_explorer.h):
// one forward pass on the model's thread, between two decode steps.
void Server::Impl::attention(const httplib::Request& req, httplib::Response& res) {
  const int64_t limit = std::min(options.max_attention_tokens, model->config().block_size);
  const AttentionRequest request = parse_attention_request(req.body, vocab, limit);
  if (stopping) throw RequestError(503, "the server is shutting down", "", "shutting_down", "server_error");
  const auto T = static_cast<int64_t>(request.tokens.size());
  viz::ExplorerData explorer;
  batcher.run_on_model_thread([&] {
    const auto device = model->parameters().front().device();
    const torch::Tensor idx = torch::tensor(request.tokens, torch::kLong).view({1, T}).to(device);  // (1, T)
    for (const torch::Tensor& map : model->attention_maps(idx))  // per layer (1, nh, T, T)
      explorer.layers.push_back(map[0].to(torch::kCPU, torch::kFloat));
  });
  for (int64_t id : request.tokens) explorer.tokens.push_back(vocab.decode_one(id));
  explorer.prompt_tokens = request.prompt_tokens;
  explorer.title = fmt::format("attention | {} | {} prompt + {} generated tokens", options.model_name,
                               request.prompt_tokens, T - request.prompt_tokens);
  if (request.html) {
    res.set_content(viz::attention_explorer_html(explorer), "text/html; charset=utf-8");
    return;
  }
  json out = viz::attention_explorer_json(explorer);
  out["object"] = "attention";
  out["model"] = options.model_name;
  out["dropped"] = request.dropped;
  res.set_content(json_text(out), "application/json");
}

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  const auto request = std::make_shared<CompletionRequest>(parse_completion_request(req.body, vocab, options));
  if (stopping) throw RequestError(503, "the server is shutting down", "", "shutting_down", "server_error");
  auto job = batcher.submit(*request);
  const std::string id = completion_id();
  const int64_t created = unix_time();
  const bool with_logprobs = request->logprobs.has_value();
  const bool with_top = with_logprobs && *request->logprobs > 0;
  const auto prompt_of = [request](int64_t index) -> const std::string& { return request->prompt_texts[index / request->n]; };

  if (!request->stream) {
    const size_t choices = request->prompts.size() * request->n;
    std::vector<std::string> texts(choices);
    std::vector<std::vector<TokenInfo>> tokens(choices);
    std::vector<std::string> finish(choices);
    int64_t completion_tokens = 0, prompt_tokens = 0;
    for (const auto& p : request->prompts) prompt_tokens += static_cast<int64_t>(p.size()) * request->n;
    std::vector<ChoiceEvent> events;
    const int connection = current_connection();
    for (bool more = true; more;) {
      more = job->wait_events(events, std::chrono::milliseconds(100));
      if (more && client_gone(connection)) job->cancel();  // its choices leave their slots at the next step
      for (auto& e : events) {
        texts[e.index] += e.text;
        for (auto& t : e.tokens) tokens[e.index].push_back(std::move(t));
        if (e.finish) {
          finish[e.index] = *e.finish;
          completion_tokens += e.generated;
        }
      }
    }
    if (!job->error().empty()) throw RequestError(500, job->error(), "", "model_error", "server_error");
    json out{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", options.model_name},
             {"choices", json::array()}};
    for (size_t i = 0; i < choices; ++i) {
      const std::string prefix = request->echo ? prompt_of(static_cast<int64_t>(i)) : "";
      out["choices"].push_back({{"text", prefix + texts[i]},
                                {"index", i},
                                {"logprobs", with_logprobs ? logprobs_json(tokens[i], with_top, prefix.size()) : json(nullptr)},
                                {"finish_reason", finish[i]}});
    }
    out["usage"] = {{"prompt_tokens", prompt_tokens},
                    {"completion_tokens", completion_tokens},
                    {"total_tokens", prompt_tokens + completion_tokens}};
    res.set_content(json_text(out), "application/json");
    return;
  }

  // Streaming: one `data: {...}` event per batch of new text, a last one per choice with its
  // finish_reason, then `data: [DONE]`. The provider runs on this connection's thread.
  ++open_streams;
  auto started = std::make_shared<std::set<int64_t>>();  // the choices whose first event has gone
  auto last_write = std::make_shared<std::chrono::steady_clock::time_point>();  // the first event goes at once
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job, id, created, with_logprobs, with_top, request, prompt_of, started, last_write](size_t,
                                                                                                  httplib::DataSink& sink) {
        // Events at most every --stream_interval milliseconds: tokens that come faster are joined
        // (Job::wait_events), so a fast model does not cost its client a read and a parse a token.
        const auto interval = std::chrono::duration<double, std::milli>(options.stream_interval_ms);
        std::vector<ChoiceEvent> events;
        const bool more = job->wait_events(
            events, std::chrono::milliseconds(50),
            *last_write + std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval));
        if (!events.empty()) *last_write = std::chrono::steady_clock::now();
        for (auto& e : events) {
          std::string text = e.text;
          if (started->insert(e.index).second && request->echo)  // the choice's first event: the echoed prompt in front
            text = prompt_of(e.index) + text;
          const size_t prefix = request->echo ? prompt_of(e.index).size() : 0;
          json choice{{"text", text}, {"index", e.index},
                      {"logprobs", with_logprobs ? logprobs_json(e.tokens, with_top, prefix) : json(nullptr)},
                      {"finish_reason", e.finish ? json(*e.finish) : json(nullptr)}};
          json chunk{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", options.model_name},
                     {"choices", json::array({choice})}};
          const std::string line = "data: " + json_text(chunk) + "\n\n";
          if (!sink.write(line.data(), line.size())) {  // the client went away: free its slots now
            job->cancel();
            return false;
          }
        }
        if (!more) {
          if (!job->error().empty()) {
            const std::string line = "data: " + json_text(RequestError(500, job->error(), "", "model_error", "server_error").body()) + "\n\n";
            sink.write(line.data(), line.size());
          }
          static const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        }
        if (events.empty() && !sink.is_writable()) {
          job->cancel();
          return false;
        }
        return true;
      },
      [this, job](bool) {
        job->cancel();  // no effect once every choice has finished
        --open_streams;
      });
}

Server::Server(model::GPT& model, const data::Vocab& vocab, const ServerOptions& options, model::Quantize quantize)
    : impl_(std::make_unique<Impl>(model, vocab, options, quantize)) {
  impl_->routes();
}

Server::~Server() {
  stop();
}

int Server::bind() {
  const auto& o = impl_->options;
  const int backlog = static_cast<int>(std::min<int64_t>(4096, std::max<int64_t>(128, o.connections + o.queue)));
  if (o.port == 0) {
    const int port = impl_->http.bind_to_any_port(o.host);
    if (port <= 0) throw std::runtime_error(fmt::format("[serve] cannot listen on {} (is it an address of this machine?)", o.host));
    impl_->http.deepen_backlog(backlog);
    return port;
  }
  if (!impl_->http.bind_to_port(o.host, o.port))
    throw std::runtime_error(fmt::format(
        "[serve] cannot listen on {}:{}: the port is taken or the address is not this machine's (try --port=0 for any free port)",
        o.host, o.port));
  impl_->http.deepen_backlog(backlog);
  return o.port;
}

void Server::run() { impl_->http.listen_after_bind(); }

void Server::stop() {
  if (impl_->stopping.exchange(true)) return;
  impl_->batcher.stop();  // every choice in flight gets its last event
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(impl_->options.drain_timeout_s);
  while (impl_->open_streams > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  impl_->http.stop();
}

}  // namespace nanogpt::serve
