// LibTorch archive pre-flight check (see archive_check.h). Zip layout: PKWARE APPNOTE 4.3 (end of
// central directory, its zip64 variant, central directory entries, local headers); pickle opcodes:
// CPython's Lib/pickletools.py.
#include "train/archive_check.h"

#include <caffe2/serialize/inline_container.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace nanogpt::train {
namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

uint64_t le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

class File {
 public:
  explicit File(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0) fail(std::string("cannot open: ") + std::strerror(errno));
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  uint64_t size() const { return size_; }
  std::string read(uint64_t offset, uint64_t n) const {
    if (offset > size_ || n > size_ - offset) fail("the zip directory points past the end of the file");
    std::string out(n, '\0');
    for (uint64_t done = 0; done < n;) {
      const ssize_t got = ::pread(fd_, out.data() + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) fail(std::string("read error: ") + std::strerror(errno));
      done += static_cast<uint64_t>(got);
    }
    return out;
  }

 private:
  int fd_;
  uint64_t size_ = 0;
};

struct Record {
  uint64_t size = 0;          // uncompressed
  uint64_t header_offset = 0;  // local file header
};

// name -> record, from the central directory (zip64 aware).
std::map<std::string, Record> read_directory(const File& file) {
  const uint64_t tail_size = std::min<uint64_t>(file.size(), 22 + 65535);
  const std::string tail = file.read(file.size() - tail_size, tail_size);
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data());
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(tail_size) - 22; i >= 0; --i)
    if (le(t + i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  if (eocd < 0) fail("not a zip archive (no end of central directory)");
  uint64_t entries = le(t + eocd + 10, 2), dir_size = le(t + eocd + 12, 4), dir_offset = le(t + eocd + 16, 4);
  if (entries == 0xFFFF || dir_size == 0xFFFFFFFF || dir_offset == 0xFFFFFFFF) {
    if (eocd < 20 || le(t + eocd - 20, 4) != 0x07064b50) fail("zip64 archive without its locator");
    const std::string z = file.read(le(t + eocd - 20 + 8, 8), 56);
    const auto* p = reinterpret_cast<const unsigned char*>(z.data());
    if (le(p, 4) != 0x06064b50) fail("damaged zip64 end of central directory");
    entries = le(p + 32, 8);
    dir_size = le(p + 40, 8);
    dir_offset = le(p + 48, 8);
  }
  const std::string dir = file.read(dir_offset, dir_size);
  const auto* d = reinterpret_cast<const unsigned char*>(dir.data());
  std::map<std::string, Record> records;
  size_t pos = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (dir.size() - pos < 46 || le(d + pos, 4) != 0x02014b50) fail("damaged zip central directory");
    const uint64_t name_len = le(d + pos + 28, 2), extra_len = le(d + pos + 30, 2), comment_len = le(d + pos + 32, 2);
    if (dir.size() - pos - 46 < name_len + extra_len + comment_len) fail("damaged zip central directory");
    Record r{le(d + pos + 24, 4), le(d + pos + 42, 4)};
    const bool big_size = r.size == 0xFFFFFFFF, big_comp = le(d + pos + 20, 4) == 0xFFFFFFFF,
               big_offset = r.header_offset == 0xFFFFFFFF;
    // zip64 extra field: the 8-byte values, in this order, of the fields that hold 0xFFFFFFFF.
    for (size_t x = pos + 46 + name_len; x + 4 <= pos + 46 + name_len + extra_len;) {
      const uint64_t id = le(d + x, 2), len = le(d + x + 2, 2);
      if (x + 4 + len > pos + 46 + name_len + extra_len) fail("damaged zip extra field");
      if (id == 0x0001) {
        size_t f = x + 4;
        auto take = [&](uint64_t& value) {
          if (f + 8 > x + 4 + len) fail("damaged zip64 extra field");
          value = le(d + f, 8);
          f += 8;
        };
        uint64_t ignored = 0;
        if (big_size) take(r.size);
        if (big_comp) take(ignored);
        if (big_offset) take(r.header_offset);
      }
      x += 4 + len;
    }
    records[std::string(dir, pos + 46, name_len)] = r;
    pos += 46 + name_len + extra_len + comment_len;
  }
  return records;
}

std::string read_record(const File& file, const Record& r) {
  const std::string header = file.read(r.header_offset, 30);
  const auto* h = reinterpret_cast<const unsigned char*>(header.data());
  if (le(h, 4) != 0x04034b50) fail("damaged zip local header");
  if (le(h + 8, 2) != 0) fail("compressed zip entry (LibTorch archives are stored uncompressed)");
  return file.read(r.header_offset + 30 + le(h + 26, 2) + le(h + 28, 2), r.size);
}

// Bytes per element of the storage classes LibTorch pickles ("torch FloatStorage"); 0 if unknown.
uint64_t storage_item_size(const std::string& global) {
  static const std::map<std::string, uint64_t> sizes = {
      {"torch FloatStorage", 4},       {"torch DoubleStorage", 8},        {"torch HalfStorage", 2},
      {"torch BFloat16Storage", 2},    {"torch LongStorage", 8},          {"torch IntStorage", 4},
      {"torch ShortStorage", 2},       {"torch CharStorage", 1},          {"torch ByteStorage", 1},
      {"torch BoolStorage", 1},        {"torch ComplexFloatStorage", 8},  {"torch ComplexDoubleStorage", 16},
      {"torch ComplexHalfStorage", 4}, {"torch QInt8Storage", 1},         {"torch QUInt8Storage", 1},
      {"torch QInt32Storage", 4},      {"torch QUInt4x2Storage", 1},      {"torch QUInt2x4Storage", 1}};
  const auto it = sizes.find(global);
  return it == sizes.end() ? 0 : it->second;
}

// What the checker needs to know of a pickled value. Tuples share their items (a memo can
// reference a tuple many times: copies must stay cheap).
struct Value {
  enum class Kind { Other, Mark, Str, Int, Global, Tuple, Storage } kind = Kind::Other;
  std::string text;  // Str, Global ("module name")
  int64_t number = 0;  // Int; Storage: element count
  std::vector<std::shared_ptr<const Value>> items;  // Tuple
};
using Ref = std::shared_ptr<const Value>;

class PickleChecker {
 public:
  PickleChecker(std::string name, std::string bytes, const std::map<std::string, Record>& records,
                std::string storage_dir)
      : name_(std::move(name)), bytes_(std::move(bytes)), records_(records), storage_dir_(std::move(storage_dir)) {}

  void run() {
    while (true) {
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') return;  // STOP
      step(op);
    }
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail("pickle record '" + name_ + "' " + what + " at byte " + std::to_string(pos_));
  }
  // The next n bytes; a length field larger than what is left is exactly the damage looked for.
  std::string take(uint64_t n) {
    if (n > bytes_.size() - pos_)
      bad("declares " + std::to_string(n) + " bytes where " + std::to_string(bytes_.size() - pos_) + " remain");
    std::string out = bytes_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t number(int bytes) { return le(reinterpret_cast<const unsigned char*>(take(bytes).data()), bytes); }
  std::string line() {
    const size_t end = bytes_.find('\n', pos_);
    if (end == std::string::npos) bad("has an unterminated text argument");
    std::string out = bytes_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  void push(Value v) { stack_.push_back(std::make_shared<const Value>(std::move(v))); }
  void push_other() { push(Value{}); }
  Ref pop() {
    if (stack_.empty() || stack_.back()->kind == Value::Kind::Mark) bad("pops an empty stack");
    Ref v = stack_.back();
    stack_.pop_back();
    return v;
  }
  std::vector<Ref> pop_to_mark() {
    for (size_t i = stack_.size(); i-- > 0;)
      if (stack_[i]->kind == Value::Kind::Mark) {
        std::vector<Ref> items(stack_.begin() + static_cast<std::ptrdiff_t>(i) + 1, stack_.end());
        stack_.resize(i);
        return items;
      }
    bad("has no mark to pop to");
  }
  void push_tuple(std::vector<Ref> items) {
    Value v;
    v.kind = Value::Kind::Tuple;
    v.items = std::move(items);
    push(std::move(v));
  }
  void memo_put(uint64_t index) {
    if (stack_.empty()) bad("memoizes from an empty stack");
    memo_[index] = stack_.back();
  }
  void memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) bad("reads memo entry " + std::to_string(index) + ", which was never written");
    stack_.push_back(it->second);
  }

  // ("storage", torch.<T>Storage, key, device, numel): the record must hold numel elements.
  void persistent_id(const Ref& id) {
    const auto& it = id->items;
    if (id->kind != Value::Kind::Tuple || it.size() < 5 || it[0]->kind != Value::Kind::Str || it[0]->text != "storage" ||
        it[1]->kind != Value::Kind::Global || it[2]->kind != Value::Kind::Str || it[4]->kind != Value::Kind::Int)
      bad("has a persistent id that is not a (\"storage\", type, key, device, numel) tuple");
    const uint64_t item = storage_item_size(it[1]->text);
    if (item == 0) bad("has a storage of unknown type '" + it[1]->text + "'");
    const int64_t numel = it[4]->number;
    if (numel < 0) bad("has a storage of " + std::to_string(numel) + " elements");
    if (numel > 0) {
      const auto rec = records_.find(storage_dir_ + it[2]->text);
      if (rec == records_.end()) bad("refers to a missing tensor record '" + storage_dir_ + it[2]->text + "'");
      if (static_cast<uint64_t>(numel) > rec->second.size / item)
        bad("has a storage of " + std::to_string(numel) + " elements of " + std::to_string(item) +
            " bytes over a record of " + std::to_string(rec->second.size) + " bytes");
    }
    Value storage;
    storage.kind = Value::Kind::Storage;
    storage.number = numel;
    push(std::move(storage));
  }

  // torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...): the view must fit.
  void reduce() {
    const Ref args = pop(), callable = pop();
    if (callable->kind == Value::Kind::Global && callable->text.rfind("torch._utils _rebuild_", 0) == 0) {
      if (callable->text != "torch._utils _rebuild_tensor_v2") bad("has an unsupported tensor kind '" + callable->text + "'");
      const auto& a = args->items;
      auto ints = [&](const Ref& t, std::vector<int64_t>& out) {
        if (t->kind != Value::Kind::Tuple) return false;
        for (const auto& v : t->items) {
          if (v->kind != Value::Kind::Int) return false;
          out.push_back(v->number);
        }
        return true;
      };
      std::vector<int64_t> sizes, strides;
      if (args->kind != Value::Kind::Tuple || a.size() < 4 || a[0]->kind != Value::Kind::Storage ||
          a[1]->kind != Value::Kind::Int || !ints(a[2], sizes) || !ints(a[3], strides) || sizes.size() != strides.size())
        bad("has a malformed tensor (storage, offset, sizes, strides)");
      const int64_t offset = a[1]->number;
      __int128 extent = offset;  // index of the last element + 1
      bool empty = false;
      for (size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i] < 0 || strides[i] < 0) bad("has a tensor with a negative size or stride");
        if (sizes[i] == 0) empty = true;
        extent += static_cast<__int128>(sizes[i] > 0 ? sizes[i] - 1 : 0) * strides[i];
      }
      if (offset < 0 || (!empty && extent + 1 > a[0]->number))
        bad("has a tensor that reaches past its storage of " + std::to_string(a[0]->number) + " elements");
    }
    push_other();
  }

  void step(unsigned char op) {
    switch (op) {
      case 0x80: take(1); break;                       // PROTO
      case 0x95: number(8); break;                     // FRAME (its length is only a hint)
      case '(': push(Value{Value::Kind::Mark, {}, 0, {}}); break;  // MARK
      case '0': pop(); break;                          // POP
      case '1': pop_to_mark(); break;                  // POP_MARK
      case '2': {                                      // DUP
        const Ref top = pop();
        stack_.push_back(top);
        stack_.push_back(top);
        break;
      }
      case 'N': case 0x88: case 0x89: case '}': case ']': case 0x8f: push_other(); break;  // None, bools, empties
      case ')': push_tuple({}); break;                 // EMPTY_TUPLE
      case 'K': push(Value{Value::Kind::Int, {}, static_cast<int64_t>(number(1)), {}}); break;  // BININT1
      case 'M': push(Value{Value::Kind::Int, {}, static_cast<int64_t>(number(2)), {}}); break;  // BININT2
      case 'J': push(Value{Value::Kind::Int, {}, static_cast<int32_t>(number(4)), {}}); break;  // BININT
      case 0x8a: {                                     // LONG1: little-endian two's complement
        const uint64_t n = number(1);
        const std::string b = take(n);
        if (n == 0 || n > 8) {
          push_other();
          break;
        }
        uint64_t v = le(reinterpret_cast<const unsigned char*>(b.data()), static_cast<int>(n));
        if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        push(Value{Value::Kind::Int, {}, static_cast<int64_t>(v), {}});
        break;
      }
      case 0x8b: take(number(4)), push_other(); break;  // LONG4
      case 'G': take(8), push_other(); break;          // BINFLOAT
      case 'X': push(Value{Value::Kind::Str, take(number(4)), 0, {}}); break;     // BINUNICODE
      case 0x8c: push(Value{Value::Kind::Str, take(number(1)), 0, {}}); break;    // SHORT_BINUNICODE
      case 0x8d: push(Value{Value::Kind::Str, take(number(8)), 0, {}}); break;    // BINUNICODE8
      case 'T': case 'B': take(number(4)), push_other(); break;                   // BINSTRING, BINBYTES
      case 'U': case 'C': take(number(1)), push_other(); break;                   // SHORT_BINSTRING/BYTES
      case 0x8e: case 0x96: take(number(8)), push_other(); break;                 // BINBYTES8, BYTEARRAY8
      case 'c': {                                      // GLOBAL module\nname\n
        std::string module = line();
        push(Value{Value::Kind::Global, module + " " + line(), 0, {}});
        break;
      }
      case 0x93: {                                     // STACK_GLOBAL
        const Ref name = pop(), module = pop();
        push(Value{Value::Kind::Global, module->text + " " + name->text, 0, {}});
        break;
      }
      case 'q': memo_put(number(1)); break;            // BINPUT
      case 'r': memo_put(number(4)); break;            // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); break;        // MEMOIZE
      case 'h': memo_get(number(1)); break;            // BINGET
      case 'j': memo_get(number(4)); break;            // LONG_BINGET
      case 't': push_tuple(pop_to_mark()); break;      // TUPLE
      case 0x85: case 0x86: case 0x87: {               // TUPLE1..3
        std::vector<Ref> items(static_cast<size_t>(op - 0x84));
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push_tuple(std::move(items));
        break;
      }
      case 'l': case 'd': pop_to_mark(), push_other(); break;  // LIST, DICT
      case 'a': pop(); break;                          // APPEND
      case 'e': case 'u': case 0x90: pop_to_mark(); break;  // APPENDS, SETITEMS, ADDITEMS
      case 's': pop(), pop(); break;                   // SETITEM
      case 'b': pop(); break;                          // BUILD
      case 'R': reduce(); break;                       // REDUCE
      case 0x81: pop(), pop(), push_other(); break;    // NEWOBJ
      case 0x92: pop(), pop(), pop(), push_other(); break;  // NEWOBJ_EX
      case 0x91: pop_to_mark(), push_other(); break;   // FROZENSET
      case 'Q': persistent_id(pop()); break;           // BINPERSID
      default: bad("has opcode 0x" + hex(op) + ", which LibTorch archives do not use");
    }
  }
  static std::string hex(unsigned char c) {
    const char* digits = "0123456789ABCDEF";
    return {digits[c >> 4], digits[c & 15]};
  }

  const std::string name_;
  const std::string bytes_;
  const std::map<std::string, Record>& records_;
  const std::string storage_dir_;
  size_t pos_ = 0;
  std::vector<Ref> stack_;
  std::map<uint64_t, Ref> memo_;
};

// The TorchScript source LibTorch writes for a plain module of attributes (code/*.py): class
// headers, the parameter and buffer lists and type annotations, nothing else. LibTorch 1.13's
// TorchScript parser crashes (SIGSEGV) on some damaged sources, so only these forms get through.
void check_script_source(const std::string& name, const std::string& text) {
  static const std::string type = R"([A-Za-z_][A-Za-z0-9_.]*(\[[A-Za-z0-9_., \[\]]*\])?)";
  static const std::regex forms[] = {
      std::regex(R"(class [A-Za-z_][A-Za-z0-9_]*\([A-Za-z_][A-Za-z0-9_.]*\):)"),
      std::regex(R"(  (__parameters__|__buffers__|__annotations__) = \[("[^"\\]*", )*\])"),
      std::regex(R"(  [A-Za-z_][A-Za-z0-9_]* : )" + type),
      std::regex(R"(  __annotations__\["[^"\\]*"\] = )" + type),
  };
  size_t line_no = 0;
  for (size_t start = 0; start < text.size(); ++line_no) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    const bool printable = std::all_of(line.begin(), line.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
    if (!printable || std::none_of(std::begin(forms), std::end(forms),
                                   [&](const std::regex& form) { return std::regex_match(line, form); }))
      fail("zip record '" + name + "' line " + std::to_string(line_no + 1) +
           " is not the module source LibTorch writes (damaged)");
  }
}

}  // namespace

void check_torch_archive(const std::string& path) {
  const File file(path);
  const auto records = read_directory(file);
  if (records.empty()) fail("the zip archive is empty");
  // LibTorch takes the archive's folder from its first record and looks everything up inside it.
  for (const auto& [name, record] : records) {
    if (record.size > file.size()) fail("zip record '" + name + "' claims " + std::to_string(record.size) + " bytes");
    const size_t slash = name.find('/');
    if (slash == std::string::npos) continue;
    const std::string folder = name.substr(0, slash + 1), rest = name.substr(slash + 1);
    if (!ends_with(rest, ".pkl") && !ends_with(rest, ".debug_pkl")) continue;
    // data.pkl's tensors live in <folder>data/, constants.pkl's in <folder>constants/.
    const std::string storage_dir = folder + rest.substr(0, rest.rfind('.')) + "/";
    PickleChecker(name, read_record(file, record), records, storage_dir).run();
  }
  // The class sources are deflated (unlike the pickles and tensors): read them through LibTorch's
  // own zip reader, which the checks above make safe to open, and check the text.
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    for (const std::string& name : reader.getAllRecords()) {
      if (name.compare(0, 5, "code/") != 0 || !ends_with(name, ".py")) continue;
      auto [data, size] = reader.getRecord(name);
      check_script_source(name, std::string(static_cast<const char*>(data.get()), size));
    }
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    fail("damaged zip record (" + what.substr(0, what.find('\n')) + ")");
  }
}

}  // namespace nanogpt::train
