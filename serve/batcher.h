// Continuous batching: the sequences of every request in flight share each decode step. One
// thread runs the model: every step it takes waiting sequences into free slots (up to --parallel),
// draws one token for every sequence in a slot in one batched pass (model::SequenceStepper), and
// hands each request its new text; a finished or cancelled sequence leaves its slot at once. HTTP
// threads submit requests and read their events; nothing else touches the model.
// On a GPU the slots are those of a static KV cache (model::StaticDecoder): the sequences in flight
// are kept in its first slots, and a step replays the CUDA graph captured for the next bucket up
// (1, 2, 4, ... --parallel), so a sequence joining or leaving never captures anything again. A
// max_context puts the slots in a static cache of that many positions on the CPU too.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/vocab.h"
#include "model/generate.h"
#include "model/static_decoder.h"
#include "serve/metrics.h"
#include "serve/request.h"

namespace nanogpt::serve {

/// A generated token with its log-probability under the model (temperature 1) and, when asked,
/// the likeliest alternatives.
struct TokenInfo {
  std::string text;  // its piece: a character, several, or a byte of one (UTF-8 bytes)
  size_t offset = 0;  // where it starts in its choice's generated text, in bytes (text_offset, the prompt not counted)
  double logprob = 0.0;
  std::vector<std::pair<std::string, double>> top;  // up to `logprobs` alternatives, likeliest first
};

/// New output of one choice: text (whole characters) and the tokens it came from (a token whose
/// text straddles two events comes with the second; the last event's tokens may run past the text
/// when a stop string starts inside a token); `finish` set on
/// its last event ("stop": a stop string or the end; "length": max_tokens; "abort": the server stopped).
struct ChoiceEvent {
  int64_t index = 0;
  std::string text;
  std::vector<TokenInfo> tokens;
  std::optional<std::string> finish;
  int64_t generated = 0;  // on the last event: tokens the choice generated in all
};

/// One request in flight: its choices' events, read by the HTTP thread that serves it.
class Job {
 public:
  /// Waits up to `timeout` for events and moves them out, each choice's pending events joined into
  /// one (its text and tokens in order, the last one's finish): a client that reads slower than the
  /// tokens come gets fewer, longer events instead of falling behind. Events are held until
  /// `not_before` (a stream's interval between events), unless every choice has finished by then:
  /// a request's last events go at once. Returns false when every choice has finished; the events
  /// moved out then are the last ones.
  bool wait_events(std::vector<ChoiceEvent>& out, std::chrono::milliseconds timeout,
                   std::chrono::steady_clock::time_point not_before = {});
  /// The client went away: its sequences leave their slots at the next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  /// Set when the model failed for this request: on a step it was in (its choices there end with
  /// "abort"), or with non-finite logits for one of its choices (that choice alone ends).
  std::string error() const;

 private:
  friend class Batcher;
  void push(ChoiceEvent event);
  void fail(const std::string& message);
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<ChoiceEvent> events_;
  int64_t open_choices_ = 0;
  bool reader_waiting_ = false;  // in wait_events, past its hold: a push wakes it
  std::string error_;
  std::atomic<bool> cancelled_{false};
};

class Batcher {
 public:
  /// Starts the model's thread and returns once it has packed the decoder's weights (tens of
  /// milliseconds on the full-preset model). `model` and `vocab` must outlive the batcher.
  Batcher(model::GPT& model, const data::Vocab& vocab, const ServerOptions& options, Metrics& metrics,
          model::Quantize quantize = model::Quantize::none);
  ~Batcher();  // stop() and join
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  /// Queues every choice of `request` (prompts x n). Throws RequestError 503 when the queue has no
  /// room for them all (nothing queued then), or when the server is stopping.
  std::shared_ptr<Job> submit(const CompletionRequest& request);

  /// Runs `work` on the model's thread between two decode steps and returns when it has run,
  /// rethrowing what it threw (POST /v1/attention: the model is touched by this thread only).
  /// Throws RequestError 503 when the queue is full or the server is stopping.
  void run_on_model_thread(const std::function<void()>& work);

  /// Stops taking requests; the sequences in flight end with finish "abort" after their next
  /// token; those waiting end at once. Returns at once; the destructor joins.
  void stop();

  int64_t busy_slots() const { return busy_.load(); }
  int64_t queued() const;

 private:
  struct Choice;  // one sequence: its job, index, text so far and limits
  /// Work for the model's thread between steps (a beam search, attention weights): called with
  /// `abandon` true instead when the server stops first.
  using Task = std::function<void(bool abandon)>;
  void post(Task task, int64_t sequences);  // throws RequestError 503 as submit()
  /// Throws RequestError 503 unless `sequences` more fit the queue now (and the server is not
  /// stopping). Called with mutex_ held.
  void check_room(int64_t sequences) const;
  void beam(const std::shared_ptr<Job>& job, const CompletionRequest& request);
  void loop(std::promise<void>& prepared);  // sets `prepared` once the decoder is packed
  void step(std::vector<std::unique_ptr<Choice>>& active, model::SequenceStepper& stepper);
  /// The GPU's step: `active` in slots [0, n) of the static cache, one graph replay; each choice's
  /// token appended to its sequence. Logits only when a choice asks for log-probabilities.
  model::SequenceStepper::Step static_step(std::vector<std::unique_ptr<Choice>>& active);
  void finish(Choice& c, const std::string& reason);

  model::GPT& model_;
  const data::Vocab& vocab_;
  ServerOptions options_;
  Metrics& metrics_;
  model::Quantize quantize_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Choice>> queue_;
  std::deque<std::pair<Task, int64_t>> tasks_;  // with the sequences each counts for in the queue
  int64_t task_sequences_ = 0;
  bool stopping_ = false;
  std::atomic<bool> stop_requested_{false};  // for a beam search in progress
  std::atomic<int64_t> busy_{0};
  std::unique_ptr<model::SequenceStepper> stepper_;  // the model in eval mode while the batcher lives
  std::unique_ptr<model::StaticDecoder> slots_;      // a model on a GPU: the static cache and its graphs
  std::thread thread_;
};

}  // namespace nanogpt::serve
