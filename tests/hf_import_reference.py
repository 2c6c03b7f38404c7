#!/usr/bin/env python3
"""The reference side of the Hugging Face import tests (tests/test_hf_import.cpp, test_data_hf_tokenizer.cpp),
without the hub: tokenizers trained here on a corpus with the `tokenizers` library, tiny models with random
weights built with transformers, and what they compute, written as JSON.

usage:
  hf_import_reference.py tokenizers CORPUS OUT_DIR
      trains gpt2.json (byte-level BPE, GPT-2's split), llama3.json (byte-level BPE, Llama 3's split pattern,
      ignore_merges, a <|begin_of_text|> in front), sp.json (SentencePiece-style BPE as Llama 2's tokenizer.json:
      Prepend and Replace normalizer, byte fallback, <s> in front) and sp_metaspace.json (the same model behind a
      Metaspace pre-tokenizer)
  hf_import_reference.py encode TOKENIZER_JSON TEXTS_DIR OUT.json
      each file of TEXTS_DIR (bytes, decoded with errors="replace") encoded as tokenizer(text) and decoded back:
      {"<file>": {"ids": [...], "decoded": "..."}}
  hf_import_reference.py models TOKENIZER_DIR OUT_DIR
      OUT_DIR/gpt2 (GPT2LMHeadModel, gpt2.json), OUT_DIR/llama (LlamaForCausalLM: grouped-query attention, its own
      head, rms_norm_eps 1e-6, rope_theta 500000, sp.json, sharded) and OUT_DIR/llama3 (tied head, llama3.json)
  hf_import_reference.py run MODEL_DIR REQUEST.json OUT.json
      REQUEST {"ids": [[...]], "greedy": [...], "max_new_tokens": N}: fp32 logits of ids (flat, with "shape") and
      the greedy continuation of "greedy"
"""
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def lines(corpus):
    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    # Some CJK, emoji and digits too, so that merges exist beyond English letters.
    extra = ["中文字符测试，你好世界。我们今天学习分词。", "😀🎉👍🏽 emoji 🚀", "12345 67890 3.14159 2024-12-05"] * 20
    return text.splitlines() + extra


def byte_level(corpus, vocab_size, llama3):
    tok = Tokenizer(models.BPE(ignore_merges=llama3))
    if llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"] if llama3 else ["<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines(corpus), trainer)
    if llama3:
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return json.loads(tok.to_str())


def sentencepiece_style(corpus, vocab_size, metaspace):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                  show_progress=False)
    tok.train_from_iterator(lines(corpus), trainer)
    j = json.loads(tok.to_str())
    # As Llama 2's file: the byte tokens are pieces of the model, not added tokens.
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in ("<unk>", "<s>", "</s>")]
    for a in j["added_tokens"]:
        a["special"] = True
    if metaspace:
        j["normalizer"] = None
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
            {"type": "ByteFallback"}, {"type": "Fuse"}]}
    else:
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        j["pre_tokenizer"] = None
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    Tokenizer.from_str(json.dumps(j))  # the library reads it
    return j


def train_tokenizers(corpus, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    files = {"gpt2.json": byte_level(corpus, 800, False), "llama3.json": byte_level(corpus, 800, True),
             "sp.json": sentencepiece_style(corpus, 800, False),
             "sp_metaspace.json": sentencepiece_style(corpus, 800, True)}
    for name, j in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)


def encode(tokenizer_json, texts_dir, out):
    tok = Tokenizer.from_file(tokenizer_json)
    result = {}
    for name in sorted(os.listdir(texts_dir)):
        with open(os.path.join(texts_dir, name), "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        ids = tok.encode(text).ids
        result[name] = {"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)}
    with open(out, "w") as f:
        json.dump(result, f)


def build_models(tokenizer_dir, out_dir):
    import shutil

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    def size_of(name):
        return Tokenizer.from_file(os.path.join(tokenizer_dir, name)).get_vocab_size(with_added_tokens=True)

    torch.manual_seed(0)
    # Weights wider than the usual 0.02, so that the logits of a random model are far apart and greedy
    # choices are not near-ties.
    gpt2 = GPT2LMHeadModel(GPT2Config(
        vocab_size=size_of("gpt2.json"), n_positions=256, n_embd=64, n_layer=2, n_head=4, n_inner=None,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.3,
        layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0))
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=size_of("sp.json"), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_theta=500000.0, tie_word_embeddings=False, initializer_range=0.15))
    llama3 = LlamaForCausalLM(LlamaConfig(
        vocab_size=size_of("llama3.json"), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.15))
    for name, model, tokenizer, shard in [("gpt2", gpt2, "gpt2.json", None), ("llama", llama, "sp.json", "100KB"),
                                          ("llama3", llama3, "llama3.json", None)]:
        folder = os.path.join(out_dir, name)
        if shard:
            model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
        else:
            model.save_pretrained(folder, safe_serialization=True)
        shutil.copy(os.path.join(tokenizer_dir, tokenizer), os.path.join(folder, "tokenizer.json"))


def run(model_dir, request_path, out):
    import torch
    from transformers import AutoModelForCausalLM

    with open(request_path) as f:
        request = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    model.eval()
    result = {}
    with torch.no_grad():
        logits = model(torch.tensor(request["ids"], dtype=torch.long)).logits
        result["logits"] = logits.flatten().tolist()
        result["shape"] = list(logits.shape)
        prompt = torch.tensor([request["greedy"]], dtype=torch.long)
        generated = model.generate(prompt, max_new_tokens=request["max_new_tokens"], min_new_tokens=request["max_new_tokens"],
                                   do_sample=False, eos_token_id=None, pad_token_id=0,
                                   attention_mask=torch.ones_like(prompt))
        result["greedy"] = generated[0, prompt.shape[1]:].tolist()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "tokenizers":
        train_tokenizers(*args)
    elif command == "encode":
        encode(*args)
    elif command == "models":
        build_models(*args)
    elif command == "run":
        run(*args)
    else:
        sys.exit("unknown command " + command)
