#!/usr/bin/env python3
"""Loads folders written by `nanogpt export --format=hf` with Hugging Face transformers, offline, the way
a user would (AutoModelForCausalLM, AutoTokenizer, pipeline), and writes what they compute as JSON.

usage: hf_reference.py REQUEST.json RESULT.json
REQUEST: {"models": [{"dir": "...", "batch": [[ids]], "prompts": ["..."], "max_new_tokens": 200,
                      "pipeline_tokens": 20}]}
RESULT:  {"models": [{"class", "tokenizer_class", "loading" (missing / unexpected / mismatched keys),
                      "logits" (flat fp32 of the batch), "shape", "prompts": [{"ids", "decoded_prompt",
                      "text" (greedy continuation)}], "pipeline", "pipeline_expected"}]}
"""
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # never the network: the folders are all there is
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: E402


def run(job):
    folder = job["dir"]
    model, info = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=torch.float32, output_loading_info=True)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    out = {
        "class": type(model).__name__,
        "tokenizer_class": type(tokenizer).__name__,
        "loading": {k: sorted(str(x) for x in v) for k, v in info.items() if k != "error_msgs"},
    }
    with torch.no_grad():
        logits = model(torch.tensor(job["batch"], dtype=torch.long)).logits  # (B, T, V)
    out["logits"] = logits.flatten().tolist()
    out["shape"] = list(logits.shape)
    out["prompts"] = []
    for prompt in job["prompts"]:
        ids = tokenizer(prompt, return_tensors="pt").input_ids  # (1, P)
        with torch.no_grad():
            tokens = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=job["max_new_tokens"])
        out["prompts"].append({
            "ids": ids[0].tolist(),
            "decoded_prompt": tokenizer.decode(ids[0]),
            "text": tokenizer.decode(tokens[0, ids.shape[1]:]),
        })
    generate = pipeline("text-generation", model=model, tokenizer=tokenizer)
    n = job["pipeline_tokens"]
    out["pipeline"] = generate(job["prompts"][0], max_new_tokens=n, do_sample=False)[0]["generated_text"]
    # The pipeline gives back the prompt as it was given (unknown characters included), then the
    # greedy continuation: n characters, one token each.
    out["pipeline_expected"] = job["prompts"][0] + out["prompts"][0]["text"][:n]
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    torch.manual_seed(0)
    result = {"transformers": transformers.__version__, "models": [run(job) for job in request["models"]]}
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
