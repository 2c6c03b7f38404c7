#!/usr/bin/env python3
"""Load benchmark for `nanogpt serve`: C concurrent streaming clients on loopback.

Usage: scripts/serve_bench.py URL [--clients 1,4,16,64] [--tokens 200] [--requests-per-client 2]
       scripts/serve_bench.py --out_dir=DIR [--nanogpt=build/nanogpt] [--threads=2] [--dtype=float32]
                              [--device=auto] [--parallel=64] [--repeat=2] [--clients ...]
  URL: a running server, e.g. http://127.0.0.1:8080
  --out_dir: start `nanogpt serve` on that checkpoint (any free port) and, in the same run, measure
    `nanogpt sample` on it with the same threads, dtype and knobs; prints the goals' ratios (one
    client against `sample`, 16 clients against one) for each repetition. Each server answers one
    request before the rows are measured: its first connection and request pay for its start-up
    (~3 and ~5 ms on the CPU-preset model, against ~14 ms for a request of 200 tokens).
For each number of clients, every client sends its requests one after another (streamed,
temperature 0.8, max_tokens fixed) and the script prints the tokens generated (the streamed text's
characters, a character-level model's tokens), the aggregate tokens/s, time to first token (TTFT), the time between events a client receives (ITL: events that arrive in one read
count as 0) and the time per output token of a request after its first (TPOT: (last - first
arrival) / (tokens - 1)), at p50 and p99. Standard library only: the clients share one thread and a
selector over their sockets (HTTP/1.1, chunked, server-sent events parsed here), so that on a small
machine they take little of the cores the server runs on, and no client library is measured.
"""
import argparse
import json
import re
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.parse


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


class Stream:
    """One streamed completion on a non-blocking socket: HTTP/1.1, chunked transfer, server-sent events."""

    def __init__(self, host, port, prompt, tokens, seed, key):
        body = json.dumps({"prompt": prompt, "max_tokens": tokens, "stream": True, "temperature": 0.8,
                           "seed": seed}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n")
        if key:
            head += f"Authorization: Bearer {key}\r\n"
        self.start = time.perf_counter()
        self.sock = socket.create_connection((host, port), timeout=600)
        self.sock.sendall(head.encode() + b"\r\n" + body)
        self.sock.setblocking(False)
        self.raw = b""        # bytes received, not yet parsed
        self.status = None    # the response's status code, once its head has come
        self.events = b""     # the body, de-chunked, not yet split into events
        self.arrivals, self.count = [], 0
        self.done, self.error = False, None

    def feed(self, now):
        """Reads what the socket has; returns False once the stream has ended (or failed)."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return True
        if not data:  # closed before [DONE]
            self.error = self.error or (f"HTTP {self.status}: {self.raw[:200]!r}" if self.status != 200
                                        else "the stream ended before data: [DONE]")
            return False
        self.raw += data
        if self.status is None:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return True
            self.status = int(self.raw.split(b" ", 2)[1])
            self.raw = self.raw[end + 4:]
            if self.status != 200:
                return True  # read the error body until the server closes
        if self.status != 200:
            return True
        while True:  # chunks: size in hex, CRLF, data, CRLF
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                break
            size = int(self.raw[:line_end].split(b";")[0], 16)
            if len(self.raw) < line_end + 2 + size + 2:
                break
            self.events += self.raw[line_end + 2:line_end + 2 + size]
            self.raw = self.raw[line_end + 2 + size + 2:]
        while b"\n\n" in self.events:
            event, self.events = self.events.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                self.done = True
                return False
            n = len(json.loads(data)["choices"][0]["text"])
            if n:
                self.arrivals.append(now)
                self.count += n
        return True


def run(url, clients, tokens, per_client, key):
    """`clients` clients on one thread (one selector over their sockets, so that the clients' own
    work is a small part of the machine's), each sending its requests one after another."""
    parsed = urllib.parse.urlparse(url)
    host, port = parsed.hostname, parsed.port or 80
    results, errors = [], []
    selector = selectors.DefaultSelector()
    left = {i: per_client for i in range(clients)}

    def start(i):
        left[i] -= 1
        try:
            stream = Stream(host, port, "\n", tokens, i * 1000 + (per_client - left[i] - 1), key)
        except OSError as e:
            errors.append(str(e))
            return start(i) if left[i] > 0 else None
        selector.register(stream.sock, selectors.EVENT_READ, (i, stream))

    t0 = time.perf_counter()
    for i in range(clients):
        start(i)
    while selector.get_map():
        for key_, _ in selector.select():
            now = time.perf_counter()
            i, stream = key_.data
            if stream.feed(now):
                continue
            selector.unregister(stream.sock)
            stream.sock.close()
            if stream.done:
                results.append((stream.start, stream.arrivals, stream.count))
            else:
                errors.append(stream.error)
            if left[i] > 0:
                start(i)
    wall = time.perf_counter() - t0
    for e in sorted(set(errors))[:3]:
        print(f"  error with {clients} clients: {e}", file=sys.stderr)
    ttft = [a[0] - s for s, a, _ in results if a]
    itl = [b - a for _, arr, _ in results for a, b in zip(arr, arr[1:])]
    tpot = [(arr[-1] - arr[0]) / (c - 1) for _, arr, c in results if len(arr) > 1 and c > 1]
    generated = sum(c for _, _, c in results)
    return {
        "clients": clients,
        "requests": len(results),
        "errors": len(errors),
        "tokens": generated,
        "tok_s": generated / wall,
        "ttft_p50_ms": 1000 * percentile(ttft, 50),
        "ttft_p99_ms": 1000 * percentile(ttft, 99),
        "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p99_ms": 1000 * percentile(itl, 99),
        "tpot_p50_ms": 1000 * percentile(tpot, 50),
        "tpot_p99_ms": 1000 * percentile(tpot, 99),
    }


HEADER = ("| clients | requests | errors | tokens | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms "
          "| ITL p99 ms | TPOT p50 ms | TPOT p99 ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(r):
    return (f"| {r['clients']} | {r['requests']} | {r['errors']} | {r['tokens']} | {r['tok_s']:.0f} | {r['ttft_p50_ms']:.1f} | "
            f"{r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | {r['tpot_p50_ms']:.2f} | "
            f"{r['tpot_p99_ms']:.2f} |")


def sample_tok_s(a):
    """`nanogpt sample` on the same model, threads, dtype and knobs: its own tok/s line."""
    cmd = [a.nanogpt, "sample", f"--out_dir={a.out_dir}", "--start=\n", f"--num_samples={a.requests_per_client}",
           f"--max_new_tokens={a.tokens}", "--temperature=0.8", "--top_k=0", f"--num_threads={a.threads}",
           f"--dtype={a.dtype}", f"--device={a.device}"]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    return float(re.search(r"([0-9.]+) tok/s", err).group(1))


def start_server(a):
    cmd = [a.nanogpt, "serve", f"--out_dir={a.out_dir}", "--port=0", f"--num_threads={a.threads}",
           f"--dtype={a.dtype}", f"--device={a.device}", f"--parallel={a.parallel}", f"--queue={max(64, 4 * a.parallel)}", "--max_tokens=100000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        m = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the log
            return proc, m.group(1)
    raise SystemExit(f"the server did not start: exit {proc.wait()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", nargs="?", help="a running server (or give --out_dir)")
    ap.add_argument("--out_dir", help="start `nanogpt serve` on this checkpoint and compare with `nanogpt sample`")
    ap.add_argument("--nanogpt", default="build/nanogpt")
    ap.add_argument("--threads", type=int, default=2, help="--num_threads of serve and sample")
    ap.add_argument("--dtype", default="float32", help="--dtype of serve and sample")
    ap.add_argument("--device", default="auto", help="--device of serve and sample (auto: a GPU where there is one)")
    ap.add_argument("--parallel", type=int, default=64, help="the server's --parallel")
    ap.add_argument("--repeat", type=int, default=1, help="repetitions (with --out_dir)")
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--api-key", default="")
    a = ap.parse_args()
    clients = [int(x) for x in a.clients.split(",")]
    if not a.out_dir:
        if not a.url:
            ap.error("give a server's URL or --out_dir")
        print(HEADER)
        for c in clients:
            print(row(run(a.url, c, a.tokens, a.requests_per_client, a.api_key)), flush=True)
        return
    for rep in range(a.repeat):
        proc, url = start_server(a)
        try:
            run(url, 1, a.tokens, 1, a.api_key)  # a server's first request pays for its start-up: not measured
            before = sample_tok_s(a)
            print(f"repetition {rep + 1}: `nanogpt sample` {before:.0f} tok/s", flush=True)
            print(HEADER)
            rows = {}
            for c in clients:
                rows[c] = run(url, c, a.tokens, a.requests_per_client, a.api_key)
                print(row(rows[c]), flush=True)
            after = sample_tok_s(a)
        finally:
            proc.terminate()
            proc.wait()
        reference = (before + after) / 2
        line = f"repetition {rep + 1}: `nanogpt sample` {before:.0f} then {after:.0f} tok/s"
        if 1 in rows:
            line += f" | one client / sample = {rows[1]['tok_s'] / reference:.2f}"
            for c in (4, 16, 64):
                if c in rows:
                    line += f" | {c} clients / one = {rows[c]['tok_s'] / rows[1]['tok_s']:.2f}"
        print(line + "\n", flush=True)


if __name__ == "__main__":
    main()
