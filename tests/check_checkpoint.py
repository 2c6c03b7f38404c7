#!/usr/bin/env python3
"""Opens a nanogpt-cpp checkpoint (format 2, safetensors) the way a Python user would, and prints
what it holds as one JSON document, for tests/test_robustness.cpp to compare with what C++ wrote:

    {"metadata": {key: string, ...},
     "tensors": {name: {"dtype": "float32", "shape": [..], "values": [flattened values]}, ...}}

Usage: check_checkpoint.py CHECKPOINT. Needs numpy and safetensors; never imports torch.
"""
import json
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    tensors = load_file(path)
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
        if sorted(f.keys()) != sorted(tensors):
            print(f"check_checkpoint: safe_open and load_file disagree on the names in {path}", file=sys.stderr)
            return 1
    if metadata.get("format") != "nanogpt-cpp checkpoint":
        print(f"check_checkpoint: {path} is not a nanogpt-cpp checkpoint (format {metadata.get('format')!r})",
              file=sys.stderr)
        return 1
    # The metadata that is JSON must parse as JSON in Python too.
    json.loads(metadata["model_config"])
    out = {"metadata": metadata, "tensors": {}}
    for name, array in tensors.items():
        values = array.reshape(-1)
        out["tensors"][name] = {
            "dtype": str(array.dtype),
            "shape": list(array.shape),
            # float32 -> Python float is exact, and json writes the shortest repr that reads back.
            "values": [float(v) for v in values] if np.issubdtype(array.dtype, np.floating)
                      else [int(v) for v in values],
        }
    json.dump(out, sys.stdout, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
