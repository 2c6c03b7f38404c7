// TrainConfig <-> YAML and nanoGPT-style overrides. One table of key descriptors (name, member,
// group) drives parsing, overrides, to_yaml and config_keys, so a key is written down once.
//
// Scalars are parsed by the key's type, never by YAML's guess: integers reject 1.5 and 1e3; numbers
// accept 1e-3, 6e-4 and integers (finite only); bools accept true/false and nanoGPT's True/False
// (not yes/no/on/off); strings take the scalar as written. An empty document means all defaults.
#include "train/config.h"

#include <fmt/format.h>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "data/utf8.h"
#include "runtime/device.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <variant>

namespace nanogpt::train {
namespace {

// A key's field, found in a config: a TrainConfig member or a member of its nested ModelConfig.
using Field = std::variant<int64_t*, double*, bool*, std::string*>;

struct Key {
  const char* name;
  Field (*field)(TrainConfig&);
  const char* group;        // to_yaml writes "# group" before this key; nullptr for none
  const char* range;        // the values validate() accepts, as the docs say them
  const char* nanogpt;      // the same setting's name in nanoGPT's train.py; "" when nanoGPT has none
  const char* description;  // one line for `train --help` and docs/configuration.md
};

// The one table of keys: parsing, overrides, to_yaml, `train --help` and docs/configuration.md all
// read it. The macros keep each key's name and member identical; order = the order to_yaml writes.
// A new key is one line here (and its member, default and rule in validate()).
#define KEY(field, group, ...) Key{#field, [](TrainConfig& c) -> Field { return &c.field; }, group, __VA_ARGS__}
#define MODEL_KEY(field, group, ...) \
  Key{#field, [](TrainConfig& c) -> Field { return &c.model.field; }, group, __VA_ARGS__}
const std::array kKeys = {
    // I/O
    KEY(out_dir, "I/O", "a folder", "out_dir", "checkpoints, metrics.csv, train.log, config.yaml and loss.png go here"),
    KEY(eval_interval, nullptr, ">= 1", "eval_interval", "evaluate (and write ckpt_last.safetensors) every N iterations"),
    KEY(log_interval, nullptr, ">= 1", "log_interval", "one [train] line every N iterations"),
    KEY(eval_iters, nullptr, ">= 1", "eval_iters", "batches averaged per split at each evaluation"),
    KEY(eval_only, nullptr, "true | false", "eval_only", "evaluate once and exit"),
    KEY(always_save_checkpoint, nullptr, "true | false", "always_save_checkpoint",
        "true: ckpt_best.safetensors at every evaluation (nanoGPT's ckpt.pt); false: only when val improves"),
    KEY(init_from, nullptr, "scratch | resume", "init_from", "start afresh, or continue from out_dir/ckpt_last.safetensors"),
    KEY(checkpoint_interval, nullptr, ">= 0", "",
        "also write ckpt_last.safetensors every N iterations between evaluations; 0 = at evaluations only"),
    KEY(checkpoint_minutes, nullptr, ">= 0", "",
        "also write ckpt_last.safetensors when this many minutes passed since the last save; 0 = off"),
    KEY(checkpoint_async, nullptr, "true | false", "",
        "true: training copies a snapshot and goes on while a background thread writes it; false: it waits for the write"),
    // data
    KEY(dataset, "data", "a folder or a name", "dataset",
        "a prepared folder (train.bin, val.bin, meta.bin) or one holding input.txt; a name without '/' means data/NAME"),
    KEY(val_fraction, nullptr, "(0, 1)", "", "last fraction of the characters held out for validation (nanoGPT's prepare.py: 0.1)"),
    KEY(verify_data, nullptr, "true | false", "", "read the token files whole at start-up and check them against meta.bin"),
    KEY(tokenizer, nullptr, "char | bpe", "",
        "how input.txt is tokenized: one token per character, or SentencePiece BPE subwords trained on it "
        "(a folder prepared by `nanogpt prepare` keeps its own)"),
    KEY(vocab_size, nullptr, "0 for char; 259..1048576 for bpe", "", "bpe: the pieces the tokenizer learns (e.g. 2048)"),
    KEY(gradient_accumulation_steps, nullptr, ">= 1, divisible by the processes", "gradient_accumulation_steps",
        "micro-batches per optimizer step, over all processes"),
    KEY(batch_size, nullptr, ">= 1", "batch_size", "sequences per micro-batch"),
    MODEL_KEY(block_size, nullptr, ">= 1", "block_size", "context length T in characters"),
    // model
    MODEL_KEY(n_layer, "model", ">= 1", "n_layer", "transformer blocks"),
    MODEL_KEY(n_head, nullptr, ">= 1, divides n_embd", "n_head", "query heads"),
    MODEL_KEY(n_kv_head, nullptr, "0 or a divisor of n_head", "", "key/value heads (grouped-query attention); 0 = n_head"),
    MODEL_KEY(n_embd, nullptr, ">= 1", "n_embd", "model width C"),
    MODEL_KEY(dropout, nullptr, "[0, 1)", "dropout", "embedding, attention and residual dropout probability"),
    MODEL_KEY(bias, nullptr, "true | false", "bias", "biases in Linear layers and LayerNorm"),
    MODEL_KEY(pos_encoding, nullptr, "rope | sinusoidal | learned", "",
        "positions: rotary (RoPE), fixed sinusoids, or nanoGPT's learned table (wpe)"),
    MODEL_KEY(rope_base, nullptr, "> 1", "", "RoPE frequency base (pos_encoding rope only)"),
    MODEL_KEY(norm, nullptr, "layernorm | rmsnorm", "", "LayerNorm (nanoGPT) or RMSNorm"),
    MODEL_KEY(attention, nullptr, "auto | math | sdpa | chunked | flash", "",
        "auto: chunked to train on a CPU (flash from T = 128), sdpa (LibTorch's fused kernels) for evaluation, "
        "sampling and CUDA; "
        "math: the lesson written out; chunked: math as one node in cache-sized chunks; "
        "flash: blocked online softmax on a CPU, no (T, T) scores"),
    MODEL_KEY(qk_norm, nullptr, "true | false", "", "RMS-normalise each head's queries and keys before RoPE"),
    MODEL_KEY(mlp, nullptr, "gelu | relu2 | swiglu", "", "the MLP's activation: GELU (nanoGPT), ReLU squared, or SiLU-gated"),
    MODEL_KEY(mlp_width, nullptr, ">= 0", "", "the MLP's hidden width; 0 = 4 n_embd (8 n_embd / 3 for swiglu)"),
    MODEL_KEY(tie_embeddings, nullptr, "true | false", "", "the head reuses wte's weights (nanoGPT); false = its own lm_head"),
    MODEL_KEY(logit_softcap, nullptr, ">= 0", "", "> 0: logits = cap * tanh(logits / cap); 0 = off"),
    // AdamW
    KEY(learning_rate, "AdamW", "> 0", "learning_rate", "peak learning rate"),
    KEY(max_iters, nullptr, ">= 0", "max_iters", "total optimizer steps"),
    KEY(weight_decay, nullptr, ">= 0", "weight_decay", "AdamW weight decay, on weights of 2 or more dimensions only"),
    KEY(beta1, nullptr, "[0, 1)", "beta1", "AdamW beta1"),
    KEY(beta2, nullptr, "[0, 1)", "beta2", "AdamW beta2"),
    KEY(grad_clip, nullptr, ">= 0", "grad_clip", "clip the global gradient norm at this value; 0 = off"),
    KEY(optimizer, nullptr, "adamw | muon", "", "muon: Muon for the blocks' matrices, AdamW for the rest"),
    KEY(muon_learning_rate, nullptr, "> 0", "", "Muon's peak learning rate (follows the same schedule)"),
    KEY(muon_momentum, nullptr, "[0, 1)", "", "Muon's Nesterov momentum"),
    // learning rate schedule
    KEY(decay_lr, "learning rate schedule", "true | false", "decay_lr", "warmup then decay; false = constant learning_rate"),
    KEY(lr_schedule, nullptr, "cosine | wsd", "", "cosine (nanoGPT), or wsd: warmup, the peak held, then a linear decay"),
    KEY(warmup_iters, nullptr, ">= 0", "warmup_iters", "linear warmup steps"),
    KEY(lr_decay_iters, nullptr, ">= warmup_iters", "lr_decay_iters",
        "the rate reaches min_lr here and stays there (usually = max_iters)"),
    KEY(min_lr, nullptr, "[0, learning_rate]", "min_lr", "the rate after lr_decay_iters (~ learning_rate / 10)"),
    KEY(decay_frac, nullptr, "(0, 1]", "", "wsd: the decay takes the last decay_frac of lr_decay_iters"),
    // system
    KEY(device, "system", "auto | cpu | cuda | cuda:N", "device", "auto: the GPU when there is one, else the CPU"),
    KEY(dtype, nullptr, "auto | float32 | bfloat16 | float16", "dtype",
        "autocast with fp32 master weights; auto: bfloat16 where the device has fast bf16, else float16 with "
        "loss scaling on a GPU, float32 on a CPU"),
    KEY(seed, nullptr, ">= 0", "", "seed of weights, batches and dropout (nanoGPT: fixed 1337)"),
    KEY(num_threads, nullptr, ">= 0", "", "threads per process; 0 = all cores (under torchrun: cores / processes)"),
    KEY(tf32, nullptr, "true | false", "", "CUDA: float32 products on TF32 tensor cores (Ampere and later), as nanoGPT allows"),
    KEY(cuda_graphs, nullptr, "auto | true | false", "",
        "each step replayed as CUDA graphs after 3 eager steps; auto: on for one process on CUDA, off on a CPU and "
        "under torchrun"),
    KEY(compile, nullptr, "true | false", "compile", "accepted for nanoGPT compatibility; no effect"),
    KEY(plot, nullptr, "true | false", "", "redraw out_dir/loss.png at every evaluation"),
    // data parallel (torchrun)
    KEY(backend, "data parallel (torchrun)", "auto | gloo | nccl", "backend", "auto: gloo on a CPU, nccl on CUDA"),
    KEY(ddp_timeout, nullptr, ">= 1", "", "seconds: a lost or stuck process stops the others within this"),
    KEY(ddp_bucket_mb, nullptr, ">= 0", "",
        "gradient all-reduce buckets (MB) overlapping the backward pass; 0 = one all-reduce after it"),
};
#undef MODEL_KEY
#undef KEY


[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::invalid_argument("[config] " + data::escape_controls(where + ": " + what));
}

std::string line_suffix(const YAML::Mark& mark) {
  return mark.is_null() ? "" : fmt::format(", line {}", mark.line + 1);
}

// Shortest text that parses back to the same double, written as nanoGPT would: "6e-4" rather than
// "6e-04", "10000.0" rather than "10000".
std::string format_double(double value) {
  char buf[64];
  const auto end = std::to_chars(buf, buf + sizeof buf, value).ptr;
  std::string text(buf, end);
  const size_t e = text.find('e');
  if (e != std::string::npos) {
    const size_t digits = e + 2;  // to_chars always writes the exponent's sign
    while (text.size() > digits + 1 && text[digits] == '0') text.erase(digits, 1);
  } else if (text.find_first_not_of("-0123456789") == std::string::npos) {
    text += ".0";
  }
  return text;
}

std::string_view strip_plus(std::string_view s) {
  return s.size() > 1 && s[0] == '+' && s[1] != '-' && s[1] != '+' ? s.substr(1) : s;
}

std::optional<int64_t> parse_int(std::string_view s) {
  s = strip_plus(s);
  int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_double(std::string_view s) {
  s = strip_plus(s);
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<bool> parse_bool(std::string_view s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

const char* expects(const Key& key) {
  static constexpr const char* kNames[] = {"an integer", "a number", "true or false", "a string"};
  TrainConfig any;
  return kNames[key.field(any).index()];
}

// Sets one key from its scalar text; `where` names the source for the error.
void set_value(TrainConfig& config, const Key& key, const std::string& text, const std::string& where,
               const std::string& suffix = "") {
  bool ok = true;
  std::visit(
      [&](auto* field_ptr) {
        auto& field = *field_ptr;
        using T = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          const auto v = parse_int(text);
          if ((ok = v.has_value())) field = *v;
        } else if constexpr (std::is_same_v<T, double>) {
          const auto v = parse_double(text);
          if ((ok = v.has_value())) field = *v;
        } else if constexpr (std::is_same_v<T, bool>) {
          const auto v = parse_bool(text);
          if ((ok = v.has_value())) field = *v;
        } else {
          field = text;
        }
      },
      key.field(config));
  if (!ok)
    fail(where, "key '" + std::string(key.name) + "' expects " + expects(key) + ", got '" + text + "'" +
                    suffix);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

const Key& find_key(const std::string& name, const std::string& where, const std::string& suffix = "") {
  const Key* closest = nullptr;
  size_t best = std::min<size_t>(2, name.size() / 4) + 1;  // suggest only near misses: max_iter, not nope
  for (const Key& key : kKeys) {
    if (name == key.name) return key;
    const size_t d = edit_distance(name, key.name);
    if (d < best) {
      best = d;
      closest = &key;
    }
  }
  std::string hint;
  if (closest) {
    hint = " (did you mean '" + std::string(closest->name) + "'?)";
  } else {
    for (const Key& key : kKeys) hint += (hint.empty() ? " (known keys: " : ", ") + std::string(key.name);
    hint += ")";
  }
  fail(where, "unknown key '" + name + "'" + hint + suffix);
}

const char* node_kind(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping (the config is flat: no nested keys)";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "no value";
  return "a scalar";
}

// Plain YAML when it reads back as the same string, else double-quoted with escapes.
std::string quote_if_needed(const std::string& s) {
  const bool plain = !s.empty() && s != "null" && s != "Null" && s != "NULL" &&
                     (std::isalnum(static_cast<unsigned char>(s[0])) || s[0] == '_' || s[0] == '.' || s[0] == '/') &&
                     s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:-+") ==
                         std::string::npos &&
                     s.back() != ':';
  if (plain) return s;
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return data::escape_controls(out) + "\"";  // YAML's double quotes read \xNN back; UTF-8 passes through
}

// Counts the documents of a YAML text. Not with YAML::LoadAll: in yaml-cpp 0.7 it never returns on
// a document that starts with a stray ',' (e.g. a config holding just ","): each parser call yields
// the same empty document without consuming input, and the list of documents grows until memory
// runs out. A document that starts where the previous one did is that case.
size_t count_documents(const std::string& yaml_text, const std::string& source) {
  struct DocumentStarts : YAML::EventHandler {
    YAML::Mark start;
    void OnDocumentStart(const YAML::Mark& mark) override { start = mark; }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  };
  std::istringstream in(yaml_text);
  YAML::Parser parser(in);
  DocumentStarts starts;
  size_t count = 0;
  int previous = -1;
  while (parser.HandleNextDocument(starts)) {
    if (starts.start.pos == previous)
      fail(source, fmt::format("cannot parse past line {}, column {} (a stray ',' outside [ ] or {{ }}?)", starts.start.line + 1,
                               starts.start.column + 1));
    previous = starts.start.pos;
    ++count;
  }
  return count;
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::string& source) {
  TrainConfig config;
  try {
    const size_t documents = count_documents(yaml_text, source);
    if (documents > 1)
      fail(source, fmt::format("holds {} YAML documents; a config is one mapping of key: value", documents));
    if (documents == 0) return config;  // empty text (or only comments): all defaults
    const YAML::Node root = YAML::Load(yaml_text);
    if (root.IsNull()) return config;  // empty document: all defaults
    if (!root.IsMap())
      fail(source, std::string("expected a mapping of key: value at the top level, got ") + node_kind(root) +
                       line_suffix(root.Mark()));
    std::set<std::string> seen;
    for (const auto& entry : root) {
      const std::string line = line_suffix(entry.first.Mark());
      if (!entry.first.IsScalar()) fail(source, std::string("a key must be a plain name, got ") + node_kind(entry.first) + line);
      const std::string name = entry.first.Scalar();
      const Key& key = find_key(name, source, line);
      if (!seen.insert(name).second) fail(source, "key '" + name + "' is given twice" + line);
      if (!entry.second.IsScalar())
        fail(source, "key '" + name + "' expects " + expects(key) + ", got " + node_kind(entry.second) + line);
      set_value(config, key, entry.second.Scalar(), source, line);
    }
  } catch (const YAML::Exception& e) {
    fail(source, e.msg + line_suffix(e.mark));
  }
  return config;
}

TrainConfig load_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error("[config] cannot read '" + path + "': it is a folder (pass a YAML file, e.g. configs/shakespeare_char.yaml)");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("[config] cannot read '" + path + "': " + std::strerror(errno) +
                             " (pass a YAML file, e.g. configs/shakespeare_char.yaml)");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("[config] cannot read '" + path + "': read error");
  return parse_config(text.str(), path);
}

void apply_overrides(TrainConfig& config, const std::vector<std::string>& overrides) {
  TrainConfig updated = config;  // all or nothing
  for (const std::string& arg : overrides) {
    const std::string where = "--override '" + arg + "'";
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos || eq == 2)
      fail(where, "expected --key=value, as in nanoGPT (e.g. --max_iters=100 --device=cpu)");
    set_value(updated, find_key(arg.substr(2, eq - 2), where), arg.substr(eq + 1), where);
  }
  config = updated;
}

namespace {

// A key's value as to_yaml writes it.
std::string value_text(const Key& key, TrainConfig& config) {
  return std::visit(
      [](auto* field_ptr) -> std::string {
        const auto& field = *field_ptr;
        using T = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(field);
        else if constexpr (std::is_same_v<T, double>) return format_double(field);
        else if constexpr (std::is_same_v<T, bool>) return field ? "true" : "false";
        else return quote_if_needed(field);
      },
      key.field(config));
}

}  // namespace

std::string to_yaml(const TrainConfig& config) {
  TrainConfig copy = config;  // the key table hands out mutable fields
  std::string out;
  for (const Key& key : kKeys) {
    if (key.group) out += std::string(out.empty() ? "" : "\n") + "# " + key.group + "\n";
    out += std::string(key.name) + ": " + value_text(key, copy) + "\n";
  }
  return out;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> names;
  for (const Key& key : kKeys) names.emplace_back(key.name);
  return names;
}

std::vector<ConfigKey> config_key_table() {
  static constexpr const char* kTypes[] = {"int", "float", "bool", "string"};
  TrainConfig defaults;
  std::vector<ConfigKey> table;
  std::string group;
  for (const Key& key : kKeys) {
    if (key.group) group = key.group;
    table.push_back({key.name, kTypes[key.field(defaults).index()], value_text(key, defaults), key.range,
                     key.nanogpt, key.description, group});
  }
  return table;
}

torch::ScalarType TrainConfig::autocast_dtype() const { return runtime::autocast_dtype(dtype); }

void TrainConfig::validate() const {
  // Each rule is written as what must hold, so NaN (never parsed, but settable in code) fails too.
  auto check = [](bool ok, const std::string& key, const std::string& value, const std::string& rule) {
    if (!ok) throw std::invalid_argument("[config] " + data::escape_controls(key + " (" + value + ") " + rule));
  };
  const auto i = [](int64_t v) { return std::to_string(v); };
  const auto d = format_double;
  const auto in = [](const std::string& v, std::initializer_list<const char*> allowed) {
    for (const char* a : allowed) if (v == a) return true;
    return false;
  };
  // I/O and data
  check(!out_dir.empty(), "out_dir", "''", "must name the folder for checkpoints and logs, e.g. out");
  check(eval_interval >= 1, "eval_interval", i(eval_interval), "must be >= 1: evaluate every N iterations");
  check(log_interval >= 1, "log_interval", i(log_interval), "must be >= 1: log every N iterations");
  check(eval_iters >= 1, "eval_iters", i(eval_iters), "must be >= 1: batches averaged per split at each evaluation");
  // Any other value names a checkpoint (or a folder of one) whose weights a new run starts from; the
  // trainer checks that it is there.
  check(!init_from.empty(), "init_from", "''", "must be scratch, resume or a checkpoint's folder (e.g. one `nanogpt import` wrote)");
  // A newline or tab here is a YAML slip (a `|` block, a stray quote), not a folder anyone meant.
  check(std::none_of(init_from.begin(), init_from.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }),
        "init_from", init_from, "holds a control character: write the folder's name on one line, e.g. init_from: out-gpt2");
  check(!dataset.empty(), "dataset", "''", "must name a folder with input.txt, e.g. data/shakespeare_char");
  check(val_fraction > 0 && val_fraction < 1, "val_fraction", d(val_fraction),
        "must be in (0, 1): the fraction of characters held out for validation, e.g. 0.1");
  check(in(tokenizer, {"char", "bpe"}), "tokenizer", tokenizer, "must be char or bpe");
  if (tokenizer == "bpe") {
    check(vocab_size > 258 && vocab_size <= (1 << 20), "vocab_size", i(vocab_size),
          "must be in 259..1048576 with tokenizer bpe (256 byte pieces, <unk> and the newline come first), e.g. 2048");
  } else {
    check(vocab_size == 0, "vocab_size", i(vocab_size),
          "applies to tokenizer bpe only (a char vocabulary is the text's characters): add --tokenizer=bpe or drop it");
  }
  check(gradient_accumulation_steps >= 1, "gradient_accumulation_steps", i(gradient_accumulation_steps), "must be >= 1");
  check(batch_size >= 1, "batch_size", i(batch_size), "must be >= 1");
  // model: its own rules (model/config.cpp), reported under this tag
  try {
    model.validate();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    throw std::invalid_argument("[config] " + data::escape_controls(what.substr(what.find("] ") + 2)));
  }
  // AdamW and schedule
  check(learning_rate > 0, "learning_rate", d(learning_rate), "must be > 0, e.g. 1e-3");
  check(max_iters >= 0, "max_iters", i(max_iters), "must be >= 0");
  check(weight_decay >= 0, "weight_decay", d(weight_decay), "must be >= 0 (0 turns it off)");
  check(beta1 >= 0 && beta1 < 1, "beta1", d(beta1), "must be in [0, 1), e.g. 0.9");
  check(beta2 >= 0 && beta2 < 1, "beta2", d(beta2), "must be in [0, 1), e.g. 0.99 or 0.95");
  check(grad_clip >= 0, "grad_clip", d(grad_clip), "must be >= 0 (0 turns clipping off)");
  check(checkpoint_interval >= 0, "checkpoint_interval", i(checkpoint_interval),
        "must be >= 0 iterations (0 = save at evaluations only)");
  check(checkpoint_minutes >= 0 && std::isfinite(checkpoint_minutes), "checkpoint_minutes", d(checkpoint_minutes),
        "must be >= 0 minutes (0 = off)");
  check(in(optimizer, {"adamw", "muon"}), "optimizer", optimizer, "must be adamw or muon");
  check(muon_learning_rate > 0, "muon_learning_rate", d(muon_learning_rate), "must be > 0, e.g. 0.02");
  check(muon_momentum >= 0 && muon_momentum < 1, "muon_momentum", d(muon_momentum), "must be in [0, 1), e.g. 0.95");
  check(in(lr_schedule, {"cosine", "wsd"}), "lr_schedule", lr_schedule, "must be cosine or wsd");
  check(decay_frac > 0 && decay_frac <= 1, "decay_frac", d(decay_frac), "must be in (0, 1], e.g. 0.2");
  check(warmup_iters >= 0, "warmup_iters", i(warmup_iters), "must be >= 0");
  if (decay_lr) {  // min_lr and lr_decay_iters only matter with decay
    check(min_lr >= 0, "min_lr", d(min_lr), "must be >= 0");
    check(min_lr <= learning_rate, "min_lr", d(min_lr),
          "must be <= learning_rate (" + d(learning_rate) + "): the cosine decays from learning_rate to min_lr (~ learning_rate / 10)");
    check(lr_decay_iters >= warmup_iters, "lr_decay_iters", i(lr_decay_iters),
          "must be >= warmup_iters (" + i(warmup_iters) + ") when decay_lr is true (usually ~ max_iters)");
  }
  // system
  const bool cuda_n = device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
                      device.find_first_not_of("0123456789", 5) == std::string::npos;
  check(in(device, {"auto", "cpu", "cuda"}) || cuda_n, "device", device, "must be auto, cpu, cuda or cuda:N");
  check(in(dtype, {"auto", "float32", "bfloat16", "float16"}), "dtype", dtype,
        "must be auto, float32, bfloat16 or float16 (auto: bfloat16 where the device has fast bf16, else "
        "float16 with dynamic loss scaling on a GPU, float32 on a CPU)");
  check(seed >= 0, "seed", i(seed), "must be >= 0");
  check(in(cuda_graphs, {"auto", "true", "false"}), "cuda_graphs", cuda_graphs,
        "must be auto, true or false (auto: on for one process on CUDA)");
  check(num_threads >= 0, "num_threads", i(num_threads), "must be >= 0 (0 = all cores; under torchrun, cores / processes per machine)");
  check(in(backend, {"auto", "gloo", "nccl"}), "backend", backend, "must be auto, gloo or nccl (auto: gloo on a CPU, nccl on CUDA)");
  check(backend != "nccl" || device.rfind("cuda", 0) == 0 || device == "auto", "backend", backend,
        "needs a CUDA device (use backend: gloo or auto with device: cpu)");
  check(ddp_timeout >= 1, "ddp_timeout", i(ddp_timeout), "must be >= 1 second, e.g. 60");
  check(ddp_bucket_mb >= 0, "ddp_bucket_mb", d(ddp_bucket_mb), "must be >= 0 (0: one all-reduce after the backward pass)");
}

model::ModelConfig TrainConfig::default_model() {
  model::ModelConfig m;
  m.block_size = 1024;
  m.n_layer = 12;
  m.n_head = 12;
  m.n_embd = 768;
  return m;
}

void TrainConfig::set_architecture(const model::ModelConfig& m) {
  const double kept_dropout = model.dropout;
  model = m;
  model.dropout = kept_dropout;
}

}  // namespace nanogpt::train
