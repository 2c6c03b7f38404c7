// Data-parallel training across processes (see distributed.h).
#include "train/distributed.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <map>
#include <sstream>

#include "runtime/threads.h"
#include "train/distributed_backends.h"

namespace nanogpt::train {
namespace {

constexpr auto kHeartbeatPeriod = std::chrono::milliseconds(500);

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int64_t env_integer(const char* name, int64_t min_value) {
  const std::string text = env_text(name);
  if (text.empty())
    throw std::runtime_error(fmt::format(
        "[ddp] {} is not set, but other torchrun variables are: launch with torchrun (e.g. torchrun --no-python "
        "--standalone --nproc_per_node=2 nanogpt train CONFIG), or set RANK, LOCAL_RANK, WORLD_SIZE, "
        "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT together",
        name));
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < min_value)
    throw std::runtime_error(fmt::format("[ddp] {}='{}' is not an integer >= {} (torchrun sets it)", name, text, min_value));
  return value;
}

// The first line where `other` differs from `reference`: "rank 1 has 'x: 2' where rank 0 has 'x: 1'".
std::string first_difference(int64_t rank, const std::string& other, const std::string& reference) {
  std::istringstream so(other), sr(reference);
  std::string lo, lr;
  for (;;) {
    const bool go = static_cast<bool>(std::getline(so, lo)), gr = static_cast<bool>(std::getline(sr, lr));
    if (!go && !gr) return "";
    if (!go || !gr || lo != lr)
      return fmt::format("rank {} has '{}' where rank 0 has '{}'", rank, go ? lo : "(nothing)", gr ? lr : "(nothing)");
  }
}

std::string beat_key(int64_t rank) { return fmt::format("beat/{}", rank); }  // a rank's heartbeat counter

std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv env;
  const char* names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  env.launched = std::any_of(std::begin(names), std::end(names), [](const char* n) { return !env_text(n).empty(); });
  if (!env.launched) return env;
  env.world_size = env_integer("WORLD_SIZE", 1);
  env.rank = env_integer("RANK", 0);
  env.local_rank = env_integer("LOCAL_RANK", 0);
  env.local_world_size = env_integer("LOCAL_WORLD_SIZE", 1);
  env.master_port = env_integer("MASTER_PORT", 1);
  env.master_addr = env_text("MASTER_ADDR");
  if (env.master_addr.empty())
    throw std::runtime_error("[ddp] MASTER_ADDR is not set, but other torchrun variables are (launch with torchrun)");
  if (env.rank >= env.world_size || env.local_rank >= env.local_world_size || env.local_world_size > env.world_size ||
      env.master_port > 65535)
    throw std::runtime_error(fmt::format(
        "[ddp] inconsistent torchrun variables: RANK={} WORLD_SIZE={} LOCAL_RANK={} LOCAL_WORLD_SIZE={} MASTER_PORT={} "
        "(launch with torchrun rather than by hand)",
        env.rank, env.world_size, env.local_rank, env.local_world_size, env.master_port));
  env.agent_store = env_text("TORCHELASTIC_USE_AGENT_STORE") == "True";
  const std::string restarts = env_text("TORCHELASTIC_RESTART_COUNT");
  env.restart_count = restarts.empty() ? 0 : env_integer("TORCHELASTIC_RESTART_COUNT", 0);
  env.elastic_run_id = env_text("TORCHELASTIC_RUN_ID");
  return env;
}

ProcessGroup::ProcessGroup(const LaunchEnv& env, torch::Device device, const std::string& backend,
                           std::chrono::seconds timeout)
    : rank_(env.rank), world_size_(env.world_size) {
  endpoint_ = fmt::format("{}:{}", env.master_addr, env.master_port);
  const auto timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(env.master_port);
    // Under torchrun its agent already serves a store at MASTER_ADDR:MASTER_PORT (as Python's env://
    // rendezvous does, join it); launched by hand, rank 0 serves it.
    options.isServer = !env.agent_store && env.rank == 0;
    options.numWorkers = static_cast<size_t>(env.world_size);
    options.waitWorkers = false;
    options.timeout = timeout_ms;
    options.multiTenant = true;
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    if (env.agent_store)
      store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("/worker/attempt_{}", env.restart_count), store);
    store_ = c10::make_intrusive<c10d::PrefixStore>("nanogpt", store);
    auto backend_store = c10::make_intrusive<c10d::PrefixStore>("backend", store_);
    const int r = static_cast<int>(rank_), n = static_cast<int>(world_size_);
    if (backend == "nccl" || (backend == "auto" && device.is_cuda())) {
      backend_name_ = "nccl";
      backend_ = make_nccl_backend(backend_store, r, n, timeout_ms);
    } else {
      backend_name_ = "gloo";
      backend_ = make_gloo_backend(backend_store, r, n, timeout_ms, env.master_addr);
    }
  } catch (const std::exception& e) {
    if (std::string(e.what()).rfind("[ddp]", 0) == 0) throw;
    throw DistributedError(fmt::format(
        "[ddp] rank {} of {} could not meet the others at {} within {} s: {} (are all {} processes started, with the "
        "same MASTER_ADDR/MASTER_PORT? raise ddp_timeout for a slow start)",
        rank_, world_size_, endpoint_, timeout.count(), first_line(e.what()), world_size_));
  }
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

ProcessGroup::~ProcessGroup() {
  stop_heartbeat_ = true;
  if (!heartbeat_.joinable()) return;
  // A store on a machine that vanished (no reset, no reply) can hold the heartbeat in a read with no
  // end: let it go rather than hang the exit.
  for (int i = 0; i < 40 && !*heartbeat_done_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (*heartbeat_done_)
    heartbeat_.join();
  else
    heartbeat_.detach();
}

void ProcessGroup::heartbeat_loop() {
  struct Done {
    std::shared_ptr<std::atomic<bool>> flag;
    ~Done() { *flag = true; }
  } done{heartbeat_done_};
  const std::string key = beat_key(rank_);
  while (!stop_heartbeat_) {
    try {
      store_->add(key, 1);
    } catch (const std::exception&) {
      return;  // the store is gone: a failing collective will say so
    }
    for (auto slept = std::chrono::milliseconds(0); slept < kHeartbeatPeriod && !stop_heartbeat_;
         slept += std::chrono::milliseconds(50))
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string ProcessGroup::lost_ranks_line() {
  // Read on a thread of its own, with a deadline: when the store's machine is the one that vanished,
  // a read can wait for a reply that never comes (and the heartbeat may hold the store's lock so).
  auto answer = std::make_shared<std::promise<std::string>>();
  auto future = answer->get_future();
  // The thread holds its own references: it may outlive this object when the store never answers.
  std::thread([store = store_, rank = rank_, world = world_size_, endpoint = endpoint_, answer] {
    try {
      answer->set_value(read_lost_ranks(store, rank, world, endpoint));
    } catch (...) {
      answer->set_exception(std::current_exception());
    }
  }).detach();
  if (future.wait_for(kHeartbeatPeriod * 5 + std::chrono::seconds(2)) == std::future_status::ready) return future.get();
  return fmt::format("lost the store at {} (it does not answer: rank 0's machine, or the launcher's, is gone or "
                     "cut off)",
                     endpoint_);
}

std::string ProcessGroup::read_lost_ranks(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world,
                                          const std::string& endpoint) {
  // A rank's heartbeat counter that does not move over several periods belongs to a process that is
  // gone (killed, crashed, its machine lost) or frozen.
  try {
    auto read = [&] {
      std::vector<int64_t> beats(static_cast<size_t>(world));
      for (int64_t r = 0; r < world; ++r) beats[static_cast<size_t>(r)] = store->add(beat_key(r), 0);
      return beats;
    };
    const auto before = read();
    std::this_thread::sleep_for(kHeartbeatPeriod * 5);
    const auto after = read();
    std::vector<int64_t> lost;
    for (int64_t r = 0; r < world; ++r)
      if (r != rank && after[static_cast<size_t>(r)] == before[static_cast<size_t>(r)]) lost.push_back(r);
    if (lost.empty()) return "every rank's heartbeat is alive: one is stuck or the network failed";
    return fmt::format("lost rank{} {} (its heartbeat stopped: killed, crashed, frozen or its machine is gone)",
                       lost.size() > 1 ? "s" : "", fmt::join(lost, ", "));
  } catch (const std::exception&) {
    return fmt::format("lost the store at {} (it lives in rank 0's process, or in torchrun's agent): rank 0 or the "
                       "launcher is gone",
                       endpoint);
  }
}

void ProcessGroup::fail(const char* during, const std::string& cause) {
  throw DistributedError(fmt::format("[ddp] rank {}: {} during {}; stopping ({})", rank_, lost_ranks_line(), during,
                                     first_line(cause)));
}

std::vector<c10::intrusive_ptr<c10d::Work>> ProcessGroup::all_reduce_sum_async(const std::vector<torch::Tensor>& tensors) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  try {
    for (const auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      works.push_back(backend_->allreduce(one));
    }
  } catch (const std::exception& e) {
    fail("an all-reduce", e.what());
  }
  return works;
}

void ProcessGroup::wait(std::vector<c10::intrusive_ptr<c10d::Work>>& works, const char* during) {
  try {
    for (auto& w : works) w->wait();
  } catch (const std::exception& e) {
    fail(during, e.what());
  }
  works.clear();
}

void ProcessGroup::all_reduce_sum(const std::vector<torch::Tensor>& tensors, const char* during) {
  auto works = all_reduce_sum_async(tensors);
  wait(works, during);
}

void ProcessGroup::barrier(const char* during) {
  try {
    backend_->barrier()->wait();
  } catch (const std::exception& e) {
    fail(during, e.what());
  }
}

void ProcessGroup::check_same(const std::string& what, const std::string& value, const std::string& hint) {
  const std::string prefix = fmt::format("check/{}/", checks_++);
  std::map<int64_t, std::string> differing;
  try {
    store_->set(prefix + std::to_string(rank_), value);
    auto text = [&](int64_t r) {
      const auto bytes = store_->get(prefix + std::to_string(r));  // waits for rank r, up to the timeout
      return std::string(bytes.begin(), bytes.end());
    };
    const std::string reference = rank_ == 0 ? value : text(0);
    if (rank_ == 0) {
      for (int64_t r = 1; r < world_size_; ++r)
        if (auto other = text(r); other != reference) differing[r] = other;
    } else if (value != reference) {
      differing[rank_] = value;
    }
    if (differing.empty()) return;
    const auto& [r, other] = *differing.begin();
    throw DistributedError(fmt::format("[ddp] rank {} was started with a different {} than rank 0: {} ({})", r, what,
                                       first_difference(r, other, reference), hint));
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    fail(fmt::format("the start-up check of the {}", what).c_str(), e.what());
  }
}

std::string ProcessGroup::value_of_rank0(const std::string& what, const std::string& value) {
  const std::string key = fmt::format("rank0/{}/{}", checks_++, what);
  try {
    if (rank_ == 0) {
      store_->set(key, value);
      return value;
    }
    const auto bytes = store_->get(key);  // waits for rank 0, up to the timeout
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    fail(fmt::format("the wait for rank 0's {}", what).c_str(), e.what());
  }
}

// --- gradients ---------------------------------------------------------------------------------

namespace {

struct ReadyHook final : torch::autograd::PostAccumulateGradHook {
  std::function<void()> on_ready;
  explicit ReadyHook(std::function<void()> f) : on_ready(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { on_ready(); }
};

}  // namespace

GradientAllReduce::GradientAllReduce(ProcessGroup& group, const std::vector<torch::Tensor>& flat_grads,
                                     const std::vector<torch::Tensor>& params, int64_t bucket_bytes)
    : group_(group) {
  // Where each parameter's gradient lies: (flat buffer, first element, elements).
  struct Place {
    size_t flat;
    int64_t offset, numel;
    size_t param;
  };
  std::vector<Place> places;
  for (size_t p = 0; p < params.size(); ++p) {
    const auto& grad = params[p].grad();
    TORCH_CHECK(grad.defined(), "GradientAllReduce: a parameter has no gradient buffer");
    bool found = false;
    for (size_t f = 0; f < flat_grads.size() && !found; ++f) {
      const auto& flat = flat_grads[f];
      if (!flat.defined() || flat.numel() == 0) continue;
      const auto* base = static_cast<const char*>(flat.data_ptr());
      const auto* at = static_cast<const char*>(grad.data_ptr());
      const int64_t item = static_cast<int64_t>(flat.element_size());
      if (at >= base && at < base + flat.numel() * item) {
        places.push_back({f, (at - base) / item, grad.numel(), p});
        found = true;
      }
    }
    TORCH_CHECK(found, "GradientAllReduce: a parameter's gradient is not a view into the flat buffers");
  }
  std::sort(places.begin(), places.end(),
            [](const Place& a, const Place& b) { return a.flat != b.flat ? a.flat < b.flat : a.offset < b.offset; });
  // Buckets: runs of whole parameters within one flat buffer, each of at least bucket_bytes.
  std::vector<size_t> bucket_of(params.size());
  for (size_t i = 0; i < places.size();) {
    const size_t f = places[i].flat;
    const int64_t start = places[i].offset;
    int64_t end = start, count = 0;
    const int64_t item = static_cast<int64_t>(flat_grads[f].element_size());
    while (i < places.size() && places[i].flat == f &&
           (count == 0 || bucket_bytes <= 0 || (end - start) * item < bucket_bytes)) {
      end = places[i].offset + places[i].numel;
      bucket_of[places[i].param] = buckets_.size();
      ++count, ++i;
    }
    Bucket b;
    b.slice = flat_grads[f].narrow(0, start, end - start);
    b.params = count;
    buckets_.push_back(std::move(b));
  }
  if (bucket_bytes <= 0) return;  // launched by finish(), after the backward pass
  for (size_t p = 0; p < params.size(); ++p) {
    const size_t bucket = bucket_of[p];
    torch::autograd::impl::set_post_acc_grad_hooks(params[p],
                                                   std::make_unique<ReadyHook>([this, bucket] { on_grad_ready(bucket); }));
    hooked_.push_back(params[p]);
  }
}

GradientAllReduce::~GradientAllReduce() {
  for (auto& p : hooked_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

void GradientAllReduce::arm() {
  armed_ = true;
  for (auto& b : buckets_) b.ready = 0;
}

void GradientAllReduce::on_grad_ready(size_t bucket) {
  if (!armed_) return;
  auto& b = buckets_[bucket];
  if (++b.ready == b.params) launch(b);
}

void GradientAllReduce::launch(Bucket& bucket) {
  if (bucket.work) return;
  auto works = group_.all_reduce_sum_async({bucket.slice});
  bucket.work = works.front();
}

void GradientAllReduce::finish() {
  armed_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (auto& b : buckets_) {
    launch(b);  // buckets whose parameters got no gradient this pass (or no hooks at all)
    works.push_back(std::move(b.work));
    b.work.reset();
  }
  const auto t0 = runtime::Clock::now();
  group_.wait(works, "the gradient all-reduce");
  exposed_ms_.push_back(runtime::ms_since(t0));
}

}  // namespace nanogpt::train
