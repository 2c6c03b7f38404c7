// Fuzz target (b): the YAML config parser and nanoGPT-style overrides.
//
// Input layout: YAML text, then optionally a NUL byte followed by override arguments separated
// by NUL or newline (e.g. "max_iters: 5\n\0--max_iters=7\0--device=cpu").
// Properties, beyond "no crash, no UB, no uncaught exception":
//  - parse_config throws a one-line "[config] ..." std::invalid_argument or returns a config with
//    parse_config(to_yaml(c)) == c (compared through to_yaml, which prints every key);
//  - validate() throws "[config] ..." or returns;
//  - apply_overrides is all or nothing: on error the config is unchanged.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "train/config.h"

using namespace nanogpt;
using nanogpt::fuzz::expect_clear_error;
using nanogpt::fuzz::finding;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const size_t nul = bytes.find('\0');
  const std::string yaml(bytes.substr(0, nul));
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = bytes.substr(nul + 1);
    while (!rest.empty()) {
      const size_t end = rest.find_first_of(std::string_view("\0\n", 2));
      overrides.emplace_back(rest.substr(0, end));
      if (end == std::string_view::npos) break;
      rest = rest.substr(end + 1);
    }
  }

  train::TrainConfig config;
  try {
    config = train::parse_config(yaml, "fuzz.yaml");
  } catch (const std::invalid_argument& e) {
    expect_clear_error(e, "[config] fuzz.yaml: ");
    return 0;
  }
  const std::string yaml_out = train::to_yaml(config);
  train::TrainConfig again;
  try {
    again = train::parse_config(yaml_out, "to_yaml");
  } catch (const std::exception& e) {
    finding(std::string("to_yaml output does not parse: ") + e.what() + "\n" + yaml_out);
  }
  if (train::to_yaml(again) != yaml_out) finding("parse_config(to_yaml(c)) != c:\n" + yaml_out + "\nvs\n" + train::to_yaml(again));

  try {
    config.validate();
  } catch (const std::invalid_argument& e) {
    expect_clear_error(e, "[config] ");
  }

  train::TrainConfig overridden = config;
  try {
    train::apply_overrides(overridden, overrides);
  } catch (const std::invalid_argument& e) {
    expect_clear_error(e, "[config] --override '");
    if (train::to_yaml(overridden) != yaml_out) finding("a failed apply_overrides changed the config");
    return 0;
  }
  // Overrides succeeded: the result must survive its own round trip too.
  const std::string overridden_yaml = train::to_yaml(overridden);
  if (train::to_yaml(train::parse_config(overridden_yaml, "to_yaml")) != overridden_yaml)
    finding("parse_config(to_yaml(c)) != c after overrides:\n" + overridden_yaml);
  try {
    overridden.validate();
  } catch (const std::invalid_argument& e) {
    expect_clear_error(e, "[config] ");
  }
  return 0;
}
