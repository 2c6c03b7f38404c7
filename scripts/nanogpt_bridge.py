#!/usr/bin/env python3
"""The pickle side of the nanoGPT bridge (interop/nanogpt_bridge.h): converts nanoGPT's ckpt.pt +
meta.pkl to a neutral safetensors file and back, and nothing else. Which tensor goes where (c_attn
split into q/k/v, the optimizer's layout, the vocabulary's order) is decided on the C++ side; this
script only unpacks and packs Python objects. `nanogpt import-nanogpt` and `nanogpt export
--format=nanogpt` run it with the project's Python (scripts/env.sh); by hand:

    nanogpt_bridge.py read CKPT.pt META.pkl NEUTRAL.safetensors
    nanogpt_bridge.py write NEUTRAL.safetensors OUT_DIR        (writes OUT_DIR/ckpt.pt, OUT_DIR/meta.pkl)

No code from the files read ever runs: ckpt.pt is opened with torch.load(weights_only=True), which
only rebuilds tensors and plain containers, and meta.pkl with an unpickler that refuses every
reference to a class or function (plain dicts, lists, strings and numbers need none).

The neutral file: tensors "model:<state_dict key>", "optimizer:<param id>:<state key>"; metadata
"format" = "nanogpt-bridge", "checkpoint" = JSON {model_args, model_keys (state_dict order),
iter_num, best_val_loss, config, optimizer: {param_groups, steps} or null, tied: {key: key}} and
"meta" = JSON {keys, vocab_size, itos: [[id, [code points]], ...] or null, stoi: same or null}.
A failure prints one line, "[import] ..." or "[export] ...", on stderr and exits 1 (3: no torch).
"""
import io
import json
import math
import os
import pickle
import sys

FORMAT = "nanogpt-bridge"


class BridgeError(Exception):
    pass


class PlainDataUnpickler(pickle.Unpickler):
    """Reads dicts, lists, tuples, strings, bytes and numbers; refuses anything that names a callable."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, and only plain dicts, lists, strings and "
                                     "numbers are read (no code from the file runs)")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it uses persistent ids, which plain data never needs")


def first_line(error):
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


def plain(value):
    """A JSON-safe copy of a config value: bool, int, finite float, str; anything else is None."""
    import torch
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None


def code_points(text):
    return [ord(c) for c in text] if isinstance(text, str) else None


def read_meta(path):
    try:
        with open(path, "rb") as f:
            meta = PlainDataUnpickler(io.BytesIO(f.read())).load()
    except OSError as e:
        raise BridgeError(f"cannot read meta '{path}': {e.strerror} (nanoGPT keeps it in data/<dataset>/meta.pkl)")
    except Exception as e:
        raise BridgeError(f"meta '{path}' is not a plain-data pickle: {first_line(e)}")
    if not isinstance(meta, dict):
        raise BridgeError(f"meta '{path}' holds a {type(meta).__name__}, expected a dict (nanoGPT's prepare.py writes "
                          "{'vocab_size', 'itos', 'stoi'})")
    out = {"keys": sorted(str(k) for k in meta), "vocab_size": plain(meta.get("vocab_size")), "itos": None, "stoi": None}
    itos, stoi = meta.get("itos"), meta.get("stoi")
    if isinstance(itos, dict):
        out["itos"] = [[i if isinstance(i, int) else None, code_points(s)] for i, s in itos.items()]
    if isinstance(stoi, dict):
        out["stoi"] = [[i if isinstance(i, int) else None, code_points(s)] for s, i in stoi.items()]
    return out


def read(ckpt_path, meta_path, neutral_path):
    meta = read_meta(meta_path)
    import torch
    from safetensors.torch import save_file
    try:
        with open(ckpt_path, "rb") as f:
            start = f.read(4)
    except OSError as e:
        raise BridgeError(f"cannot read '{ckpt_path}': {e.strerror} (nanoGPT writes out_dir/ckpt.pt)")
    if start != b"PK\x03\x04" and not start.startswith(b"\x80"):  # torch.save's zip archive, or its older pickle
        raise BridgeError(f"'{ckpt_path}' is not a PyTorch checkpoint (neither torch.save's zip archive nor a pickle)")
    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is a page of advice; the reason follows "WeightsUnpickler error:".
        reason = str(e).split("WeightsUnpickler error:")[-1].split("Check the documentation")[0]
        reason = " ".join(reason.split()).split(" Please use")[0] or first_line(e)
        raise BridgeError(f"'{ckpt_path}' holds more than tensors and plain data, which weights-only loading refuses "
                          f"(no code from the file runs): {reason}")
    except Exception as e:
        raise BridgeError(f"'{ckpt_path}' is not a PyTorch checkpoint: {first_line(e)}")
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict) or not isinstance(ckpt.get("model_args"), dict):
        raise BridgeError(f"'{ckpt_path}' is not a nanoGPT checkpoint (expected a dict with 'model' and 'model_args', "
                          "as train.py saves)")
    tensors, model_keys = {}, []
    for key, value in ckpt["model"].items():
        if not isinstance(value, torch.Tensor):
            raise BridgeError(f"'{ckpt_path}': model entry '{key}' is not a tensor")
        model_keys.append(key)
        tensors[f"model:{key}"] = value.detach().clone().contiguous()  # tied entries share storage
    optimizer = None
    opt = ckpt.get("optimizer")
    if isinstance(opt, dict) and isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list):
        groups, steps = [], {}
        for group in opt["param_groups"]:
            groups.append({k: ([plain(x) for x in v] if isinstance(v, (list, tuple)) else plain(v))
                           for k, v in group.items()})
        for pid, state in opt["state"].items():
            for key, value in state.items():
                if key == "step":
                    steps[str(pid)] = plain(value)
                elif isinstance(value, torch.Tensor):
                    tensors[f"optimizer:{pid}:{key}"] = value.detach().clone().contiguous()
        optimizer = {"param_groups": groups, "steps": steps}
    config = ckpt.get("config")
    checkpoint = {
        "model_args": {str(k): plain(v) for k, v in ckpt["model_args"].items()},
        "model_keys": model_keys,
        "iter_num": plain(ckpt.get("iter_num")),
        "best_val_loss": plain(ckpt.get("best_val_loss")),
        "config": {str(k): plain(v) for k, v in config.items()} if isinstance(config, dict) else None,
        "optimizer": optimizer,
        "tied": {},
    }
    metadata = {"format": FORMAT, "checkpoint": json.dumps(checkpoint, allow_nan=False),
                "meta": json.dumps(meta, allow_nan=False)}
    save_file(tensors, neutral_path, metadata=metadata)


def write(neutral_path, out_dir):
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    tensors = load_file(neutral_path)
    with safe_open(neutral_path, framework="pt") as f:
        metadata = f.metadata() or {}
    if metadata.get("format") != FORMAT:
        raise BridgeError(f"'{neutral_path}' is not a bridge file (format {metadata.get('format')!r})")
    checkpoint, meta = json.loads(metadata["checkpoint"]), json.loads(metadata["meta"])
    state_dict = {}
    for key in checkpoint["model_keys"]:
        source = checkpoint["tied"].get(key)
        state_dict[key] = state_dict[source] if source else tensors[f"model:{key}"]
    ckpt = {"model": state_dict, "model_args": checkpoint["model_args"], "iter_num": checkpoint["iter_num"],
            "best_val_loss": checkpoint["best_val_loss"], "config": checkpoint["config"]}
    opt = checkpoint.get("optimizer")
    if opt is not None:
        state, groups = {}, []
        for group in opt["param_groups"]:
            # A real AdamW's group: every key this torch version's load_state_dict expects.
            full = torch.optim.AdamW([torch.zeros(1)], lr=group["lr"], betas=tuple(group["betas"]), eps=group["eps"],
                                     weight_decay=group["weight_decay"]).param_groups[0]
            full["params"] = list(group["params"])
            groups.append(full)
            for pid in group["params"]:
                state[pid] = {"step": torch.tensor(float(opt["steps"][str(pid)])),
                              "exp_avg": tensors[f"optimizer:{pid}:exp_avg"],
                              "exp_avg_sq": tensors[f"optimizer:{pid}:exp_avg_sq"]}
        ckpt["optimizer"] = {"state": state, "param_groups": groups}
    torch.save(ckpt, os.path.join(out_dir, "ckpt.pt"))
    itos = {i: "".join(map(chr, cps)) for i, cps in meta["itos"]}
    with open(os.path.join(out_dir, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": meta["vocab_size"], "itos": itos, "stoi": {s: i for i, s in itos.items()}}, f)


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    tag = "[export]" if mode == "write" else "[import]"
    if not ((mode == "read" and len(argv) == 5) or (mode == "write" and len(argv) == 4)):
        print(__doc__, file=sys.stderr)
        return 2
    import importlib.util
    for module in ("torch", "safetensors"):  # found, not imported: a bad meta.pkl is refused before torch loads
        if importlib.util.find_spec(module) is None:
            print(f"{tag} {sys.executable} cannot import {module} (run scripts/setup.sh, or set NANOGPT_PYTHON to a "
                  "Python with torch and safetensors)", file=sys.stderr)
            return 3
    try:
        if mode == "read":
            read(*argv[2:])
        else:
            write(*argv[2:])
    except BridgeError as e:
        print(f"{tag} {e}", file=sys.stderr)
        return 1
    except Exception as e:
        print(f"{tag} {type(e).__name__}: {first_line(e)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
