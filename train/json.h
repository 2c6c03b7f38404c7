// A small JSON reader and writer, enough for safetensors headers and the metadata strings inside
// them: objects (in file order), arrays, strings (all escapes, \uXXXX with surrogate pairs),
// numbers (exact 64-bit integers or doubles), true/false/null. Text is UTF-8 in and out.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nanogpt::train::json {

struct Value {
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0.0;         // every number
  bool is_integer = false;     // written without fraction or exponent and fits int64
  int64_t integer = 0;         // exact value when is_integer
  std::string string;          // UTF-8
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;  // members in file order, keys distinct

  /// The member named `key`, or nullptr (also when this is not an object).
  const Value* find(std::string_view key) const;
};

/// Parses one JSON document (surrounding whitespace allowed). Rejects invalid UTF-8, lone
/// surrogates, duplicate object keys, nesting deeper than 64 and trailing content.
/// Throws std::runtime_error "[json] <what> at byte N".
Value parse(std::string_view text);

/// `s` as a JSON string literal: quotes, backslashes and control characters escaped; other UTF-8
/// bytes pass through unchanged.
std::string quote(std::string_view s);

/// A finite double as the shortest JSON number that reads back to the same value ("0.1", "10000").
/// Throws std::runtime_error "[json] ..." for NaN or infinity, which JSON cannot hold.
std::string number(double value);

/// Compact JSON text of `value` (objects keep member order).
std::string dump(const Value& value);

/// Human-readable name of a kind for error messages: "object", "string", ...
const char* kind_name(Value::Kind kind);

}  // namespace nanogpt::train::json
