"""Drives `nanogpt serve` with the openai Python client (tests/test_serve.cpp runs it).

Usage: serve_openai_client.py BASE_URL API_KEY. Checks, through the client's own parsing: the model
list, a greedy completion, the same completion streamed (whole characters, the same text, a final
finish_reason), logprobs, and that a bad field raises BadRequestError naming it. Exits non-zero
with a message on the first failure.
"""
import sys

import openai

base_url, api_key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
prompt = "\u5e8a\u524d\u660e\u6708\u5149"  # 床前明月光

models = client.models.list()
model = models.data[0].id
assert models.data[0].object == "model", models

done = client.completions.create(model=model, prompt=prompt, max_tokens=30, temperature=0, logprobs=1)
text = done.choices[0].text
assert len(text) == 30, f"30 characters expected, got {len(text)}: {text!r}"
assert done.choices[0].finish_reason == "length", done
assert done.usage.completion_tokens == 30, done.usage
assert len(done.choices[0].logprobs.tokens) == 30, done.choices[0].logprobs

pieces, finish = [], None
for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=30, temperature=0, stream=True):
    piece = chunk.choices[0].text
    pieces.append(piece)
    if chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
streamed = "".join(pieces)
assert streamed == text, f"streamed {streamed!r} != {text!r}"
assert finish == "length", finish

several = client.completions.create(model=model, prompt=[prompt, prompt[:2]], max_tokens=8, n=2, seed=3)
assert sorted(c.index for c in several.choices) == [0, 1, 2, 3], several

try:
    client.completions.create(model=model, prompt=prompt, max_tokens=5, top_p=2.0)
    sys.exit("top_p=2 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "top_p" in str(e), e

bad = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
try:
    bad.models.list()
    sys.exit("a wrong key was accepted")
except openai.AuthenticationError:
    pass
print("openai client: all checks passed:", repr(text))
