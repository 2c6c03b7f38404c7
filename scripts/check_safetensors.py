#!/usr/bin/env python3
"""Check a .safetensors file written by `nanogpt export`, with numpy alone (no torch, no safetensors).

Prints every tensor (name, dtype, shape), the metadata keys, the config and the vocabulary size,
then checks the layout (header, offsets) and that the tensors are exactly the ones the config
implies, with the right shapes. Exit status 0 when everything matches, 1 otherwise.

    /usr/bin/python3 scripts/check_safetensors.py out/model.safetensors

numpy: Debian's python3 has it (apt-get install -y python3-numpy); a pyenv python may not.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "BF16": np.uint16}  # BF16: raw bits


def load(path):
    """Returns ({name: array}, metadata, problems) from a safetensors file."""
    problems = []
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if n % 8:
        problems.append(f"header length {n} is not a multiple of 8")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors, end = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, stop = info["data_offsets"]
        if begin != end:
            problems.append(f"{name}: starts at {begin}, previous tensor ends at {end}")
        end = stop
        dtype = np.dtype(DTYPES[info["dtype"]]).newbyteorder("<")
        tensors[name] = np.frombuffer(data[begin:stop], dtype=dtype).reshape(info["shape"])
    if end != len(data):
        problems.append(f"tensors cover {end} bytes, data section holds {len(data)}")
    tensors = {name: tensors[name] for name in header}  # file (header) order
    return tensors, metadata, problems


def expected_shapes(cfg):
    """The parameter names and shapes a nanogpt-cpp model with this config has."""
    C, V, hs = cfg["n_embd"], cfg["vocab_size"], cfg["n_embd"] // cfg["n_head"]
    kv = cfg["n_kv_head"] * hs
    has_bias = cfg["bias"]
    norm_bias = has_bias and cfg["norm"] == "layernorm"  # RMSNorm has no bias

    def linear(prefix, out_f, in_f):
        return {f"{prefix}.weight": (out_f, in_f), **({f"{prefix}.bias": (out_f,)} if has_bias else {})}

    def norm(prefix):
        return {f"{prefix}.weight": (C,), **({f"{prefix}.bias": (C,)} if norm_bias else {})}

    shapes = {"wte.weight": (V, C)}
    if cfg["pos_encoding"] == "learned":
        shapes["wpe.weight"] = (cfg["block_size"], C)
    for i in range(cfg["n_layer"]):
        p = f"h.{i}"
        shapes.update(norm(f"{p}.ln_1"))
        shapes.update(linear(f"{p}.attn.q_proj", C, C))
        shapes.update(linear(f"{p}.attn.k_proj", kv, C))
        shapes.update(linear(f"{p}.attn.v_proj", kv, C))
        shapes.update(linear(f"{p}.attn.c_proj", C, C))
        shapes.update(norm(f"{p}.ln_2"))
        shapes.update(linear(f"{p}.mlp.c_fc", 4 * C, C))
        shapes.update(linear(f"{p}.mlp.c_proj", C, 4 * C))
    shapes.update(norm("ln_f"))
    return shapes


def main(path):
    tensors, metadata, problems = load(path)
    for name, array in tensors.items():
        print(f"{name:40s} {str(array.dtype):8s} {tuple(array.shape)}")
    print("metadata keys:", ", ".join(sorted(metadata)))
    if metadata.get("format") != "nanogpt-cpp":
        problems.append(f"format is {metadata.get('format')!r}, expected 'nanogpt-cpp'")
        return report(problems)
    cfg = json.loads(metadata["config"])
    vocab = json.loads(metadata["vocab"])
    print("config:", json.dumps(cfg))
    print(f"vocab: {len(vocab)} characters, e.g. {''.join(vocab[:40])!r}")
    print(f"iter {metadata.get('iter')} | best_val_loss {metadata.get('best_val_loss')} | "
          f"rope_convention {metadata.get('rope_convention')} | tied_lm_head {metadata.get('tied_lm_head')}")
    if len(vocab) != cfg["vocab_size"]:
        problems.append(f"vocab has {len(vocab)} characters, config says vocab_size {cfg['vocab_size']}")
    want = expected_shapes(cfg)
    for name in sorted(set(want) - set(tensors)):
        problems.append(f"missing tensor {name} {want[name]}")
    for name in sorted(set(tensors) - set(want)):
        problems.append(f"unexpected tensor {name} {tensors[name].shape}")
    for name in sorted(set(want) & set(tensors)):
        if tuple(tensors[name].shape) != want[name]:
            problems.append(f"{name}: shape {tensors[name].shape}, config implies {want[name]}")
        if tensors[name].dtype != np.float32:
            problems.append(f"{name}: dtype {tensors[name].dtype}, expected float32")
        elif not np.isfinite(tensors[name]).all():
            problems.append(f"{name}: holds NaN or infinity")
    n_params = sum(a.size for a in tensors.values())
    print(f"{len(tensors)} tensors, {n_params} parameters")
    return report(problems)


def report(problems):
    for p in problems:
        print("problem:", p)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} FILE.safetensors")
    sys.exit(main(sys.argv[1]))
