#!/usr/bin/env python3
"""Summarise a Chrome trace from `nanogpt bench --profile FILE`: where the time of a step goes.

    scripts/profile_summary.py TRACE.json [TOP]      (default TOP = 25; standard library only)

For each operator: self time (its own, without the operators it calls: these add up to the step),
total time (with them, e.g. aten::linear contains aten::addmm) and calls, per step (the trace
holds 3 steps).
"""
import json
import sys
from collections import defaultdict

STEPS = 3


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    try:
        with open(sys.argv[1], encoding="utf-8") as f:
            text = f.read().rstrip().rstrip(",")
        events = [e for e in json.loads(text if text.endswith("]") else text + "]") if e.get("ph") == "X"]
    except (OSError, ValueError, AttributeError) as e:
        print(f"error: cannot read the trace '{sys.argv[1]}': {e} (make one with nanogpt bench --profile)",
              file=sys.stderr)
        return 1
    events.sort(key=lambda e: (e.get("tid", 0), e["ts"], -e.get("dur", 0)))
    total, self_time, calls = defaultdict(float), defaultdict(float), defaultdict(int)
    stack = []  # (tid, end, name) of the enclosing events
    for e in events:
        tid, start, dur = e.get("tid", 0), e["ts"], e.get("dur", 0.0)
        while stack and (stack[-1][0] != tid or stack[-1][1] <= start):
            stack.pop()
        if stack:
            self_time[stack[-1][2]] -= dur  # the parent's own time excludes this child
        total[e["name"]] += dur
        self_time[e["name"]] += dur
        calls[e["name"]] += 1
        stack.append((tid, start + dur, e["name"]))
    step_ms = sum(self_time.values()) / STEPS / 1000
    print(f"profiled time per step: {step_ms:.2f} ms (profiler overhead included)")
    print(f"{'operator':<50} {'self ms':>9} {'self %':>7} {'total ms':>9} {'calls':>6}")
    for name, us in sorted(self_time.items(), key=lambda kv: -kv[1])[:top]:
        ms = us / STEPS / 1000
        print(f"{name[:50]:<50} {ms:9.2f} {100 * ms / step_ms:6.1f}% {total[name] / STEPS / 1000:9.2f} {calls[name] / STEPS:6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
