"""All-reduce bandwidth of PyTorch's Gloo (the backend nanogpt uses on CPU) between the processes
torchrun starts: the time to sum a float32 tensor of the full preset's gradient size (10.65M
parameters) over the ranks, and the bus bandwidth that implies (ring: each rank sends and receives
2 (N-1)/N of the bytes). Used by scripts/ddp_scale.sh.

    torchrun --standalone --nproc_per_node=2 scripts/allreduce_bench.py [NUMEL]
"""
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main():
    numel = int(sys.argv[1]) if len(sys.argv) > 1 else 10_650_000
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    x = torch.ones(numel)
    for _ in range(3):
        dist.all_reduce(x)
    times = []
    for _ in range(10):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        s = statistics.median(times)
        mb = numel * 4 / 1e6
        bus = 2 * (world - 1) / world * mb / s
        print(f"[allreduce] {world} ranks, {numel} floats ({mb:.1f} MB): median {s * 1e3:.1f} ms, "
              f"algorithm bandwidth {mb / s:.0f} MB/s, bus bandwidth {bus:.0f} MB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
