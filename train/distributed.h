// Data-parallel training across processes and machines on PyTorch's own c10d: torchrun starts the
// processes and tells each one its place (RANK, WORLD_SIZE, ...); they meet at c10d's TCPStore and
// average gradients with Gloo (CPU) or NCCL (CUDA) all-reduces. Nothing here moves bytes itself.
//
//   torchrun --no-python --standalone --nproc_per_node=2 build/nanogpt train configs/shakespeare_char_cpu.yaml
//
// Without torchrun's variables a process trains alone, exactly as before.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace c10d {
class Store;
class Backend;
class Work;
}  // namespace c10d

namespace nanogpt::train {

/// What torchrun tells each process, read from its environment.
struct LaunchEnv {
  bool launched = false;  // torchrun's variables are there (even with WORLD_SIZE=1)
  int64_t rank = 0, local_rank = 0, world_size = 1, local_world_size = 1;
  std::string master_addr;
  int64_t master_port = 0;
  bool agent_store = false;   // TORCHELASTIC_USE_AGENT_STORE: torchrun's agent hosts the TCPStore
  int64_t restart_count = 0;  // TORCHELASTIC_RESTART_COUNT
  std::string elastic_run_id; // TORCHELASTIC_RUN_ID: torchrun's --rdzv-id (a fresh uuid with --standalone)

  /// Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. None set: one
  /// process. Some set, or a malformed one: throws "[ddp] ..." naming the variable.
  static LaunchEnv from_environment();
};

/// A failed collective or rendezvous: one line naming what was lost.
struct DistributedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One process's membership in the group: the store, the backend (Gloo on CPU, NCCL on CUDA) and a
/// heartbeat that tells the survivors which rank was lost when a collective fails.
class ProcessGroup {
 public:
  /// Rendezvous with the other ranks (waits up to `timeout` for them); every collective after it
  /// fails within `timeout` when a rank stops answering.
  /// `backend`: "gloo", "nccl", or "auto" (nccl for a CUDA device, gloo otherwise).
  ProcessGroup(const LaunchEnv& env, torch::Device device, const std::string& backend, std::chrono::seconds timeout);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }
  const char* backend_name() const { return backend_name_; }

  /// Sums each tensor over the ranks, in place; returns at once (wait() the works).
  std::vector<c10::intrusive_ptr<c10d::Work>> all_reduce_sum_async(const std::vector<torch::Tensor>& tensors);
  /// Waits for `works`; a failure throws DistributedError naming the lost rank(s).
  void wait(std::vector<c10::intrusive_ptr<c10d::Work>>& works, const char* during);
  /// Sums in place and waits.
  void all_reduce_sum(const std::vector<torch::Tensor>& tensors, const char* during);
  void barrier(const char* during);

  /// Every rank offers its `value` of `what` (a config's YAML, a data checksum); when one differs
  /// from rank 0's, every rank throws "[ddp] rank N was started with a different <what> than rank 0:
  /// rank N has '<line>' where rank 0 has '<line>' (<hint>)" (the first line that differs).
  void check_same(const std::string& what, const std::string& value, const std::string& hint);

  /// Rank 0's `value` of `what`, on every rank: a choice one rank makes for all (dtype auto's timed
  /// choice on a CPU, which two ranks could make differently near parity). The other ranks' values
  /// are not read.
  std::string value_of_rank0(const std::string& what, const std::string& value);

 private:
  [[noreturn]] void fail(const char* during, const std::string& cause);
  std::string lost_ranks_line();  // "lost rank 1" / "lost ranks 1, 3" / why it could not tell
  // lost_ranks_line's reading of the heartbeats (may block on a store that vanished).
  static std::string read_lost_ranks(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world,
                                     const std::string& endpoint);
  void heartbeat_loop();

  int64_t rank_ = 0, world_size_ = 1;
  std::string endpoint_;  // MASTER_ADDR:MASTER_PORT
  const char* backend_name_ = "gloo";
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  std::atomic<bool> stop_heartbeat_{false};
  std::shared_ptr<std::atomic<bool>> heartbeat_done_ = std::make_shared<std::atomic<bool>>(false);
  std::thread heartbeat_;
  int64_t checks_ = 0;  // check_same calls so far (each uses its own keys)
};

/// Averages gradients across ranks as the backward pass produces them: the flat gradient buffers
/// (train/adamw.h) are cut into buckets of whole parameters, and a bucket's all-reduce starts as
/// soon as the last of its parameters has its gradient (a post-accumulate-grad hook), while the
/// backward pass goes on computing the earlier layers' gradients. Only the last micro-batch of a
/// step arms the hooks (the earlier ones only accumulate), as DDP's no_sync.
class GradientAllReduce {
 public:
  /// `params` with their `grads` (views into `flat_grads`, in the same order); buckets of about
  /// `bucket_bytes` (0: one bucket per flat buffer, launched after the backward pass).
  GradientAllReduce(ProcessGroup& group, const std::vector<torch::Tensor>& flat_grads,
                    const std::vector<torch::Tensor>& params, int64_t bucket_bytes);
  ~GradientAllReduce();
  /// Arms the hooks for the coming backward pass (the step's last micro-batch).
  void arm();
  /// After the backward pass: launches the buckets not started yet and waits for all.
  void finish();
  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  /// Per step, the milliseconds finish() waited: the all-reduce time the backward pass did not hide.
  const std::vector<double>& exposed_ms() const { return exposed_ms_; }

 private:
  struct Bucket {
    torch::Tensor slice;  // a contiguous range of one flat gradient buffer
    int64_t params = 0;   // parameters whose gradient lies in it
    int64_t ready = 0;    // of which this backward pass has produced so far
    c10::intrusive_ptr<c10d::Work> work;
  };
  void on_grad_ready(size_t bucket);
  void launch(Bucket& bucket);

  ProcessGroup& group_;
  std::vector<Bucket> buckets_;
  std::vector<torch::Tensor> hooked_;  // the parameters carrying our hook
  bool armed_ = false;
  std::vector<double> exposed_ms_;
};

}  // namespace nanogpt::train
