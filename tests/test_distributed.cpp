// Data-parallel training (train/distributed.h) end to end: the nanogpt program started as two CPU
// processes (Gloo, one thread each) with torchrun's variables, against one process doing the same
// step's micro-batches itself. Checked: equal losses iteration by iteration; rank 0 alone writes;
// Ctrl-C saves once and resumes exactly; a checkpoint moves between 1 and 2 processes; a killed rank
// stops the other within the timeout with one line naming it; mismatched ranks are refused; a choice
// one rank makes (dtype auto) reaches every rank.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shell.h"
#include "train/checkpoint.h"
#include "train/distributed.h"
#include "train/distributed_backends.h"
#include "train/run_id.h"
#include "train_fixture.h"

extern char** environ;

using namespace nanogpt;
using namespace nanogpt::testing;

namespace {

using Clock = std::chrono::steady_clock;

// A TCP port nothing listens on now (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The tiny run of the training tests, as a YAML file: 2 micro-batches per step, dropout 0.1.
std::string write_config(const std::string& dir, int64_t max_iters) {
  auto c = tiny_config(dir);
  c.gradient_accumulation_steps = 2;
  c.max_iters = max_iters;
  c.lr_decay_iters = max_iters;
  const std::string path = dir + "/tiny.yaml";
  std::ofstream(path) << train::to_yaml(c);
  return path;
}

std::vector<std::string> train_args(const std::string& config, const std::string& out_dir,
                                    const std::vector<std::string>& more = {}) {
  std::vector<std::string> a{NANOGPT_BINARY, "train", config, "--out_dir=" + out_dir};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Two processes of `args` with torchrun's variables (ranks 0 and 1 on one machine).
std::vector<Proc> start_pair(const std::vector<std::string>& args0, const std::vector<std::string>& args1,
                             const std::string& stem, int port) {
  std::vector<Proc> procs;
  for (int r = 0; r < 2; ++r)
    procs.push_back(start(r == 0 ? args0 : args1,
                          {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r), "WORLD_SIZE=2",
                           "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)},
                          stem + "_rank" + std::to_string(r)));
  return procs;
}

// (iter, split) -> loss from a metrics.csv.
std::map<std::pair<int64_t, std::string>, double> losses(const std::string& metrics_csv) {
  std::map<std::pair<int64_t, std::string>, double> rows;
  for (const auto& r : metrics_rows(metrics_csv)) {
    if (r.loss.empty() || r.split.empty()) continue;  // a row being written (wait_for_iter reads a live file)
    rows[{r.iter, r.split}] = std::stod(r.loss);
  }
  return rows;
}

void expect_same_losses(const std::string& a_csv, const std::string& b_csv, double rel) {
  const auto a = losses(a_csv), b = losses(b_csv);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size()) << a_csv << " vs " << b_csv;
  for (const auto& [key, loss] : a) {
    ASSERT_TRUE(b.count(key)) << "iter " << key.first << " " << key.second;
    EXPECT_NEAR(b.at(key), loss, rel * std::abs(loss)) << "iter " << key.first << " " << key.second;
  }
}

// Waits until out_dir/metrics.csv has a train row at or past `iter`.
bool wait_for_iter(const std::string& metrics_csv, int64_t iter, std::chrono::seconds timeout = std::chrono::seconds(60)) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (std::filesystem::exists(metrics_csv))
      for (const auto& [key, loss] : losses(metrics_csv))
        if (key.second == "train" && key.first >= iter) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class Distributed : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!train::has_gloo()) GTEST_SKIP() << "this build has no Gloo (install libgloo-dev and rebuild)";
  }
};

}  // namespace

TEST_F(Distributed, TwoProcessesLogTheLossesOfOneProcess) {
  TempDir dir("ddp_equal");
  const auto config = write_config(dir.path, 20);
  auto one = start(train_args(config, dir.path + "/one"), {}, dir.path + "/one");
  ASSERT_EQ(wait_for(one), 0) << read_text(one.err);
  // Buckets of 8 KB: several all-reduces, started from the backward pass's hooks; 0: one per
  // flat buffer after it. Both must give one process's numbers.
  for (const std::string bucket : {"0.008", "0"}) {
    const std::string out = dir.path + "/two_" + bucket;
    const auto args = train_args(config, out, {"--ddp_bucket_mb=" + bucket});
    auto procs = start_pair(args, args, out, free_port());
    const int rc0 = wait_for(procs[0]), rc1 = wait_for(procs[1]);
    ASSERT_EQ(rc0, 0) << read_text(procs[0].err);
    ASSERT_EQ(rc1, 0) << read_text(procs[1].err);
    expect_same_losses(dir.path + "/one/metrics.csv", out + "/metrics.csv", 1e-5);
    // Rank 0 alone speaks and writes.
    EXPECT_EQ(read_text(procs[1].out), "");
    EXPECT_EQ(read_text(procs[1].err), "");
    const std::string log0 = read_text(procs[0].out);
    EXPECT_NE(log0.find("[ddp] 2 processes (gloo), 1 of the 2 micro-batches per step each"), std::string::npos) << log0;
    EXPECT_EQ(count(read_text(out + "/train.log"), "[eval] iter 20 "), 1);
    EXPECT_EQ(count(read_text(out + "/train.log"), "[ckpt] saved"), 4);  // last + best at iters 10 and 20
  }
}

// Two hosts for real: two network namespaces joined by a veth pair, one torchrun node in each
// (scripts/two_hosts.sh). The hostname resolves to loopback in both, as on Debian's default
// /etc/hosts: each rank's Gloo device must listen on the address that routes to MASTER_ADDR, not on
// 127.0.0.1 (then the mesh timed out). The losses are one process's.
TEST_F(Distributed, TwoHostsJoinedByAVethPairTrainAsOneProcess) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces";
  if (std::system("command -v ip >/dev/null 2>&1") != 0) GTEST_SKIP() << "no 'ip' command (Debian: iproute2)";
  TempDir dir("two_hosts");
  const auto config = write_config(dir.path, 12);
  auto one = start(train_args(config, dir.path + "/one"), {}, dir.path + "/one");
  ASSERT_EQ(wait_for(one), 0) << read_text(one.err);
  const std::string out = dir.path + "/two";
  const std::string command = "NANOGPT_BIN=" + std::string(NANOGPT_BINARY) + " " + NANOGPT_SOURCE_DIR +
                              "/scripts/two_hosts.sh " + config + " " + out + " --ddp_timeout=30 > " + dir.path +
                              "/two_hosts.out 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_text(dir.path + "/two_hosts.out") << read_text(out + "/node0.log");
  expect_same_losses(dir.path + "/one/metrics.csv", out + "/metrics.csv", 1e-5);
  EXPECT_NE(read_text(out + "/node0.log").find("[ddp] 2 processes (gloo)"), std::string::npos);
}

// A machine that vanishes: two hosts in network namespaces, and one host's cable is cut (its end of
// the link goes down: no reset reaches the other) as its process is killed. The survivor stops within
// ddp_timeout and a few seconds with one line, whichever host was lost: when it was rank 0's, the
// store it held does not answer either (reading it hung the survivor before).
TEST_F(Distributed, ACutCableStopsTheSurvivorWithinTheTimeoutWhicheverHostIsLost) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces";
  if (std::system("command -v ip >/dev/null 2>&1") != 0) GTEST_SKIP() << "no 'ip' command (Debian: iproute2)";
  for (const int victim : {1, 0}) {
    SCOPED_TRACE("lost rank " + std::to_string(victim));
    TempDir dir("cut_cable_" + std::to_string(victim));
    const std::string tag = std::to_string(::getpid() % 10000) + std::to_string(victim);
    const std::string ns[2] = {"ngcutA" + tag, "ngcutB" + tag}, link[2] = {"vcA" + tag, "vcB" + tag};
    auto sh = [](const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()); };
    ASSERT_EQ(sh("ip netns add " + ns[0] + " && ip netns add " + ns[1] + " && ip link add " + link[0] +
                 " type veth peer name " + link[1] + " && ip link set " + link[0] + " netns " + ns[0] + " && ip link set " +
                 link[1] + " netns " + ns[1] + " && ip -n " + ns[0] + " addr add 10.231.8.1/24 dev " + link[0] +
                 " && ip -n " + ns[1] + " addr add 10.231.8.2/24 dev " + link[1] + " && ip -n " + ns[0] + " link set " +
                 link[0] + " up && ip -n " + ns[1] + " link set " + link[1] + " up && ip -n " + ns[0] +
                 " link set lo up && ip -n " + ns[1] + " link set lo up"),
              0);
    struct Cleanup {
      std::string a, b;
      ~Cleanup() { std::system(("ip netns del " + a + " 2>/dev/null; ip netns del " + b + " 2>/dev/null").c_str()); }
    } cleanup{ns[0], ns[1]};
    const auto config = write_config(dir.path, 100000);
    const std::string out = dir.path + "/out", port = std::to_string(free_port());
    std::vector<Proc> procs;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> argv{"ip", "netns", "exec", ns[r]};
      for (const auto& a : train_args(config, out, {"--ddp_timeout=15", "--eval_interval=20"})) argv.push_back(a);
      procs.push_back(start(argv,
                            {"RANK=" + std::to_string(r), "LOCAL_RANK=0", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=1",
                             "MASTER_ADDR=10.231.8.1", "MASTER_PORT=" + port},
                            out + "_rank" + std::to_string(r)));
    }
    ASSERT_TRUE(wait_for_iter(out + "/metrics.csv", 25)) << read_text(procs[0].err) << read_text(procs[1].err);
    sh("ip -n " + ns[victim] + " link set " + link[victim] + " down");
    ::kill(procs[victim].pid, SIGKILL);
    const auto t0 = Clock::now();
    const int rc = wait_for(procs[1 - victim], std::chrono::seconds(60));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    wait_for(procs[victim]);
    EXPECT_NE(rc, 0);
    EXPECT_NE(rc, -1) << "the survivor hung";
    EXPECT_LT(seconds, 15.0 + 8.0);
    // One error line, the last (before it, LibTorch may warn that the namespace's address has no name).
    const std::string err = read_text(procs[1 - victim].err);
    EXPECT_EQ(count(err, "error:"), 1) << err;
    EXPECT_EQ(err.rfind('\n', err.size() - 2), err.rfind("\nerror:")) << err;
    EXPECT_NE(err.find(victim == 1 ? "error: [ddp] rank 0: lost rank 1 " : "error: [ddp] rank 1: lost the store at 10.231.8.1"),
              std::string::npos)
        << err;
  }
}

TEST(GlooEndpoints, NamedInterfacesElseTheRouteToTheMaster) {
  ::setenv("GLOO_SOCKET_IFNAME", "eth0,eth1", 1);
  EXPECT_EQ(train::gloo_endpoints("10.0.0.1"), (std::vector<std::string>{"interface:eth0", "interface:eth1"}));
  ::unsetenv("GLOO_SOCKET_IFNAME");
  EXPECT_EQ(train::gloo_endpoints("127.0.0.1"), std::vector<std::string>{"address:127.0.0.1"});
  EXPECT_EQ(train::route_source_address("127.0.0.1"), "127.0.0.1");
  try {
    train::route_source_address("no-such-host.invalid");
    FAIL() << "an unresolvable MASTER_ADDR was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("[ddp] MASTER_ADDR 'no-such-host.invalid' does not resolve"), std::string::npos)
        << e.what();
  }
}

TEST_F(Distributed, CtrlCSavesOnceAndTheResumedRunMatchesAnUninterruptedOne) {
  TempDir dir("ddp_sigint");
  const auto config = write_config(dir.path, 120);
  const std::string whole = dir.path + "/whole", cut = dir.path + "/cut";
  {
    auto procs = start_pair(train_args(config, whole), train_args(config, whole), whole, free_port());
    ASSERT_EQ(wait_for(procs[0]), 0) << read_text(procs[0].err);
    ASSERT_EQ(wait_for(procs[1]), 0) << read_text(procs[1].err);
  }
  // The interrupted run would go on much longer; Ctrl-C reaches both processes (a terminal's
  // process group) once it has taken a few steps.
  const auto long_run = train_args(config, cut, {"--max_iters=100000"});
  auto procs = start_pair(long_run, long_run, cut, free_port());
  ASSERT_TRUE(wait_for_iter(cut + "/metrics.csv", 5)) << read_text(procs[0].err);
  ::kill(procs[0].pid, SIGINT);
  ::kill(procs[1].pid, SIGINT);
  EXPECT_EQ(wait_for(procs[0]), 130) << read_text(procs[0].err);
  EXPECT_EQ(wait_for(procs[1]), 130) << read_text(procs[1].err);
  const std::string log = read_text(cut + "/train.log");
  ASSERT_EQ(count(log, "signal 2 received"), 1) << log;
  const auto stopped = train::read_checkpoint_meta(cut + "/" + train::kLastCheckpoint);
  ASSERT_LT(stopped.iter, 120) << "the run ended before Ctrl-C reached it";
  EXPECT_EQ(stopped.world_size, 2);
  // Resumed with 2 processes up to the uninterrupted run's end: the same losses, bit for bit.
  const auto resume = train_args(config, cut, {"--init_from=resume"});
  auto again = start_pair(resume, resume, cut + "_resumed", free_port());
  ASSERT_EQ(wait_for(again[0]), 0) << read_text(again[0].err);
  ASSERT_EQ(wait_for(again[1]), 0) << read_text(again[1].err);
  EXPECT_EQ(train_losses(whole + "/metrics.csv"), train_losses(cut + "/metrics.csv"));
}

TEST_F(Distributed, ACheckpointMovesBetweenOneAndTwoProcesses) {
  TempDir dir("ddp_move");
  const auto config = write_config(dir.path, 20);
  const std::string whole = dir.path + "/whole";
  {
    auto procs = start_pair(train_args(config, whole), train_args(config, whole), whole, free_port());
    ASSERT_EQ(wait_for(procs[0]), 0) << read_text(procs[0].err);
    ASSERT_EQ(wait_for(procs[1]), 0) << read_text(procs[1].err);
  }
  // 2 processes to iter 10, then 1 to the end; and 1 to iter 10, then 2.
  for (const bool two_first : {true, false}) {
    const std::string out = dir.path + (two_first ? "/two_then_one" : "/one_then_two");
    const auto first = train_args(config, out, {"--max_iters=10"});
    const auto second = train_args(config, out, {"--init_from=resume"});
    auto run_one = [&](const std::vector<std::string>& args, const std::string& stem) {
      auto p = start(args, {}, stem);
      ASSERT_EQ(wait_for(p), 0) << read_text(p.err);
    };
    auto run_two = [&](const std::vector<std::string>& args, const std::string& stem) {
      auto procs = start_pair(args, args, stem, free_port());
      ASSERT_EQ(wait_for(procs[0]), 0) << read_text(procs[0].err);
      ASSERT_EQ(wait_for(procs[1]), 0) << read_text(procs[1].err);
    };
    if (two_first) {
      run_two(first, out + "_a");
      run_one(second, out + "_b");
    } else {
      run_one(first, out + "_a");
      run_two(second, out + "_b");
    }
    const std::string said = read_text(out + "_b" + (two_first ? "" : "_rank0") + ".out");
    EXPECT_NE(said.find(two_first ? "[ddp] the checkpoint was written by 2 processes, resuming with 1"
                                   : "[ddp] the checkpoint was written by 1 process, resuming with 2"),
              std::string::npos)
        << said;
    expect_same_losses(whole + "/metrics.csv", out + "/metrics.csv", 1e-5);
  }
}

TEST_F(Distributed, AKilledRankStopsTheOtherWithinTheTimeoutNamingIt) {
  TempDir dir("ddp_kill");
  const auto config = write_config(dir.path, 100000);
  const std::string out = dir.path + "/out";
  const auto args = train_args(config, out, {"--ddp_timeout=20", "--eval_interval=20"});
  auto procs = start_pair(args, args, out, free_port());
  ASSERT_TRUE(wait_for_iter(out + "/metrics.csv", 25)) << read_text(procs[0].err);
  ::kill(procs[1].pid, SIGKILL);
  const auto t0 = Clock::now();
  const int rc = wait_for(procs[0], std::chrono::seconds(60));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(wait_for(procs[1]), 128 + SIGKILL);
  EXPECT_NE(rc, 0);
  EXPECT_NE(rc, -1) << "rank 0 hung";
  EXPECT_LT(seconds, 20.0);
  const std::string err = read_text(procs[0].err);
  EXPECT_EQ(err.rfind("error: [ddp] rank 0: lost rank 1 ", 0), 0u) << err;
  EXPECT_EQ(count(err, "\n"), 1) << err;
  EXPECT_NE(err.find("--init_from=resume"), std::string::npos) << err;
  // The last checkpoint still loads.
  EXPECT_NO_THROW(train::load_model(out + "/" + train::kLastCheckpoint));
}

// NCCL on two GPUs: a killed rank, and a frozen one (SIGSTOP: its sockets stay open, so only the
// timeout can tell), stop the survivor within ddp_timeout and a few seconds, with Gloo's one line.
// LibTorch's defaults would not: its wait() returns at once and its watchdog aborts the process
// with a stack dump; the program asks for a blocking wait at start-up (runtime/environment.h).
TEST(DistributedNccl, AKilledOrFrozenRankStopsTheOtherWithinTheTimeoutNamingIt) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2)
    GTEST_SKIP() << "needs two CUDA GPUs (NCCL puts one rank on each)";
  for (const int sig : {SIGKILL, SIGSTOP}) {
    SCOPED_TRACE(sig == SIGKILL ? "SIGKILL" : "SIGSTOP");
    TempDir dir(sig == SIGKILL ? "nccl_kill" : "nccl_stop");
    const auto config = write_config(dir.path, 100000);
    const std::string out = dir.path + "/out";
    const auto args =
        train_args(config, out, {"--ddp_timeout=15", "--eval_interval=20", "--device=cuda", "--backend=nccl"});
    auto procs = start_pair(args, args, out, free_port());
    ASSERT_TRUE(wait_for_iter(out + "/metrics.csv", 25, std::chrono::seconds(120))) << read_text(procs[0].err);
    ::kill(procs[1].pid, sig);
    const auto t0 = Clock::now();
    const int rc = wait_for(procs[0], std::chrono::seconds(60));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (sig == SIGSTOP) ::kill(procs[1].pid, SIGKILL);
    wait_for(procs[1]);
    EXPECT_NE(rc, 0);
    EXPECT_NE(rc, -1) << "rank 0 hung";
    EXPECT_LT(seconds, 15.0 + 10.0);
    const std::string err = read_text(procs[0].err);
    EXPECT_EQ(err.rfind("error: [ddp] rank 0: lost rank 1 ", 0), 0u) << err;
    EXPECT_EQ(count(err, "\n"), 1) << err;
  }
}

TEST_F(Distributed, RanksWithDifferentConfigsAreRefusedAtStartUp) {
  TempDir dir("ddp_mismatch");
  const auto config = write_config(dir.path, 20);
  const std::string out = dir.path + "/out";
  auto procs = start_pair(train_args(config, out), train_args(config, out, {"--learning_rate=0.002"}), out, free_port());
  auto lr = [](double v) {  // as to_yaml writes it
    auto c = train::TrainConfig();
    c.learning_rate = v;
    const auto yaml = train::to_yaml(c);
    const auto at = yaml.find("learning_rate: ") + 15;
    return yaml.substr(at, yaml.find('\n', at) - at);
  };
  const int rc0 = wait_for(procs[0], std::chrono::seconds(60)), rc1 = wait_for(procs[1], std::chrono::seconds(60));
  EXPECT_EQ(rc0, 1);
  EXPECT_EQ(rc1, 1);
  for (const auto& p : procs) {
    const std::string err = read_text(p.err);
    EXPECT_NE(err.find("error: [ddp] rank 1 was started with a different config than rank 0: rank 1 has "
                       "'learning_rate: " + lr(0.002) + "' where rank 0 has 'learning_rate: " + lr(0.003) + "'"),
              std::string::npos)
        << err;
    EXPECT_EQ(count(err, "\n"), 1) << err;
  }
  EXPECT_FALSE(std::filesystem::exists(out + "/" + train::kLastCheckpoint));
}

TEST_F(Distributed, RanksWithDifferentDataAreRefusedAtStartUp) {
  TempDir dir("ddp_data");
  const auto config = write_config(dir.path, 20);
  // Rank 1's copy of the corpus differs in one character.
  std::filesystem::create_directories(dir.path + "/other");
  std::string text = read_text(dir.path + "/data/input.txt");
  text[text.size() / 2] = text[text.size() / 2] == 'e' ? 'a' : 'e';
  std::ofstream(dir.path + "/other/input.txt", std::ios::binary) << text;
  const std::string out = dir.path + "/out";
  // Both ranks get the same --dataset (so their configs agree), a link that resolves to a different
  // folder on each, as two machines with different copies would.
  std::filesystem::create_directories(dir.path + "/r0");
  std::filesystem::create_directories(dir.path + "/r1");
  std::filesystem::create_directory_symlink(dir.path + "/data", dir.path + "/r0/corpus");
  std::filesystem::create_directory_symlink(dir.path + "/other", dir.path + "/r1/corpus");
  auto args = [&](int r) {
    return std::vector<std::string>{"/bin/sh", "-c",
                                    "cd " + dir.path + "/r" + std::to_string(r) + " && exec " + NANOGPT_BINARY +
                                        " train " + config + " --out_dir=" + out + " --dataset=./corpus"};
  };
  auto procs = start_pair(args(0), args(1), out, free_port());
  for (const auto& p : procs) {
    EXPECT_EQ(wait_for(p, std::chrono::seconds(60)), 1);
    const std::string err = read_text(p.err);
    EXPECT_NE(err.find("error: [ddp] rank 1 was started with a different dataset than rank 0: rank 1 has 'train "),
              std::string::npos)
        << err;
    EXPECT_EQ(count(err, "\n"), 1) << err;
  }
}

TEST_F(Distributed, AStepShareThatDoesNotDivideIsOneClearError) {
  TempDir dir("ddp_divide");
  const auto config = write_config(dir.path, 20);
  const std::string out = dir.path + "/out";
  const auto args = train_args(config, out, {"--gradient_accumulation_steps=3"});
  auto procs = start_pair(args, args, out, free_port());
  for (const auto& p : procs) {
    EXPECT_EQ(wait_for(p, std::chrono::seconds(60)), 1);
    EXPECT_NE(read_text(p.err).find("error: [ddp] gradient_accumulation_steps (3) must be divisible by the number of "
                                    "processes (2)"),
              std::string::npos)
        << read_text(p.err);
  }
}

TEST_F(Distributed, TorchrunLaunchesIt) {
  const std::string python = NANOGPT_PYTHON;
  const std::string torchrun = std::filesystem::path(python).parent_path() / "torchrun";
  if (python.empty() || !std::filesystem::exists(torchrun)) GTEST_SKIP() << "no torchrun beside " << python;
  TempDir dir("ddp_torchrun");
  const auto config = write_config(dir.path, 20);
  auto one = start(train_args(config, dir.path + "/one"), {}, dir.path + "/one");
  ASSERT_EQ(wait_for(one), 0) << read_text(one.err);
  std::vector<std::string> args{torchrun, "--no-python", "--standalone", "--nproc_per_node=2"};
  for (const auto& a : train_args(config, dir.path + "/two")) args.push_back(a);
  auto run = start(args, {}, dir.path + "/torchrun");
  ASSERT_EQ(wait_for(run), 0) << read_text(run.err);
  expect_same_losses(dir.path + "/one/metrics.csv", dir.path + "/two/metrics.csv", 1e-5);
}

// The pid of the `nanogpt train` process whose environment says RANK=<rank> and whose command line
// names `out_dir` (a torchrun worker), or -1.
pid_t worker_pid(int rank, const std::string& out_dir) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_text(entry.path() / "cmdline"), environ_text = read_text(entry.path() / "environ");
    for (auto* text : {&cmdline, &environ_text}) std::replace(text->begin(), text->end(), '\0', '\n');
    if (cmdline.find("\ntrain\n") != std::string::npos && cmdline.find("--out_dir=" + out_dir + "\n") != std::string::npos &&
        ("\n" + environ_text).find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos)
      return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// torchrun --max-restarts: rank 1 killed at a random iteration; torchrun restarts the group, which
// goes on from the last checkpoint (saved every 3 iterations, so steps are lost and done again), and
// the run's losses are those of a run that was never interrupted, bit for bit.
TEST_F(Distributed, TorchrunRestartsTheGroupAndTheRunGoesOnFromItsLastCheckpoint) {
  const std::string python = NANOGPT_PYTHON;
  const std::string torchrun = std::filesystem::path(python).parent_path() / "torchrun";
  if (python.empty() || !std::filesystem::exists(torchrun)) GTEST_SKIP() << "no torchrun beside " << python;
  TempDir dir("ddp_restart");
  const auto config = write_config(dir.path, 40);
  auto launch = [&](const std::string& out, const std::string& restarts) {
    std::vector<std::string> args{torchrun, "--no-python", "--standalone", "--nproc_per_node=2", "--max-restarts=" + restarts};
    for (const auto& a : train_args(config, out, {"--checkpoint_interval=3", "--eval_interval=20", "--ddp_timeout=20"}))
      args.push_back(a);
    return start(args, {}, out + "_torchrun");
  };
  auto whole = launch(dir.path + "/whole", "0");
  ASSERT_EQ(wait_for(whole), 0) << read_text(dir.path + "/whole_torchrun.err");
  std::mt19937 rng(static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  const int64_t kill_at = 5 + static_cast<int64_t>(rng() % 25);
  const std::string cut = dir.path + "/cut";
  auto run = launch(cut, "1");
  ASSERT_TRUE(wait_for_iter(cut + "/metrics.csv", kill_at)) << read_text(cut + "_torchrun.err");
  const pid_t victim = worker_pid(1, cut);
  ASSERT_GT(victim, 0) << "rank 1's process not found";
  ::kill(victim, SIGKILL);
  ASSERT_EQ(wait_for(run, std::chrono::seconds(180)), 0) << "killed at iter " << kill_at << "\n"
                                                          << read_text(cut + "_torchrun.err");
  const std::string log = read_text(cut + "/train.log");
  EXPECT_NE(log.find("[ckpt] torchrun restarted the workers (restart 1): resuming from"), std::string::npos) << log;
  EXPECT_EQ(train_losses(dir.path + "/whole/metrics.csv"), train_losses(cut + "/metrics.csv")) << "killed at iter " << kill_at;
}

// torchrun's variables for one process alone: the `restarts`-th start of torchrun launch `launch`.
std::vector<std::string> lone_worker_env(int restarts, const std::string& launch) {
  return {"RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=1", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1",
          "MASTER_PORT=" + std::to_string(free_port()), "TORCHELASTIC_RESTART_COUNT=" + std::to_string(restarts),
          "TORCHELASTIC_RUN_ID=" + launch};
}

std::string env_prefix(const std::vector<std::string>& env) {
  std::string prefix = "env";
  for (const auto& e : env) prefix += " " + e;
  return prefix + " ";
}

// A dataset named as in nanoGPT (--dataset=NAME, the folder data/NAME): a restarted group finds
// its own checkpoint and goes on from it, rather than starting afresh and overwriting it.
TEST_F(Distributed, ARestartedGroupResumesItsOwnCheckpointOfANamedDataset) {
  TempDir dir("ddp_restart_named");
  const auto config = write_config(dir.path, 16);
  std::filesystem::create_directories(dir.path + "/data/tiny");
  std::filesystem::copy_file(dir.path + "/data/input.txt", dir.path + "/data/tiny/input.txt");
  const std::string train = std::string(NANOGPT_BINARY) + " train " + config + " --out_dir=out --dataset=tiny ";
  const auto first = shell_captured("cd " + dir.path + " && " + env_prefix(lone_worker_env(0, "launch-7")) + train +
                                        "--max_iters=8",
                                    dir.path);
  ASSERT_EQ(first.rc, 0) << first.err;
  const auto restarted = shell_captured("cd " + dir.path + " && " + env_prefix(lone_worker_env(1, "launch-7")) + train,
                                        dir.path);
  ASSERT_EQ(restarted.rc, 0) << restarted.err;
  const std::string log = read_text(dir.path + "/out/train.log");
  EXPECT_NE(log.find("torchrun restarted the workers (restart 1): resuming from out/ckpt_last.safetensors"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("[ckpt] resumed from out/ckpt_last.safetensors at iter 8"), std::string::npos) << log;
  EXPECT_EQ(train::read_checkpoint_meta(dir.path + "/out/" + train::kLastCheckpoint).iter, 16);
}

// A new run in an older run's out_dir, killed before its first save: its restarted group starts
// afresh instead of going on from the older run's checkpoint (which, finished, would end the run
// at once without a step), and its checkpoints carry its own id.
TEST_F(Distributed, ARestartedGroupNeverResumesAnOlderRunsCheckpoint) {
  TempDir dir("ddp_restart_older");
  const auto config = write_config(dir.path, 8);
  const std::string out = dir.path + "/out";
  auto older = start(train_args(config, out), {}, dir.path + "/older");
  ASSERT_EQ(wait_for(older), 0) << read_text(older.err);
  const std::string older_id = train::read_checkpoint_meta(out + "/" + train::kLastCheckpoint).run_id;
  ASSERT_FALSE(older_id.empty());
  std::filesystem::remove(out + "/metrics.csv");  // so that the new run's own rows tell how far it got

  const std::vector<std::string> no_save = {"--max_iters=100000", "--eval_interval=100000"};
  auto killed = start(train_args(config, out, no_save), lone_worker_env(0, "launch-9"), dir.path + "/killed");
  ASSERT_TRUE(wait_for_iter(out + "/metrics.csv", 2)) << read_text(killed.err);
  ::kill(killed.pid, SIGKILL);
  ASSERT_EQ(wait_for(killed), 128 + SIGKILL);
  EXPECT_EQ(train::read_checkpoint_meta(out + "/" + train::kLastCheckpoint).run_id, older_id) << "a save happened";

  auto restarted = start(train_args(config, out), lone_worker_env(1, "launch-9"), dir.path + "/restarted");
  ASSERT_EQ(wait_for(restarted), 0) << read_text(restarted.err);
  const std::string log = read_text(out + "/train.log");
  EXPECT_NE(log.find("(restart 1): starting afresh, as '" + out + "/" + train::kLastCheckpoint +
                     "' was written by another run (run id '" + older_id + "'"),
            std::string::npos)
      << log;
  EXPECT_EQ(train_losses(out + "/metrics.csv").size(), 8u) << "the restarted run did not train from iter 0";
  const auto meta = train::read_checkpoint_meta(out + "/" + train::kLastCheckpoint);
  EXPECT_EQ(meta.iter, 8);
  EXPECT_NE(meta.run_id, older_id);
  EXPECT_EQ(meta.run_id, train::read_run_id(out).id);
}

// Without a checkpoint of this run, a restarted group starts afresh and says why.
TEST_F(Distributed, ARestartedGroupWithoutACheckpointStartsAfresh) {
  TempDir dir("ddp_restart_fresh");
  const auto config = write_config(dir.path, 8);
  const std::string out = dir.path + "/out";
  auto p = start(train_args(config, out), {"RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=1", "LOCAL_WORLD_SIZE=1",
                                           "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(free_port()),
                                           "TORCHELASTIC_RESTART_COUNT=2"},
                 out);
  ASSERT_EQ(wait_for(p), 0) << read_text(p.err);
  EXPECT_NE(read_text(out + "/train.log").find("torchrun restarted the workers (restart 2): starting afresh, as out_dir "
                                               "holds no checkpoint"),
            std::string::npos)
      << read_text(out + "/train.log");
}

// torchrun's variables, read: none means one process; a partial or malformed set is one error.
TEST(LaunchEnv, ReadsTorchrunsVariablesAndRefusesAPartialSet) {
  const char* names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  for (const char* n : names) ::unsetenv(n);
  EXPECT_FALSE(train::LaunchEnv::from_environment().launched);
  ::setenv("RANK", "1", 1);
  try {
    train::LaunchEnv::from_environment();
    ADD_FAILURE() << "a lone RANK was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("[ddp] WORLD_SIZE is not set"), std::string::npos) << e.what();
  }
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  const auto env = train::LaunchEnv::from_environment();
  EXPECT_TRUE(env.launched);
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  ::setenv("RANK", "2", 1);  // not below WORLD_SIZE
  EXPECT_THROW(train::LaunchEnv::from_environment(), std::runtime_error);
  ::setenv("RANK", "one", 1);
  EXPECT_THROW(train::LaunchEnv::from_environment(), std::runtime_error);
  for (const char* n : names) ::unsetenv(n);
}

// A choice one rank makes for all (dtype auto's timed choice): every rank gets rank 0's, whatever
// its own. Two ranks of one group as two threads of this process.
TEST_F(Distributed, EveryRankTakesRankZerosValue) {
  const int port = free_port();
  std::string got[2];
  std::string error[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        train::LaunchEnv env;
        env.launched = true;
        env.rank = env.local_rank = r;
        env.world_size = env.local_world_size = 2;
        env.master_addr = "127.0.0.1";
        env.master_port = port;
        train::ProcessGroup group(env, torch::kCPU, "gloo", std::chrono::seconds(30));
        got[r] = group.value_of_rank0("dtype", r == 0 ? "float32" : "bfloat16");
        // A second value gets keys of its own: not the first one's.
        got[r] += " " + group.value_of_rank0("dtype", r == 0 ? "bfloat16" : "float32");
        group.barrier("the end of the test");
      } catch (const std::exception& e) {
        error[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(error[0], "");
  EXPECT_EQ(error[1], "");
  EXPECT_EQ(got[0], "float32 bfloat16");
  EXPECT_EQ(got[1], "float32 bfloat16");
}
