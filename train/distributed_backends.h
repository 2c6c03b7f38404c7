// The c10d backends nanogpt can create (see distributed_backends.cpp for why they live apart).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace nanogpt::train {

/// Where this process's Gloo device listens, as c10d decides it in Python: one device for each
/// interface GLOO_SOCKET_IFNAME names (comma-separated: "eth0,eth1"); without it, the address this
/// machine reaches `master_addr` from (the route's source address), so that a peer on another
/// machine can reach it even where the host name resolves to loopback (Debian's /etc/hosts);
/// a loopback master_addr keeps loopback. Each entry is "interface:NAME" or "address:A.B.C.D".
std::vector<std::string> gloo_endpoints(const std::string& master_addr);

/// The local address that packets to `host` leave from (no packet is sent: a UDP socket is
/// connected and asked its name); throws "[ddp] ..." when `host` does not resolve or is unreachable.
std::string route_source_address(const std::string& host);

/// ProcessGroupGloo over TCP (CPU tensors) on the devices gloo_endpoints(master_addr) names; throws
/// "[ddp] ..." in a build without Gloo's headers.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout, const std::string& master_addr);
/// ProcessGroupNCCL (CUDA tensors, one GPU per process), from the CUDA plugin; throws "[ddp] ..." when
/// CUDA support is not loaded or was built without NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout);
/// Whether this build can create ProcessGroupGloo (it found Gloo's headers).
bool has_gloo();

}  // namespace nanogpt::train
