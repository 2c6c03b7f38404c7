// JSON reader (recursive descent over a string_view) and writer helpers. See json.h.
#include "train/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <system_error>

#include "data/utf8.h"

namespace nanogpt::train::json {
namespace {

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value document() {
    skip_whitespace();
    Value value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("unexpected content after the document");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("[json] " + what + " at byte " + std::to_string(pos_));
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  void expect(char c) {
    if (peek() != c || at_end()) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (at_end()) fail("unexpected end of text");
    Value value;
    switch (peek()) {
      case '{': parse_object(value, depth); break;
      case '[': parse_array(value, depth); break;
      case '"':
        value.kind = Value::Kind::String;
        value.string = parse_string();
        break;
      case 't':
        literal("true");
        value.kind = Value::Kind::Bool;
        value.boolean = true;
        break;
      case 'f':
        literal("false");
        value.kind = Value::Kind::Bool;
        break;
      case 'n': literal("null"); break;
      default: parse_number(value);
    }
    return value;
  }

  void literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail("invalid literal");
    pos_ += word.size();
  }

  void parse_object(Value& value, int depth) {
    value.kind = Value::Kind::Object;
    expect('{');
    skip_whitespace();
    if (peek() == '}' && !at_end()) {
      ++pos_;
      return;
    }
    while (true) {
      skip_whitespace();
      if (peek() != '"') fail("expected a string key");
      size_t key_pos = pos_;
      std::string key = parse_string();
      if (value.find(key) != nullptr) {
        pos_ = key_pos;
        fail("duplicate key " + quote(key));
      }
      skip_whitespace();
      expect(':');
      skip_whitespace();
      value.object.emplace_back(std::move(key), parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',' && !at_end()) {
        ++pos_;
        continue;
      }
      expect('}');
      return;
    }
  }

  void parse_array(Value& value, int depth) {
    value.kind = Value::Kind::Array;
    expect('[');
    skip_whitespace();
    if (peek() == ']' && !at_end()) {
      ++pos_;
      return;
    }
    while (true) {
      skip_whitespace();
      value.array.push_back(parse_value(depth + 1));
      skip_whitespace();
      if (peek() == ',' && !at_end()) {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      code <<= 4;
      if (c >= '0' && c <= '9') code |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') code |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') code |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("invalid hex digit in \\u escape");
    }
    return code;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (at_end()) fail("unterminated string");
      char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character in string");
      if (c != '\\') {
        out.push_back(c);  // UTF-8 was validated for the whole text up front
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") fail("high surrogate not followed by a low surrogate");
            pos_ += 2;
            uint32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          data::append_utf8(out, static_cast<char32_t>(cp));
          break;
        }
        default:
          --pos_;
          fail(std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  void parse_number(Value& value) {
    size_t start = pos_;
    bool integral = true;
    if (peek() == '-') ++pos_;
    if (peek() == '0' && !at_end()) {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9' && !at_end()) ++pos_;
    } else {
      fail("unexpected character");
    }
    if (peek() == '.' && !at_end()) {
      integral = false;
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit after '.'");
      while (peek() >= '0' && peek() <= '9' && !at_end()) ++pos_;
    }
    if ((peek() == 'e' || peek() == 'E') && !at_end()) {
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("expected a digit in the exponent");
      while (peek() >= '0' && peek() <= '9' && !at_end()) ++pos_;
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    value.kind = Value::Kind::Number;
    // from_chars, unlike strtod, ignores the locale; the grammar above is a subset of its syntax.
    auto [end, ec] = std::from_chars(first, last, value.number);
    if (ec != std::errc() || end != last) fail("number out of range");
    if (integral) {
      auto [int_end, int_ec] = std::from_chars(first, last, value.integer);
      value.is_integer = int_ec == std::errc() && int_end == last;
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

void dump_to(std::string& out, const Value& value) {
  switch (value.kind) {
    case Value::Kind::Null: out += "null"; break;
    case Value::Kind::Bool: out += value.boolean ? "true" : "false"; break;
    case Value::Kind::Number: out += value.is_integer ? std::to_string(value.integer) : number(value.number); break;
    case Value::Kind::String: out += quote(value.string); break;
    case Value::Kind::Array:
      out += '[';
      for (size_t i = 0; i < value.array.size(); ++i) {
        if (i) out += ',';
        dump_to(out, value.array[i]);
      }
      out += ']';
      break;
    case Value::Kind::Object:
      out += '{';
      for (size_t i = 0; i < value.object.size(); ++i) {
        if (i) out += ',';
        out += quote(value.object[i].first);
        out += ':';
        dump_to(out, value.object[i].second);
      }
      out += '}';
      break;
  }
}

}  // namespace

const Value* Value::find(std::string_view key) const {
  for (const auto& [name, member] : object)
    if (name == key) return &member;
  return nullptr;
}

Value parse(std::string_view text) {
  try {
    data::decode_utf8(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("[json] text is not valid UTF-8 (") + e.what() + ")");
  }
  return Parser(text).document();
}

std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string number(double value) {
  if (!std::isfinite(value)) throw std::runtime_error("[json] cannot write a non-finite number (NaN or infinity)");
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);  // shortest round-trip form
  if (ec != std::errc()) throw std::runtime_error("[json] cannot format a number");
  return std::string(buf, end);
}

std::string dump(const Value& value) {
  std::string out;
  dump_to(out, value);
  return out;
}

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return "boolean";
    case Value::Kind::Number: return "number";
    case Value::Kind::String: return "string";
    case Value::Kind::Array: return "array";
    case Value::Kind::Object: return "object";
  }
  return "?";
}

}  // namespace nanogpt::train::json
