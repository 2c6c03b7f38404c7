// ModelConfig validation: every impossible combination named with its values and a hint.
#include "model/config.h"

#include <sstream>
#include <stdexcept>

namespace nanogpt::model {
namespace {
[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("[model] " + message); }
}  // namespace

void ModelConfig::validate() const {
  auto positive = [](const char* name, int64_t value) {
    if (value <= 0) fail(std::string(name) + " (" + std::to_string(value) + ") must be positive");
  };
  positive("vocab_size", vocab_size);
  positive("block_size", block_size);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  if (n_kv_head < 0) fail("n_kv_head (" + std::to_string(n_kv_head) + ") must be >= 0 (0 means n_head)");
  if (n_embd % n_head != 0)
    fail("n_embd (" + std::to_string(n_embd) + ") must be divisible by n_head (" + std::to_string(n_head) + ")");
  if (n_head % kv_heads() != 0)
    fail("n_head (" + std::to_string(n_head) + ") must be divisible by n_kv_head (" + std::to_string(kv_heads()) +
         "): each key/value head serves a whole group of query heads");
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    std::ostringstream s;
    s << "dropout (" << dropout << ") must be in [0, 1)";
    fail(s.str());
  }
  if (pos_encoding != "rope" && pos_encoding != "sinusoidal" && pos_encoding != "learned")
    fail("pos_encoding '" + pos_encoding + "' is not one of rope | sinusoidal | learned");
  if (pos_encoding == "rope" && head_size() % 2 != 0)
    fail("RoPE needs an even head size, but n_embd / n_head = " + std::to_string(head_size()) +
         " (try another n_head or pos_encoding: learned)");
  if (pos_encoding == "rope" && !(rope_base > 1.0)) fail("rope_base must be > 1");
  if (pos_encoding == "sinusoidal" && n_embd % 2 != 0)
    fail("sinusoidal positions need an even n_embd (" + std::to_string(n_embd) + ")");
  if (norm != "layernorm" && norm != "rmsnorm") fail("norm '" + norm + "' is not one of layernorm | rmsnorm");
  if (attention != "math" && attention != "sdpa" && attention != "auto")
    fail("attention '" + attention + "' is not one of math | sdpa | auto");
}

}  // namespace nanogpt::model
