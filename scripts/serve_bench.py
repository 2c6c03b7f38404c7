#!/usr/bin/env python3
"""Load benchmark for `nanogpt serve`: C concurrent streaming clients on loopback.

Usage: scripts/serve_bench.py URL [--clients 1,4,16,64] [--tokens 200] [--requests-per-client 2]
       scripts/serve_bench.py --out_dir=DIR [--nanogpt=build/nanogpt] [--threads=2] [--dtype=float32]
                              [--parallel=64] [--repeat=2] [--clients ...]
  URL: a running server, e.g. http://127.0.0.1:8080
  --out_dir: start `nanogpt serve` on that checkpoint (any free port) and, in the same run, measure
    `nanogpt sample` on it with the same threads, dtype and knobs; prints the goals' ratios (one
    client against `sample`, 16 clients against one) for each repetition.
For each number of clients, every client sends its requests one after another (streamed,
temperature 0.8, max_tokens fixed) and the script prints the aggregate generated tokens/s, time to
first token (TTFT), the time between events a client receives (ITL: events that arrive in one read
count as 0) and the time per output token of a request after its first (TPOT: (last - first
arrival) / (tokens - 1)), at p50 and p99. Standard library only (http.client), so it measures the
server, not a client library.
"""
import argparse
import http.client
import json
import re
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


def one_request(host, port, prompt, tokens, seed, key):
    conn = http.client.HTTPConnection(host, port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "stream": True, "temperature": 0.8, "seed": seed})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    arrivals, count = [], 0
    buffer = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            break
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            data = event[6:]
            if data == b"[DONE]":
                conn.close()
                return start, arrivals, count
            n = len(json.loads(data)["choices"][0]["text"])
            if n:
                arrivals.append(time.perf_counter())
                count += n
    conn.close()
    return start, arrivals, count


def run(url, clients, tokens, per_client, key):
    parsed = urllib.parse.urlparse(url)
    results, errors = [], []
    lock = threading.Lock()

    def client(i):
        for r in range(per_client):
            try:
                out = one_request(parsed.hostname, parsed.port or 80, "\n", tokens, i * 1000 + r, key)
                with lock:
                    results.append(out)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
        "tok_s": generated / wall,
        "ttft_p50_ms": 1000 * percentile(ttft, 50),
        "ttft_p99_ms": 1000 * percentile(ttft, 99),
        "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p99_ms": 1000 * percentile(itl, 99),
        "tpot_p50_ms": 1000 * percentile(tpot, 50),
        "tpot_p99_ms": 1000 * percentile(tpot, 99),
    }


HEADER = ("| clients | requests | errors | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
          "| TPOT p50 ms | TPOT p99 ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(r):
    return (f"| {r['clients']} | {r['requests']} | {r['errors']} | {r['tok_s']:.0f} | {r['ttft_p50_ms']:.1f} | "
            f"{r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | {r['tpot_p50_ms']:.2f} | "
            f"{r['tpot_p99_ms']:.2f} |")


def sample_tok_s(a):
    """`nanogpt sample` on the same model, threads, dtype and knobs: its own tok/s line."""
    cmd = [a.nanogpt, "sample", f"--out_dir={a.out_dir}", "--start=\n", f"--num_samples={a.requests_per_client}",
           f"--max_new_tokens={a.tokens}", "--temperature=0.8", "--top_k=0", f"--num_threads={a.threads}",
           f"--dtype={a.dtype}"]
    err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    return float(re.search(r"([0-9.]+) tok/s", err).group(1))


def start_server(a):
    cmd = [a.nanogpt, "serve", f"--out_dir={a.out_dir}", "--port=0", f"--num_threads={a.threads}",
           f"--dtype={a.dtype}", f"--parallel={a.parallel}", f"--queue={max(64, 4 * a.parallel)}", "--max_tokens=100000"]
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
