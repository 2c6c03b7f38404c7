"""An independent forward pass over a `nanogpt export` file, for tests/test_export_pytorch.cpp.

Written from the math, not from model/*.cpp, in float64: the safetensors layout read by hand (an
8-byte header length, a JSON header, raw little-endian tensors), then embeddings, pre-norm blocks
(LayerNorm or RMSNorm, causal attention with learned, sinusoidal or rotary positions and grouped
key/value heads, an exact-GELU MLP), the final norm and the head tied to the token embedding.

usage: reference_export.py MODEL.safetensors IDS    (IDS: comma-separated token ids)
prints {"shape": [T, V], "logits": [...]} (row-major) as JSON
"""
import json
import math
import struct
import sys

import torch

EPS = 1e-5  # LayerNorm's and RMSNorm's epsilon (PyTorch's LayerNorm default)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    metadata = header.pop("__metadata__", {})
    start = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise SystemExit(f"{name}: expected F32, found {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = bytearray(data[start + begin : start + end])
        tensors[name] = torch.frombuffer(raw, dtype=torch.float32).reshape(info["shape"]).double()
    return tensors, metadata


def norm(x, weights, prefix, kind):
    w = weights[prefix + ".weight"]
    if kind == "rmsnorm":
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * w
    centered = x - x.mean(-1, keepdim=True)
    y = centered / torch.sqrt((centered * centered).mean(-1, keepdim=True) + EPS) * w
    bias = weights.get(prefix + ".bias")
    return y if bias is None else y + bias


def linear(x, weights, prefix):
    y = x @ weights[prefix + ".weight"].T
    bias = weights.get(prefix + ".bias")
    return y if bias is None else y + bias


def sinusoids(T, C):
    # PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(p / 10000^(2i/C))
    table = torch.zeros(T, C, dtype=torch.float64)
    for p in range(T):
        for i in range(0, C, 2):
            angle = p / 10000.0 ** (i / C)
            table[p, i] = math.sin(angle)
            table[p, i + 1] = math.cos(angle)
    return table


def rotate(x, base):
    # x (T, H, hs). Split halves: dimension i pairs with i + hs/2, and the pair at position p turns
    # by the angle p * base^(-2i/hs).
    T, _, hs = x.shape
    half = hs // 2
    out = torch.empty_like(x)
    for p in range(T):
        for i in range(half):
            angle = p * base ** (-2.0 * i / hs)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[p, :, i], x[p, :, i + half]
            out[p, :, i] = a * c - b * s
            out[p, :, i + half] = b * c + a * s
    return out


def attention(x, weights, prefix, config):
    T, C = x.shape
    nh, nkv = config["n_head"], config["n_kv_head"]
    hs = C // nh
    q = linear(x, weights, prefix + ".q_proj").view(T, nh, hs)
    k = linear(x, weights, prefix + ".k_proj").view(T, nkv, hs)
    v = linear(x, weights, prefix + ".v_proj").view(T, nkv, hs)
    if config["pos_encoding"] == "rope":
        q, k = rotate(q, config["rope_base"]), rotate(k, config["rope_base"])
    heads = []
    for h in range(nh):
        kv = h // (nh // nkv)  # consecutive query heads share a key/value head
        scores = q[:, h] @ k[:, kv].T / math.sqrt(hs)  # (T, T)
        for i in range(T):  # query i sees keys 0..i
            scores[i, i + 1 :] = -math.inf
        heads.append(torch.softmax(scores, -1) @ v[:, kv])  # (T, hs)
    return linear(torch.cat(heads, -1), weights, prefix + ".c_proj")


def mlp(x, weights, prefix):
    h = linear(x, weights, prefix + ".c_fc")
    h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))  # exact GELU
    return linear(h, weights, prefix + ".c_proj")


def logits(weights, metadata, ids):
    config = json.loads(metadata["config"])
    if config["pos_encoding"] == "rope" and metadata.get("rope_convention") != "split_halves":
        raise SystemExit(f"unknown rope_convention {metadata.get('rope_convention')!r}")
    T = len(ids)
    x = weights["wte.weight"][ids]  # (T, C)
    if config["pos_encoding"] == "learned":
        x = x + weights["wpe.weight"][:T]
    elif config["pos_encoding"] == "sinusoidal":
        x = x + sinusoids(T, config["n_embd"])
    for layer in range(config["n_layer"]):
        p = f"h.{layer}"
        x = x + attention(norm(x, weights, p + ".ln_1", config["norm"]), weights, p + ".attn", config)
        x = x + mlp(norm(x, weights, p + ".ln_2", config["norm"]), weights, p + ".mlp")
    x = norm(x, weights, "ln_f", config["norm"])
    return x @ weights[metadata["tied_lm_head"]].T  # (T, V)


def main():
    weights, metadata = read_safetensors(sys.argv[1])
    ids = [int(t) for t in sys.argv[2].split(",")]
    out = logits(weights, metadata, ids)
    print(json.dumps({"shape": list(out.shape), "logits": out.flatten().tolist()}))


if __name__ == "__main__":
    main()
