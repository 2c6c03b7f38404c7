# Sourced by the scripts that run nanoGPT side by side with nanogpt-cpp (bench_vs_nanogpt.sh,
# speedrun.sh): a working copy of a nanoGPT checkout with the corpora prepared its own way, so the
# checkout itself is never written to.
#
#   nanogpt_peer_workspace NANOGPT_DIR WORK PYTHON   copies NANOGPT_DIR to WORK/nanoGPT and prepares
#                                                    tiny Shakespeare there (data/shakespeare_char);
#                                                    torch.compile's cache goes to WORK/inductor
#   nanogpt_peer_tang WORK PYTHON                    prepares the Tang poems there too (data/tang):
#                                                    its shakespeare_char prepare.py, reading UTF-8

nanogpt_peer_workspace() {
  local src=$1 work=$2 py=$3
  # torch.compile's kernels from this workspace only: a cache left by a run under other instruction-set
  # caps (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) crashed nanoGPT --compile=True ("malloc(): unaligned
  # tcache chunk detected").
  export TORCHINDUCTOR_CACHE_DIR=$work/inductor
  cp -r "$src" "$work/nanoGPT"
  cp data/shakespeare_char/input.txt "$work/nanoGPT/data/shakespeare_char/"
  mkdir -p "$work/stub" && : >"$work/stub/tiktoken.py" && : >"$work/stub/requests.py"  # imported, unused here
  (cd "$work/nanoGPT" && PYTHONPATH=$work/stub "$py" data/shakespeare_char/prepare.py >/dev/null)
}

nanogpt_peer_tang() {
  local work=$1 py=$2
  mkdir -p "$work/nanoGPT/data/tang"
  cp data/tang_poems/input.txt "$work/nanoGPT/data/tang/"
  sed "s/open(input_file_path, '\([rw]\)')/open(input_file_path, '\1', encoding='utf-8')/" \
    "$work/nanoGPT/data/shakespeare_char/prepare.py" >"$work/nanoGPT/data/tang/prepare.py"
  (cd "$work/nanoGPT" && PYTHONPATH=$work/stub "$py" data/tang/prepare.py >/dev/null)
}
