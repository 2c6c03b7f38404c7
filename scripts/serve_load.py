#!/usr/bin/env python3
"""A bounded load test of `nanogpt serve` on loopback: it starts the server, warms it up, then for
--seconds keeps --clients clients busy with a mix of well-behaved and ill-behaved requests (streams
read to the end, slow readers, clients that hang up mid-stream, abrupt resets, non-streamed and beam
completions, bad requests, idle connections that send nothing), and at the end checks that nothing
leaked: the server's open file descriptors (/proc/PID/fd) and threads (/proc/PID/task) are as
before, /metrics shows no busy slot and an empty queue, and its resident memory is back within
--rss_tolerance of where it stood after the warm-up.

    scripts/serve_load.py --out_dir=out-tang-cpu                  # 60 s, 24 clients
    scripts/serve_load.py --out_dir=out --seconds=5 --no_rss      # a quick check

Standard library only. Prints one summary line per phase and a JSON summary; exits 1 on a leak.
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

# Prompts tried at the start; those the model's vocabulary holds are used.
CANDIDATE_PROMPTS = ["\n", "\u5E8A\u524D\u660E\u6708\u5149", "\u6625\u7720", "ROMEO:", "The ", "First Citizen:\n"]
PROMPTS = []


def proc_counts(pid):
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = len(os.listdir(f"/proc/{pid}/task"))
    rss_kb = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return fds, threads, rss_kb


class Server:
    def __init__(self, args):
        self.log_path = args.log
        cmd = [args.nanogpt, "serve", "--port=0", f"--parallel={args.parallel}", f"--queue={args.queue}",
               f"--timeout={args.timeout}", "--max_tokens=100000"] + args.source + args.extra
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = 0
        deadline = time.time() + 300
        while time.time() < deadline and not self.port:
            if self.proc.poll() is not None:
                raise SystemExit(f"[load] the server exited ({self.proc.returncode}): {open(self.log_path).read()[-2000:]}")
            m = re.search(r"on http://127\.0\.0\.1:(\d+) ", open(self.log_path, errors="replace").read())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.1)
        if not self.port:
            raise SystemExit("[load] the server did not start listening within 300 s")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


def request_bytes(method, path, body=b""):
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def http(port, method, path, body=b"", timeout=60):
    """One request on its own connection: (status, body bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request_bytes(method, path, body))
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, rest


def metric(port, name):
    status, body = http(port, "GET", "/metrics")
    m = re.search(rb"^" + name.encode() + rb" (\S+)$", body, re.M)
    return float(m.group(1)) if status == 200 and m else None


def completion(prompt, **fields):
    return json.dumps(dict(prompt=prompt, **fields)).encode()


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}

    def add(self, kind, outcome):
        with self.lock:
            key = f"{kind}:{outcome}"
            self.counts[key] = self.counts.get(key, 0) + 1


def one_client(port, kind, rng, stats, timeout):
    """One request of the given kind; records its outcome."""
    prompt = rng.choice(PROMPTS)
    try:
        if kind == "stream":  # read to the end
            status, body = http(port, "POST", "/v1/completions",
                                completion(prompt, max_tokens=rng.randint(5, 60), stream=True), timeout=120)
            ok = status == 200 and b"data: [DONE]" in body
            stats.add(kind, "ok" if ok else f"status {status}" if status != 200 else "no [DONE]")
        elif kind in ("slow", "hangup", "reset"):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)  # it may wait in the queue
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(request_bytes("POST", "/v1/completions", completion(prompt, max_tokens=100000, stream=True)))
            got, until = 0, time.time() + rng.uniform(0.5, 4.0)
            while time.time() < until:
                chunk = s.recv(64 if kind == "slow" else 4096)
                if not chunk:
                    break
                got += len(chunk)
                if kind == "slow":
                    time.sleep(0.05)  # reads far slower than the server writes
            if kind == "reset":  # RST instead of FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
            stats.add(kind, "ok" if got else "nothing read")
        elif kind == "plain":
            status, _ = http(port, "POST", "/v1/completions", completion(prompt, max_tokens=rng.randint(1, 30), n=2))
            stats.add(kind, "ok" if status in (200, 503) else f"status {status}")
        elif kind == "beam":
            status, _ = http(port, "POST", "/v1/completions", completion(prompt, max_tokens=12, beam=3))
            stats.add(kind, "ok" if status in (200, 503) else f"status {status}")
        elif kind == "bad":
            body = rng.choice([b"{\"prompt\": ", completion(prompt, temperature=-1), completion("\x01"),
                               completion(prompt, top_p=0), b"[]", completion(prompt, max_tokens=10**9)])
            status, _ = http(port, "POST", "/v1/completions", body)
            stats.add(kind, "ok" if 400 <= status < 500 else f"status {status}")
        elif kind == "idle":  # connects, sends half a request, then nothing: the read timeout drops it
            s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
            time.sleep(rng.uniform(0.2, 2.0))
            s.close()
            stats.add(kind, "ok")
    except (OSError, ValueError, IndexError) as e:
        stats.add(kind, type(e).__name__)


KINDS = ["stream"] * 4 + ["slow"] * 2 + ["hangup"] * 2 + ["reset", "plain", "plain", "beam", "bad", "idle"]


def load(port, seconds, clients, seed, stats, timeout):
    stop_at = time.time() + seconds

    def worker(i):
        rng = random.Random(seed * 1000 + i)
        while time.time() < stop_at:
            one_client(port, rng.choice(KINDS), rng, stats, timeout)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def settle(port, pid, timeout):
    """Waits until /metrics shows no busy slot and an empty queue, or the timeout; returns what it shows last."""
    deadline = time.time() + timeout
    while True:
        busy, queued = metric(port, "nanogpt_busy_slots"), metric(port, "nanogpt_queue_depth")
        if (busy == 0 and queued == 0) or time.time() > deadline:
            return busy, queued
        time.sleep(0.2)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanogpt", default=os.path.join(os.path.dirname(__file__), "..", "build", "nanogpt"))
    p.add_argument("--out_dir", help="training folder of the checkpoint to serve")
    p.add_argument("--ckpt", help="a checkpoint file (instead of --out_dir)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of the load phase")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of the same load before the baseline")
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--queue", type=int, default=128)
    p.add_argument("--timeout", type=int, default=5, help="the server's --timeout (slow and idle clients are dropped after it)")
    p.add_argument("--rss_tolerance", type=float, default=0.10, help="resident memory after / after warm-up - 1, at most")
    p.add_argument("--no_rss", action="store_true", help="skip the resident-memory check (short runs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log", default="serve_load.log", help="the server's log")
    p.add_argument("extra", nargs="*", help="more `nanogpt serve` options (after --)")
    args = p.parse_args()
    if not args.out_dir and not args.ckpt:
        p.error("give --out_dir or --ckpt")
    args.source = [f"--out_dir={args.out_dir}"] if args.out_dir else [f"--ckpt={args.ckpt}"]

    server = Server(args)
    pid, port = server.proc.pid, server.port
    stats = Stats()
    summary = {"clients": args.clients, "seconds": args.seconds, "parallel": args.parallel}
    try:
        for prompt in CANDIDATE_PROMPTS:
            if http(port, "POST", "/tokenize", json.dumps({"content": prompt}).encode())[0] == 200:
                PROMPTS.append(prompt)
        if not PROMPTS:
            raise SystemExit("[load] the model knows none of the prompts " + json.dumps(CANDIDATE_PROMPTS))
        start = proc_counts(pid)
        load(port, args.warmup, args.clients, args.seed + 1, Stats(), args.timeout)
        settle(port, pid, 3 * args.timeout + 30)
        time.sleep(args.timeout + 1)  # idle keep-alive and dropped connections closed
        base = proc_counts(pid)
        print(f"[load] warm: fds {base[0]} threads {base[1]} rss {base[2] / 1024:.1f} MiB (at start {start[0]} fds, "
              f"{start[1]} threads, {start[2] / 1024:.1f} MiB)", flush=True)
        t0 = time.time()
        peak = [0, 0, 0]

        def sample_peak():
            while time.time() - t0 < args.seconds:
                try:
                    now = proc_counts(pid)
                except OSError:
                    return
                for i in range(3):
                    peak[i] = max(peak[i], now[i])
                time.sleep(0.5)

        sampler = threading.Thread(target=sample_peak)
        sampler.start()
        load(port, args.seconds, args.clients, args.seed, stats, args.timeout)
        sampler.join()
        busy, queued = settle(port, pid, 3 * args.timeout + 30)
        time.sleep(args.timeout + 1)
        end = proc_counts(pid)
        summary.update(
            {"requests": sum(stats.counts.values()), "outcomes": dict(sorted(stats.counts.items())),
             "fds": {"warm": base[0], "peak": peak[0], "end": end[0]},
             "threads": {"warm": base[1], "peak": peak[1], "end": end[1]},
             "rss_mib": {"start": round(start[2] / 1024, 1), "warm": round(base[2] / 1024, 1), "peak": round(peak[2] / 1024, 1),
                         "end": round(end[2] / 1024, 1)},
             "busy_slots": busy, "queue_depth": queued, "still_serving": http(port, "GET", "/health")[0] == 200})
    finally:
        rc = server.stop()
    summary["exit_status"] = rc
    failures = []
    if summary.get("fds", {}).get("end") != summary.get("fds", {}).get("warm"):
        failures.append("file descriptors")
    if summary.get("threads", {}).get("end") != summary.get("threads", {}).get("warm"):
        failures.append("threads")
    if summary.get("busy_slots") != 0 or summary.get("queue_depth") != 0:
        failures.append("slots or queue")
    if not summary.get("still_serving"):
        failures.append("/health")
    if rc != 0:
        failures.append(f"exit status {rc}")
    unexpected = {k: v for k, v in stats.counts.items() if not k.endswith(":ok")}
    if unexpected:
        summary["unexpected"] = unexpected
    if not args.no_rss and "rss_mib" in summary:
        growth = summary["rss_mib"]["end"] / summary["rss_mib"]["warm"] - 1
        summary["rss_growth"] = round(growth, 4)
        if growth > args.rss_tolerance:
            failures.append(f"resident memory grew {growth:.1%}")
    summary["leaks"] = failures
    print(json.dumps(summary, indent=1))
    print("[load] " + ("no leak" if not failures else "LEAK: " + ", ".join(failures)), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
