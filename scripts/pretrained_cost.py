#!/usr/bin/env python3
"""A stand-in for GPT-2 (124M), made without the hub, for scripts/pretrained_cost.sh: a GPT2LMHeadModel of
GPT-2's shape (transformers' default GPT2Config: 12 layers, 12 heads, 768 wide, 1024 positions, 50257 tokens)
with random weights, and a byte-level BPE tokenizer.json (GPT-2's ByteLevel pre-tokenizer, post-processor and
decoder) trained with the `tokenizers` library on a corpus. The folder is what `hf download` writes for
openai-community/gpt2, less the other frameworks' files: config.json, model.safetensors, tokenizer.json.

The corpus alone does not hold 50257 pieces (tiny Shakespeare gives 21,528 with <|endoftext|>): the
vocabulary is filled up to the model's 50257 with pieces no merge makes ("<unused_N>", never produced by
encoding), as `nanogpt import` wants as many tokens as the model has rows, and so that every id a random
model samples decodes. --no_fill keeps the trained size (a folder the import refuses, to check that it does).

usage: pretrained_cost.py CORPUS OUT_DIR [--no_fill]
"""
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

GPT2_VOCAB = 50257


def gpt2_style_tokenizer(corpus, fill):
    with open(corpus, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=GPT2_VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    trained = tok.get_vocab_size(with_added_tokens=True)
    j = json.loads(tok.to_str())
    if fill:
        vocab = j["model"]["vocab"]
        next_id = max(vocab.values()) + 1
        while next_id < GPT2_VOCAB:
            vocab["<unused_%d>" % next_id] = next_id
            next_id += 1
        tok = Tokenizer.from_str(json.dumps(j))  # the library still reads it
    return j, trained, tok.get_vocab_size(with_added_tokens=True)


def main(corpus, out_dir, fill=True):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer, trained, size = gpt2_style_tokenizer(corpus, fill)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())  # GPT-2 (124M)'s shape; vocab_size 50257
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    params = sum(p.numel() for p in model.parameters())
    print("[model] GPT2LMHeadModel %.1fM parameters, vocab_size %d | tokenizer.json: %d tokens trained, %d in all"
          % (params / 1e6, model.config.vocab_size, trained, size))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no_fill"]
    if len(args) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    main(args[0], args[1], fill="--no_fill" not in sys.argv[1:])
