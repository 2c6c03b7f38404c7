// Continuous batching (see batcher.h).
#include "serve/batcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <numeric>
#include <random>

#include "data/utf8.h"
#include "runtime/cuda_plugin.h"
#include "runtime/device.h"

namespace nanogpt::serve {

using Clock = std::chrono::steady_clock;

// ---- Job ----

bool Job::wait_events(std::vector<ChoiceEvent>& out, std::chrono::milliseconds timeout, Clock::time_point not_before) {
  std::vector<ChoiceEvent> pending;
  bool more;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto finished = [&] { return open_choices_ == 0; };
    if (Clock::now() < not_before) ready_.wait_until(lock, not_before, finished);
    reader_waiting_ = true;
    ready_.wait_for(lock, timeout, [&] { return !events_.empty() || finished(); });
    reader_waiting_ = false;
    pending.swap(events_);
    more = !finished();
  }
  out.clear();
  for (auto& e : pending) {  // one event a choice: its pending ones joined, in order
    auto same = std::find_if(out.begin(), out.end(), [&](const ChoiceEvent& o) { return o.index == e.index; });
    if (same == out.end()) {
      out.push_back(std::move(e));
      continue;
    }
    same->text += e.text;
    same->tokens.insert(same->tokens.end(), std::make_move_iterator(e.tokens.begin()),
                        std::make_move_iterator(e.tokens.end()));
    if (e.finish) {
      same->finish = std::move(e.finish);
      same->generated = e.generated;
    }
  }
  return more;
}

std::string Job::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Job::push(ChoiceEvent event) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (event.finish) --open_choices_;
    events_.push_back(std::move(event));
    // A reader holding its events for the stream interval wakes only for the end: waking it for
    // every token cost the model's thread a switch to it and back on a busy machine.
    wake = reader_waiting_ || open_choices_ == 0;
  }
  if (wake) ready_.notify_all();
}

void Job::fail(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  error_ = message;
}

// ---- Batcher ----

struct Batcher::Choice {
  std::shared_ptr<Job> job;
  int64_t index = 0;
  model::Sequence seq;
  int64_t prompt_tokens = 0, max_tokens = 0, generated = 0;
  int64_t slot = -1;                // its slot of the static KV cache (GPU), -1 before it has one
  std::vector<std::string> stop;
  std::optional<int64_t> logprobs;
  std::string text;                 // generated so far
  size_t sent = 0;                  // bytes of `text` handed to the job
  std::vector<TokenInfo> pending;   // tokens not yet handed over (the first may start before `sent`)
  Clock::time_point arrived, last_token;
};

Batcher::Batcher(model::GPT& model, const data::Vocab& vocab, const ServerOptions& options, Metrics& metrics,
                 model::Quantize quantize)
    : model_(model), vocab_(vocab), options_(options), metrics_(metrics), quantize_(quantize),
      stepper_(std::make_unique<model::SequenceStepper>(model, quantize)) {  // throws here, not in the thread
  if (options.static_slots || options.max_context > 0 || model->parameters().front().device().is_cuda())
    slots_ = std::make_unique<model::StaticDecoder>(model, options.parallel, options.bf16 ? torch::kBFloat16 : torch::kFloat,
                                                    /*exact_window=*/false, options.max_context);
  std::promise<void> prepared;
  auto ready = prepared.get_future();
  thread_ = std::thread([this, &prepared] { loop(prepared); });
  ready.wait();  // the decoder is packed before the server listens: its first request is not the slower
}

Batcher::~Batcher() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void Batcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_requested_ = true;
  wake_.notify_all();
}

int64_t Batcher::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(queue_.size()) + task_sequences_;
}

void Batcher::check_room(int64_t sequences) const {
  if (stopping_) throw RequestError(503, "the server is shutting down", "", "shutting_down", "server_error");
  const int64_t waiting = static_cast<int64_t>(queue_.size()) + task_sequences_;
  if (waiting + sequences > options_.queue)
    throw RequestError(503,
                       fmt::format("the queue is full ({} sequences waiting for {} slots, room for {}): retry shortly",
                                   waiting, options_.parallel, options_.queue),
                       "", "queue_full", "server_error");
}

void Batcher::post(Task task, int64_t sequences) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_room(sequences);
    tasks_.emplace_back(std::move(task), sequences);
    task_sequences_ += sequences;
  }
  wake_.notify_all();
}

void Batcher::run_on_model_thread(const std::function<void()>& work) {
  auto done = std::make_shared<std::promise<void>>();
  auto result = done->get_future();
  post(
      [done, &work](bool abandon) {  // `work` outlives the task: this thread waits for it below
        if (abandon) {
          done->set_exception(std::make_exception_ptr(
              RequestError(503, "the server is shutting down", "", "shutting_down", "server_error")));
          return;
        }
        try {
          work();
          done->set_value();
        } catch (...) {
          done->set_exception(std::current_exception());
        }
      },
      1);
  result.get();
}

std::shared_ptr<Job> Batcher::submit(const CompletionRequest& request) {
  auto job = std::make_shared<Job>();
  if (request.beam > 0) {  // one task on the model's thread: the whole search, then every choice at once
    const int64_t choices = static_cast<int64_t>(request.prompts.size()) * request.n;
    job->open_choices_ = choices;
    auto copy = std::make_shared<CompletionRequest>(request);
    post(
        [this, job, copy, choices](bool abandon) {
          if (!abandon) return beam(job, *copy);
          for (int64_t i = 0; i < choices; ++i) {
            ChoiceEvent event;
            event.index = i;
            event.finish = "abort";
            job->push(std::move(event));
          }
        },
        choices);
    return job;
  }
  std::vector<std::unique_ptr<Choice>> choices;
  const auto now = Clock::now();
  std::random_device entropy;
  const uint64_t base_seed = request.seed ? *request.seed : (static_cast<uint64_t>(entropy()) << 32 | entropy());
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    for (int64_t i = 0; i < request.n; ++i) {
      auto c = std::make_unique<Choice>();
      c->job = job;
      c->index = static_cast<int64_t>(p) * request.n + i;
      c->seq.tokens = request.prompts[p];
      c->seq.options = request.sampling;
      c->seq.rng.seed(base_seed + static_cast<uint64_t>(c->index));
      c->prompt_tokens = static_cast<int64_t>(request.prompts[p].size());
      c->max_tokens = request.max_tokens;
      c->stop = request.stop;
      c->logprobs = request.logprobs;
      c->arrived = c->last_token = now;
      choices.push_back(std::move(c));
    }
  }
  job->open_choices_ = static_cast<int64_t>(choices.size());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_room(static_cast<int64_t>(choices.size()));
    for (auto& c : choices) queue_.push_back(std::move(c));
  }
  wake_.notify_all();
  return job;
}

void Batcher::finish(Choice& c, const std::string& reason) {
  ChoiceEvent event;
  event.index = c.index;
  if (reason != "stop") {  // "length" and "abort" hand over what was held back for a stop string
    event.text = c.text.substr(c.sent);
    event.tokens = std::move(c.pending);
  }
  event.finish = reason;
  event.generated = c.generated;
  c.job->push(std::move(event));
  metrics_.finished(std::chrono::duration<double>(Clock::now() - c.arrived).count());
  metrics_.tokens(c.prompt_tokens, c.generated);
}

void Batcher::loop(std::promise<void>& prepared) {
  // Autocast is per thread: this one runs the model (the decoder packs its weights in bf16 under it).
  runtime::AutocastGuard autocast(torch::kCPU, torch::kBFloat16, options_.bf16);
  if (slots_ && model_->parameters().front().device().is_cuda()) {  // every bucket's graph before the first request
    const auto* plugin = runtime::cuda_plugin();
    const std::string failed = plugin ? slots_->capture(plugin->decode_graphs()) : "no CUDA plugin";
    if (!failed.empty()) std::fprintf(stderr, "[serve] CUDA graph capture failed, decoding kernel by kernel: %s\n", failed.c_str());
  } else if (!slots_) {
    try {
      stepper_->prepare();  // the first request need not wait for the decoder's weights to be packed
    } catch (const std::exception&) {
      // (out of memory for the packed copy) the steps then take the general path
    }
  }
  prepared.set_value();  // the constructor returns: `prepared` is gone after this
  std::vector<std::unique_ptr<Choice>> active;
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active.empty() || !tasks_.empty(); });
      if (stopping_) {
        for (auto& c : active) finish(*c, "abort");
        for (auto& c : queue_) finish(*c, "abort");
        for (auto& t : tasks_) t.first(/*abandon=*/true);
        active.clear();
        queue_.clear();
        tasks_.clear();
        task_sequences_ = 0;
        busy_ = 0;
        return;
      }
      if (!tasks_.empty()) {  // one task between two steps: the sequences in slots wait for it
        task = std::move(tasks_.front().first);
        task_sequences_ -= tasks_.front().second;
        tasks_.pop_front();
      }
      while (static_cast<int64_t>(active.size()) < options_.parallel && !queue_.empty()) {  // join between steps
        active.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (task) task(/*abandon=*/false);  // catches what it throws (it hands errors to its requester)
    // Leave at once: cancelled (the client went away) and nothing-to-generate choices.
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](std::unique_ptr<Choice>& c) {
                                  if (c->job->cancelled()) {
                                    finish(*c, "abort");
                                    return true;
                                  }
                                  if (c->max_tokens == 0) {
                                    finish(*c, "length");
                                    return true;
                                  }
                                  return false;
                                }),
                 active.end());
    busy_ = static_cast<int64_t>(active.size());
    if (!active.empty()) step(active, *stepper_);
    busy_ = static_cast<int64_t>(active.size());
  }
}

namespace {

// Where the earliest stop string starts in `text` at or after `from`, or npos.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops, size_t from) {
  size_t best = std::string::npos;
  for (const auto& s : stops) {
    const size_t start = from >= s.size() - 1 ? from - (s.size() - 1) : 0;  // a stop may begin in text already sent
    const size_t at = text.find(s, start);
    if (at != std::string::npos && (best == std::string::npos || at < best)) best = at;
  }
  return best;
}

// log(sum(exp(row))), shifted by the row's largest value.
double log_sum_exp(const float* row, int64_t V) {
  const float top = *std::max_element(row, row + V);
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
  return top + std::log(sum);
}

// Bytes at the end of `text` that could be the start of a stop string: held back until it is clear.
size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return hold;
}

}  // namespace

void Batcher::beam(const std::shared_ptr<Job>& job, const CompletionRequest& r) {
  const auto arrived = Clock::now();
  model::BeamOptions options;
  options.width = r.beam;
  options.quantize = quantize_;
  options.max_context = options_.max_context;
  size_t longest_stop = 0;
  for (const auto& s : r.stop) longest_stop = std::max(longest_stop, s.size());
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    const auto& prompt = r.prompts[p];
    const size_t P = prompt.size();
    bool interrupted = false;
    // A beam ends at a stop string (it lies in the last longest_stop tokens: a token is >= 1 byte),
    // and every beam ends when the client went away or the server stops.
    const auto finished = [&](const std::vector<int64_t>& tokens) {
      if (job->cancelled() || stop_requested_) return interrupted = true;
      if (r.stop.empty()) return false;
      const size_t from = std::max(P, tokens.size() > longest_stop ? tokens.size() - longest_stop : 0);
      const std::string tail = vocab_.decode(std::vector<int64_t>(tokens.begin() + static_cast<int64_t>(from), tokens.end()));
      return find_stop(tail, r.stop, 0) != std::string::npos;
    };
    std::vector<model::Beam> beams;
    try {
      beams = model::beam_search(model_, prompt, r.max_tokens, options, finished);
    } catch (const std::exception& e) {  // non-finite logits: this request's choices end
      job->fail(e.what());
    }
    for (int64_t i = 0; i < r.n; ++i) {
      ChoiceEvent event;
      event.index = static_cast<int64_t>(p) * r.n + i;
      if (i < static_cast<int64_t>(beams.size())) {
        const auto& b = beams[static_cast<size_t>(i)];
        event.text = vocab_.decode(std::vector<int64_t>(b.tokens.begin() + static_cast<int64_t>(P), b.tokens.end()));
        event.generated = b.generated;
        const size_t stop_at = r.stop.empty() ? std::string::npos : find_stop(event.text, r.stop, 0);
        if (stop_at != std::string::npos) {
          event.text.resize(stop_at);
          event.finish = "stop";
        } else {
          event.finish = interrupted ? "abort" : b.generated >= r.max_tokens ? "length" : "stop";
        }
      } else {
        event.finish = "abort";
      }
      metrics_.tokens(static_cast<int64_t>(P), event.generated);
      metrics_.finished(std::chrono::duration<double>(Clock::now() - arrived).count());
      job->push(std::move(event));
    }
  }
}

void Batcher::step(std::vector<std::unique_ptr<Choice>>& active, model::SequenceStepper& stepper) {
  std::vector<model::Sequence*> batch;
  for (auto& c : active) batch.push_back(&c->seq);
  model::SequenceStepper::Step out;
  try {
    out = slots_ ? static_step(active) : stepper.step(batch);
  } catch (const std::exception& e) {  // the step itself failed (out of memory): every choice of this step ends
    for (auto& c : active) {
      c->job->fail(e.what());
      finish(*c, "abort");
    }
    active.clear();
    return;
  }
  const auto now = Clock::now();
  // (the GPU's step brings logits back only when a choice asks for log-probabilities)
  const int64_t V = out.logits.defined() ? out.logits.size(1) : 0;
  const float* all_logits = out.logits.defined() ? out.logits.data_ptr<float>() : nullptr;
  std::vector<int64_t> order(V);
  std::vector<std::unique_ptr<Choice>> still;
  auto non_finite = out.non_finite.begin();  // rows in order
  for (size_t b = 0; b < active.size(); ++b) {
    Choice& c = *active[b];
    if (non_finite != out.non_finite.end() && *non_finite == static_cast<int64_t>(b)) {  // this choice alone ends
      ++non_finite;
      c.job->fail(fmt::format(
          "[serve] the model gave non-finite logits (NaN or inf) for choice {} after {} tokens: its weights are damaged "
          "or training diverged (serve an earlier checkpoint)",
          c.index, c.generated));
      finish(c, "abort");
      continue;
    }
    const int64_t token = c.seq.tokens.back();
    const float* row = all_logits + b * V;
    TokenInfo info;
    info.text = vocab_.decode_one(token);
    info.offset = c.text.size();
    // log-softmax at temperature 1 (the model's own log-probability of each token), only when asked:
    // V exps a sequence a step cost more than the rest of this loop (7443 characters: ~75 us)
    const double log_z = c.logprobs ? log_sum_exp(row, V) : 0.0;
    if (c.logprobs) info.logprob = row[token] - log_z;
    if (c.logprobs && *c.logprobs > 0) {
      std::iota(order.begin(), order.end(), 0);
      const int64_t k = std::min<int64_t>(*c.logprobs, V);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int64_t a, int64_t z) { return row[a] > row[z]; });
      for (int64_t i = 0; i < k; ++i) info.top.emplace_back(vocab_.piece(order[i]), row[order[i]] - log_z);
    }
    if (c.generated == 0) metrics_.first_token(std::chrono::duration<double>(now - c.arrived).count());
    else metrics_.inter_token(std::chrono::duration<double>(now - c.last_token).count());
    c.last_token = now;
    ++c.generated;
    c.text += info.text;
    c.pending.push_back(std::move(info));

    ChoiceEvent event;
    event.index = c.index;
    size_t until = c.text.size();  // hand over text[sent, until)
    const size_t stop_at = c.stop.empty() ? std::string::npos : find_stop(c.text, c.stop, c.sent);
    if (stop_at != std::string::npos) {
      until = stop_at;
      event.finish = "stop";
    } else if (c.generated >= c.max_tokens) {
      event.finish = "length";
    } else {
      // Held back: a stop string's possible start, and a character whose bytes have not all come
      // (a subword tokenizer's byte pieces split characters that its vocabulary lacks).
      until = c.text.size() - std::max(held_back(c.text, c.stop), data::incomplete_utf8_tail(c.text));
    }
    // The pending tokens that lie wholly before `until`; at a stop string, every one the text has a
    // part of. A subword piece may hold many characters, so `until` can fall inside a token, and a
    // token whose text went out in part is handed over with the event that completes it.
    const bool stopped = stop_at != std::string::npos;
    size_t taken = 0;
    for (; taken < c.pending.size(); ++taken) {
      const TokenInfo& t = c.pending[taken];
      if (stopped ? t.offset >= until : t.offset + t.text.size() > until) break;
    }
    event.text = c.text.substr(c.sent, until - c.sent);
    event.tokens.assign(std::make_move_iterator(c.pending.begin()), std::make_move_iterator(c.pending.begin() + taken));
    c.pending.erase(c.pending.begin(), c.pending.begin() + taken);
    c.sent = until;
    const bool done = event.finish.has_value();
    if (done) {
      event.generated = c.generated;
      metrics_.finished(std::chrono::duration<double>(now - c.arrived).count());
      metrics_.tokens(c.prompt_tokens, c.generated);
    }
    if (done || !event.text.empty() || !event.tokens.empty()) c.job->push(std::move(event));
    if (!done) still.push_back(std::move(active[b]));
  }
  active = std::move(still);
}

model::SequenceStepper::Step Batcher::static_step(std::vector<std::unique_ptr<Choice>>& active) {
  const int64_t n = static_cast<int64_t>(active.size());
  bool logprobs = false;
  // Choices keep their order in `active` and leave from anywhere in it: each one's slot moves down to
  // its index (slots only ever move down, onto a slot already left), and a new one starts at its index.
  for (int64_t i = 0; i < n; ++i) {
    Choice& c = *active[i];
    if (c.slot < 0) {
      slots_->set_options(i, c.seq.options);
      slots_->start(i, c.seq.tokens);
    } else {
      slots_->move(c.slot, i);
    }
    c.slot = i;
    if (slots_->needs_restart(i)) slots_->start(i, c.seq.tokens);
    logprobs = logprobs || c.logprobs.has_value();
  }
  const auto tokens = slots_->step(n);
  model::SequenceStepper::Step out;
  if (logprobs) out.logits = slots_->logits(n);
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) out.non_finite.push_back(i);
    else active[i]->seq.tokens.push_back(tokens[i]);
  }
  return out;
}

}  // namespace nanogpt::serve
