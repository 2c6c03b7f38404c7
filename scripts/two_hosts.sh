#!/usr/bin/env bash
# Trains across two hosts made on this machine: two network namespaces joined by a veth pair
# (10.231.7.1 and 10.231.7.2, nothing else reachable), one torchrun node in each, meeting through
# c10d's rendezvous at 10.231.7.1 — as two machines would, with hostnames that resolve to loopback.
# Needs root (ip netns) and the set-up's environment (torchrun).
#
#   scripts/two_hosts.sh CONFIG OUT_DIR [--key=value ...]       e.g.
#   scripts/two_hosts.sh configs/shakespeare_char_cpu.yaml /tmp/two --max_iters=50
#
# NETEM="delay 5ms loss 1%" puts tc netem on both ends of the link first (step time against latency
# and loss; needs the kernel's sch_netem). NNODES (default 2, e.g. 1:2 for an elastic run) and
# RESTARTS (default 0) go to torchrun's --nnodes and --max-restarts. Prints each node's last lines;
# exits non-zero when either node fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
config=${1:?usage: scripts/two_hosts.sh CONFIG OUT_DIR [--key=value ...]}
out=${2:?usage: scripts/two_hosts.sh CONFIG OUT_DIR [--key=value ...]}
shift 2
binary=${NANOGPT_BIN:-$PWD/build/nanogpt}
torchrun=$NANOGPT_VENV/bin/torchrun
[[ $(id -u) -eq 0 ]] || { echo "[two_hosts] error: needs root to make network namespaces (ip netns)" >&2; exit 2; }
command -v ip >/dev/null || { echo "[two_hosts] error: no 'ip' command (Debian: iproute2)" >&2; exit 2; }
[[ -x $torchrun ]] || { echo "[two_hosts] error: no torchrun at $torchrun (run scripts/setup.sh)" >&2; exit 2; }
[[ -x $binary ]] || { echo "[two_hosts] error: no nanogpt at $binary (run scripts/build.sh)" >&2; exit 2; }

tag=$$
a=ngA$tag b=ngB$tag
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip link add vA$tag type veth peer name vB$tag
ip link set vA$tag netns "$a"
ip link set vB$tag netns "$b"
ip -n "$a" addr add 10.231.7.1/24 dev vA$tag
ip -n "$b" addr add 10.231.7.2/24 dev vB$tag
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set vA$tag up
ip -n "$b" link set vB$tag up
if [[ -n ${NETEM:-} ]]; then
  ip netns exec "$a" tc qdisc add dev vA$tag root netem $NETEM
  ip netns exec "$b" tc qdisc add dev vB$tag root netem $NETEM
fi

mkdir -p "$out"
port=$((29500 + tag % 400))
pids=()
for node in 0 1; do
  ns=$([[ $node == 0 ]] && echo "$a" || echo "$b")
  # --local-addr: the address the node's agent gives its workers (the host name would say loopback);
  # is_host: node 0 serves the rendezvous store at the endpoint (torchrun cannot tell it is its own).
  host_conf=()
  [[ $node == 0 ]] && host_conf=(--rdzv-conf=is_host=1)
  ip netns exec "$ns" "$torchrun" --nnodes="${NNODES:-2}" --max-restarts="${RESTARTS:-0}" --nproc_per_node=1 --node_rank=$node --rdzv-backend=c10d \
    --rdzv-endpoint=10.231.7.1:$port --rdzv-id=two_hosts_$tag --local-addr=10.231.7.$((node + 1)) "${host_conf[@]}" \
    --no-python "$binary" train "$config" --out_dir="$out" --device=cpu "$@" >"$out/node$node.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || { rc=$?; echo "[two_hosts] a node exited with $rc" >&2; }; done
for node in 0 1; do
  echo "[two_hosts] node $node (10.231.7.$((node + 1))):"
  { grep -E "^\[(train|ddp)\] (done|gradient|[0-9]+ processes)|error" "$out/node$node.log" || true; } | tail -3 | sed 's/^/  /'
done
exit $rc
