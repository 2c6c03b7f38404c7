#!/usr/bin/env python3
"""An independent GPT for tests/test_bridge.cpp: written here from the equations, with the module
names, state_dict layout and checkpoint dict keys of nanoGPT's train.py, so that the C++ importer
can be checked against a model it has never seen.

    nanogpt_reference.py OUT_DIR [--no-bias]

writes into OUT_DIR:
  ckpt.pt          {'model' (keys under torch.compile's '_orig_mod.' prefix), 'optimizer' (AdamW after
                    3 steps), 'model_args', 'iter_num', 'best_val_loss', 'config'}
  meta.pkl         {'vocab_size', 'itos', 'stoi'}; ids deliberately NOT in code point order
  meta_bpe.pkl     a GPT-2-like meta without itos;  meta_subword.pkl: itos with multi-character tokens
  meta_evil.pkl    a pickle that would create OUT_DIR/evil_ran if anything unpickled it unrestricted
  expected.safetensors
                   "logits" (T, V) for the token ids "x" (T,) at every position; "after:<key>": every
                   parameter after one more AdamW step on the batch ("bx", "by") with lr; metadata
                   "itos" (the vocabulary in nanoGPT's id order) and "lr"
"""
import math
import os
import pickle
import sys

import torch
from safetensors.torch import save_file

CHARS = "zyx\n !,.abcdefghij"  # nanoGPT id = position here: reversed blocks, so sorting matters


class Norm(torch.nn.Module):
    """y = (x - mean) / sqrt(var + 1e-5) * weight (+ bias), var biased, over the last dim."""

    def __init__(self, width, bias):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.bias = torch.nn.Parameter(torch.zeros(width)) if bias else None

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        y = (x - mean) / torch.sqrt(var + 1e-5) * self.weight
        return y + self.bias if self.bias is not None else y


class Attention(torch.nn.Module):
    def __init__(self, width, heads, bias):
        super().__init__()
        self.heads = heads
        self.c_attn = torch.nn.Linear(width, 3 * width, bias=bias)
        self.c_proj = torch.nn.Linear(width, width, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = self.c_attn(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(B, T, self.heads, hs).permute(0, 2, 1, 3) for t in (q, k, v))  # (B, nh, T, hs)
        scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(hs)
        future = torch.arange(T)[None, :] > torch.arange(T)[:, None]
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        y = torch.einsum("bhts,bhsd->bhtd", weights, v)
        return self.c_proj(y.permute(0, 2, 1, 3).reshape(B, T, C))


class MLP(torch.nn.Module):
    def __init__(self, width, bias):
        super().__init__()
        self.c_fc = torch.nn.Linear(width, 4 * width, bias=bias)
        self.c_proj = torch.nn.Linear(4 * width, width, bias=bias)

    def forward(self, x):
        h = self.c_fc(x)
        return self.c_proj(0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0))))  # GELU, exact


class Block(torch.nn.Module):
    def __init__(self, width, heads, bias):
        super().__init__()
        self.ln_1 = Norm(width, bias)
        self.attn = Attention(width, heads, bias)
        self.ln_2 = Norm(width, bias)
        self.mlp = MLP(width, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Reference(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        C = args["n_embd"]
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(args["vocab_size"], C),
            wpe=torch.nn.Embedding(args["block_size"], C),
            h=torch.nn.ModuleList([Block(C, args["n_head"], args["bias"]) for _ in range(args["n_layer"])]),
            ln_f=Norm(C, args["bias"])))
        self.lm_head = torch.nn.Linear(C, args["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # one tensor, two names in the state_dict

    def forward(self, idx):
        T = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    def loss(self, x, y):
        logits = self(x)
        return -torch.log_softmax(logits, -1).gather(-1, y[..., None]).mean()


def main(argv):
    out, bias = argv[1], "--no-bias" not in argv
    torch.manual_seed(7)
    args = dict(n_layer=2, n_head=2, n_embd=16, block_size=12, bias=bias, vocab_size=len(CHARS), dropout=0.0)
    model = Reference(args)
    with torch.no_grad():
        for name, p in model.named_parameters():  # far from the usual init, so any misplaced tensor shows
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") else 0.0))
    config = dict(out_dir="out-ref", eval_interval=50, log_interval=5, eval_iters=20, eval_only=False,
                  always_save_checkpoint=False, init_from="scratch", wandb_log=False, dataset="shakespeare_char",
                  gradient_accumulation_steps=1, batch_size=3, block_size=12, n_layer=2, n_head=2, n_embd=16,
                  dropout=0.0, bias=bias, learning_rate=1e-2, max_iters=100, weight_decay=0.1, beta1=0.9,
                  beta2=0.99, grad_clip=0.0, decay_lr=True, warmup_iters=10, lr_decay_iters=100, min_lr=1e-3,
                  backend="nccl", device="cpu", dtype="float32", compile=True)
    params = dict(model.named_parameters())
    groups = [{"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": config["weight_decay"]},
              {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=config["learning_rate"], betas=(config["beta1"], config["beta2"]))
    V, T = args["vocab_size"], args["block_size"]
    for _ in range(3):
        x, y = torch.randint(V, (3, T)), torch.randint(V, (3, T))
        optimizer.zero_grad()
        model.loss(x, y).backward()
        optimizer.step()
    state_dict = {"_orig_mod." + k: v for k, v in model.state_dict().items()}
    torch.save({"model": state_dict, "optimizer": optimizer.state_dict(), "model_args": args, "iter_num": 3,
                "best_val_loss": torch.tensor(2.5), "config": config}, os.path.join(out, "ckpt.pt"))
    itos = dict(enumerate(CHARS))
    metas = {"meta.pkl": {"vocab_size": V, "itos": itos, "stoi": {c: i for i, c in itos.items()}},
             "meta_bpe.pkl": {"vocab_size": 50257, "encoder": "gpt2"},
             "meta_subword.pkl": {"vocab_size": 3, "itos": {0: "th", 1: "e", 2: "ing"}}}
    for name, meta in metas.items():
        with open(os.path.join(out, name), "wb") as f:
            pickle.dump(meta, f)

    class Evil:
        def __reduce__(self):
            return (open, (os.path.join(out, "evil_ran"), "w"))
    with open(os.path.join(out, "meta_evil.pkl"), "wb") as f:
        pickle.dump({"vocab_size": V, "itos": itos, "payload": Evil()}, f)

    expected = {}
    x = torch.tensor([[CHARS.index(c) for c in "hi, jade!\nz."]])
    with torch.no_grad():
        expected["logits"] = model(x)[0].contiguous()
        expected["x"] = x[0].clone()
    lr = 3e-3
    for group in optimizer.param_groups:
        group["lr"] = lr
    bx, by = torch.randint(V, (2, T)), torch.randint(V, (2, T))
    optimizer.zero_grad()
    model.loss(bx, by).backward()
    optimizer.step()
    expected["bx"], expected["by"] = bx, by
    for k, v in model.named_parameters():
        expected["after:" + k] = v.detach().clone().contiguous()
    save_file(expected, os.path.join(out, "expected.safetensors"), metadata={"itos": CHARS, "lr": repr(lr)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
