// The two c10d backends, each in its own corner because their headers need more than LibTorch's:
// ProcessGroupGloo.hpp needs Gloo's headers (Debian: libgloo-dev; the wheel ships the library inside
// libtorch_cpu.so but not its headers): CMake defines NANOGPT_HAVE_GLOO for this file only when it
// found them (LibTorch's own USE_C10D_GLOO says what the library has, not what this machine can
// compile). ProcessGroupNCCL.hpp needs CUDA's and NCCL's headers and libtorch_cuda.so: it lives in
// the CUDA plugin (runtime/cuda_plugin.h), loaded only for a GPU run.
#include "train/distributed_backends.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#ifdef NANOGPT_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include "runtime/cuda_plugin.h"

namespace nanogpt::train {

std::string route_source_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0 || !found)
    throw std::runtime_error(fmt::format("[ddp] MASTER_ADDR '{}' does not resolve: {} (use an address or a name "
                                         "every machine resolves)",
                                         host, ::gai_strerror(rc)));
  std::string source;
  for (addrinfo* a = found; a && source.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char text[INET6_ADDRSTRLEN] = {};
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text, sizeof text, nullptr, 0, NI_NUMERICHOST) == 0)
      source = text;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (source.empty())
    throw std::runtime_error(fmt::format("[ddp] no route to MASTER_ADDR '{}' from this machine (check the address, or "
                                         "name the interface with GLOO_SOCKET_IFNAME)",
                                         host));
  return source;
}

std::vector<std::string> gloo_endpoints(const std::string& master_addr) {
  std::vector<std::string> endpoints;
  const char* names = std::getenv("GLOO_SOCKET_IFNAME");
  if (names && *names) {
    std::string list = names;
    for (size_t start = 0; start <= list.size();) {
      const size_t comma = std::min(list.find(',', start), list.size());
      if (comma > start) endpoints.push_back("interface:" + list.substr(start, comma - start));
      start = comma + 1;
    }
    if (!endpoints.empty()) return endpoints;
  }
  return {"address:" + route_source_address(master_addr)};
}

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, const std::string& master_addr) {
#ifdef NANOGPT_HAVE_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  std::vector<std::string> tried;
  for (const auto& endpoint : gloo_endpoints(master_addr)) {
    const std::string value = endpoint.substr(endpoint.find(':') + 1);
    try {
      options->devices.push_back(endpoint.rfind("interface:", 0) == 0
                                     ? c10d::ProcessGroupGloo::createDeviceForInterface(value)
                                     : c10d::ProcessGroupGloo::createDeviceForHostname(value));
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("[ddp] rank {} cannot listen on {} for Gloo: {} (GLOO_SOCKET_IFNAME names "
                                           "this machine's interfaces, e.g. eth0)",
                                           rank, endpoint, e.what()));
    }
    tried.push_back(options->devices.back()->str());
  }
  options->threads = 2;
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  } catch (const std::exception& e) {
    // The full mesh did not connect: say where this rank listened; the peers' addresses are theirs.
    throw std::runtime_error(fmt::format("this rank listened on {}: {}", fmt::join(tried, ", "), e.what()));
  }
#else
  (void)store, (void)rank, (void)size, (void)timeout, (void)master_addr;
  throw std::runtime_error(
      "[ddp] this nanogpt was built without Gloo's headers, so it cannot train on several CPU processes "
      "(install libgloo-dev and rebuild: scripts/setup.sh && scripts/build.sh)");
#endif
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  const runtime::CudaPlugin* plugin = runtime::cuda_plugin();  // loaded by resolve_device for a CUDA device
  if (!plugin)
    throw std::runtime_error(
        "[ddp] this nanogpt has no CUDA support loaded (a CPU-only LibTorch, or a CPU device), so it cannot train on "
        "several GPU processes with NCCL (build against the CUDA PyTorch wheel, or use backend: gloo / device: cpu)");
  return plugin->make_nccl_backend(store, rank, size, timeout);
}

bool has_gloo() {
#ifdef NANOGPT_HAVE_GLOO
  return true;
#else
  return false;
#endif
}


}  // namespace nanogpt::train
