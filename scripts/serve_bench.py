#!/usr/bin/env python3
"""Load benchmark for `nanogpt serve`: C concurrent streaming clients on loopback.

Usage: scripts/serve_bench.py URL [--clients 1,4,16,64] [--tokens 200] [--requests-per-client 2]
  URL: the server, e.g. http://127.0.0.1:8080
For each number of clients, every client sends its requests one after another (streamed, greedy
off, max_tokens fixed) and the script prints the aggregate generated tokens/s, time to first token
and inter-token latency at p50 and p99. Standard library only (http.client), so it measures the
server, not a client library.
"""
import argparse
import http.client
import json
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
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url")
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--api-key", default="")
    a = ap.parse_args()
    print("| clients | requests | errors | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in [int(x) for x in a.clients.split(",")]:
        r = run(a.url, c, a.tokens, a.requests_per_client, a.api_key)
        print(f"| {r['clients']} | {r['requests']} | {r['errors']} | {r['tok_s']:.0f} | {r['ttft_p50_ms']:.1f} | "
              f"{r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
