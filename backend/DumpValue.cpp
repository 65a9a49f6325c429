#include "DumpValue.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

namespace frnccl {

const char* DumpValue::intern(const std::string& key) {
  // Leaked: interned keys live as long as the process (a handful per group).
  static std::mutex mutex;
  static auto* keys = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mutex);
  return keys->insert(key).first->c_str();
}

DumpValue& DumpValue::set(const char* key, DumpValue v) {
  std::get<Dict>(value_).emplace_back(key, std::move(v));
  return *this;
}

DumpValue& DumpValue::push(DumpValue v) {
  std::get<List>(value_).push_back(std::move(v));
  return *this;
}

const DumpValue* DumpValue::find(const std::string& key) const {
  const Dict* d = std::get_if<Dict>(&value_);
  if (d == nullptr) {
    return nullptr;
  }
  for (const auto& kv : *d) {
    if (key == kv.first) {
      return &kv.second;
    }
  }
  return nullptr;
}

int64_t DumpValue::asInt() const {
  if (auto* b = std::get_if<bool>(&value_)) {
    return *b ? 1 : 0;
  }
  return std::get<int64_t>(value_);
}

double DumpValue::asDouble() const {
  if (auto* i = std::get_if<int64_t>(&value_)) {
    return double(*i);
  }
  return std::get<double>(value_);
}

const std::string& DumpValue::asString() const {
  return std::get<std::string>(value_);
}

const DumpValue::List& DumpValue::asList() const {
  if (auto* t = std::get_if<Tuple>(&value_)) {
    return t->items;
  }
  return std::get<List>(value_);
}

const DumpValue::Dict& DumpValue::asDict() const {
  return std::get<Dict>(value_);
}

namespace {

bool sameItems(const std::vector<DumpValue>& a, const std::vector<DumpValue>& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].equals(b[i])) {
      return false;
    }
  }
  return true;
}

size_t hashItems(const std::vector<DumpValue>& items, size_t seed) {
  size_t h = seed;
  for (const auto& item : items) {
    h = h * 1000003u ^ item.hash();
  }
  return h;
}

} // namespace

// By alternative index, not a visit of both sides: the compact encoder compares
// hundreds of thousands of small values per dump.
bool DumpValue::equals(const DumpValue& other) const {
  if (this == &other) {
    return true;
  }
  if (value_.index() != other.value_.index()) {
    return false;
  }
  if (const auto* d = std::get_if<Dict>(&value_)) {
    const Dict& o = std::get<Dict>(other.value_);
    if (d->size() != o.size()) {
      return false;
    }
    for (size_t i = 0; i < d->size(); ++i) {
      const char* a = (*d)[i].first;
      const char* b = o[i].first;
      if ((a != b && std::strcmp(a, b) != 0) || !(*d)[i].second.equals(o[i].second)) {
        return false;
      }
    }
    return true;
  }
  if (const auto* l = std::get_if<List>(&value_)) {
    return sameItems(*l, std::get<List>(other.value_));
  }
  if (const auto* t = std::get_if<Tuple>(&value_)) {
    return sameItems(t->items, std::get<Tuple>(other.value_).items);
  }
  if (const auto* s = std::get_if<std::string>(&value_)) {
    return *s == std::get<std::string>(other.value_);
  }
  if (const auto* i = std::get_if<int64_t>(&value_)) {
    return *i == std::get<int64_t>(other.value_);
  }
  if (const auto* b = std::get_if<bool>(&value_)) {
    return *b == std::get<bool>(other.value_);
  }
  if (const auto* x = std::get_if<double>(&value_)) {
    return *x == std::get<double>(other.value_);
  }
  return true; // both None
}

size_t DumpValue::hash() const {
  if (const auto* d = std::get_if<Dict>(&value_)) {
    size_t h = 0x13;
    for (const auto& kv : *d) {
      h = (h * 1000003u ^ std::hash<std::string_view>()(kv.first)) * 1000003u ^ kv.second.hash();
    }
    return h;
  }
  if (const auto* l = std::get_if<List>(&value_)) {
    return hashItems(*l, 0x11);
  }
  if (const auto* t = std::get_if<Tuple>(&value_)) {
    return hashItems(t->items, 0x12);
  }
  if (const auto* s = std::get_if<std::string>(&value_)) {
    return std::hash<std::string_view>()(*s);
  }
  if (const auto* i = std::get_if<int64_t>(&value_)) {
    return std::hash<int64_t>()(*i);
  }
  if (const auto* b = std::get_if<bool>(&value_)) {
    return *b ? 0x51 : 0x50;
  }
  if (const auto* x = std::get_if<double>(&value_)) {
    return std::hash<double>()(*x) ^ 0x3d;
  }
  return 0x9e37;
}

namespace {

// Replaces bytes that are not valid UTF-8, so pickle.loads and JSON parsers
// never reject a dump over a thread or file name.
bool isAscii(const char* s, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<unsigned char>(s[i]) >= 0x80) {
      return false;
    }
  }
  return true;
}

// Well-formed UTF-8 as RFC 3629 defines it (Unicode's table 3-7): no overlong
// forms (C0, C1, E0 80-9F, F0 80-8F), no surrogates (ED A0-BF), nothing past
// U+10FFFF (F4 90-BF, F5-FF). Python's decoder refuses each of those, and one
// such byte in a thread or file name would make the whole file unreadable.
std::string validUtf8(const char* s, size_t n) {
  std::string out;
  out.reserve(n);
  size_t i = 0;
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    if (ok && len > 1) {
      // The second byte's range depends on the first; the others are any continuation byte.
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
      const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
      ok = c1 >= lo && c1 <= hi;
    }
    for (size_t k = 2; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    }
    if (ok) {
      out.append(s + i, len);
      i += len;
    } else {
      out.push_back('?');
      i += 1;
    }
  }
  return out;
}

// A growable byte buffer whose appends inline: a 20,000-entry dump is tens of
// millions of small appends, and std::string::push_back is an out-of-line
// call. realloc grows large buffers by remapping pages, never by zero-filling
// and copying them.
class OutBuffer {
 public:
#define FRNCCL_INLINE inline __attribute__((always_inline))
  explicit OutBuffer(size_t initial) : cap_(std::max<size_t>(initial, 64)) {
    data_.reset(static_cast<char*>(std::malloc(cap_)));
    if (!data_) {
      throw std::bad_alloc();
    }
  }

  FRNCCL_INLINE void put(char c) {
    if (len_ == cap_) {
      grow(1);
    }
    data_.get()[len_++] = c;
  }
  FRNCCL_INLINE void append(const char* s, size_t n) {
    if (cap_ - len_ < n) {
      grow(n);
    }
    std::memcpy(data_.get() + len_, s, n);
    len_ += n;
  }
  void append(const char* s) {
    append(s, std::strlen(s));
  }
  FRNCCL_INLINE void putLE32(uint32_t v) {
    const char bytes[4] = {
        char(v & 0xFF), char((v >> 8) & 0xFF), char((v >> 16) & 0xFF), char((v >> 24) & 0xFF)};
    append(bytes, 4);
  }
#undef FRNCCL_INLINE
  std::string take() && {
    return std::string(data_.get(), len_);
  }

 private:
  struct Free {
    void operator()(char* p) const {
      std::free(p);
    }
  };
  __attribute__((noinline)) void grow(size_t n) {
    const size_t cap = std::max(cap_ * 2, len_ + n);
    char* grown = static_cast<char*>(std::realloc(data_.get(), cap));
    if (grown == nullptr) {
      throw std::bad_alloc();
    }
    data_.release();
    data_.reset(grown);
    cap_ = cap;
  }
  std::unique_ptr<char, Free> data_;
  size_t cap_;
  size_t len_ = 0;
};

class PickleEncoder {
 public:
  explicit PickleEncoder(OutBuffer& out) : out_(out) {}

  void encode(const DumpValue& value) {
    value.visit([this](const auto& v) { encodeAlternative(v); });
  }
  // The dict `v`'s keys with *values[i] as the i-th value (values point into trees that outlive the encoder).
  void encodeDict(const DumpValue::Dict& v, const std::vector<const DumpValue*>& values) {
    out_.put('}');
    if (!v.empty()) {
      out_.put('(');
      for (size_t i = 0; i < v.size(); ++i) {
        string(v[i].first, std::strlen(v[i].first));
        encode(*values[i]);
      }
      out_.put('u');
    }
  }

  void string(const char* s, size_t n) {
    auto memo = memo_.find(std::string_view(s, n));
    if (memo != memo_.end()) {
      get(memo->second);
      return;
    }
    if (isAscii(s, n)) {
      rawString(s, n);
    } else {
      const std::string clean = validUtf8(s, n);
      rawString(clean.data(), clean.size());
    }
    // The view points into the tree being encoded, which outlives the encoder.
    const uint32_t index = uint32_t(memo_.size());
    memo_.emplace(std::string_view(s, n), index);
    put(index);
  }

 private:
  void rawString(const char* s, size_t n) {
    out_.put('X'); // BINUNICODE
    out_.putLE32(uint32_t(n));
    out_.append(s, n);
  }
  void put(uint32_t index) {
    if (index < 256) {
      out_.put('q'); // BINPUT
      out_.put(char(index));
    } else {
      out_.put('r'); // LONG_BINPUT
      out_.putLE32(index);
    }
  }
  void get(uint32_t index) {
    if (index < 256) {
      out_.put('h'); // BINGET
      out_.put(char(index));
    } else {
      out_.put('j'); // LONG_BINGET
      out_.putLE32(index);
    }
  }

  void encodeAlternative(std::monostate) {
    out_.put('N');
  }
  void encodeAlternative(bool v) {
    out_.put(v ? '\x88' : '\x89');
  }
  void encodeAlternative(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_.put('J'); // BININT
      out_.putLE32(uint32_t(int32_t(v)));
      return;
    }
    char bytes[10] = {'\x8a', '\x08'}; // LONG1: little-endian two's complement
    for (int i = 0; i < 8; ++i) {
      bytes[2 + i] = char((uint64_t(v) >> (8 * i)) & 0xFF);
    }
    out_.append(bytes, sizeof(bytes));
  }
  void encodeAlternative(double v) {
    char bytes[9] = {'G'}; // BINFLOAT, big-endian
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(bits));
    for (int i = 0; i < 8; ++i) {
      bytes[1 + i] = char((bits >> (8 * (7 - i))) & 0xFF);
    }
    out_.append(bytes, sizeof(bytes));
  }
  void encodeAlternative(const std::string& v) {
    string(v.data(), v.size());
  }
  void encodeAlternative(const DumpValue::List& v) {
    out_.put(']'); // EMPTY_LIST
    if (!v.empty()) {
      out_.put('('); // MARK
      for (const auto& item : v) {
        encode(item);
      }
      out_.put('e'); // APPENDS
    }
  }
  void encodeAlternative(const DumpValue::Tuple& v) {
    out_.put('(');
    for (const auto& item : v.items) {
      encode(item);
    }
    out_.put('t'); // TUPLE
  }
  void encodeAlternative(const DumpValue::Dict& v) {
    out_.put('}'); // EMPTY_DICT
    if (!v.empty()) {
      out_.put('(');
      for (const auto& kv : v) {
        string(kv.first, std::strlen(kv.first));
        encode(kv.second);
      }
      out_.put('u'); // SETITEMS
    }
  }

  OutBuffer& out_;
  std::unordered_map<std::string_view, uint32_t> memo_;
};

// Out: OutBuffer for a whole file, StringOut for one value of a larger text.
template <class Out>
class JsonEncoder {
 public:
  explicit JsonEncoder(Out& out) : out_(out) {}

  void encode(const DumpValue& value) {
    value.visit([this](const auto& v) { encodeAlternative(v); });
  }
  void encodeString(const char* s, size_t n) {
    string(s, n);
  }

 private:
  static bool needsEscape(unsigned char c) {
    return c < 0x20 || c == '"' || c == '\\';
  }

  void string(const char* raw, size_t n) {
    std::string cleaned;
    if (!isAscii(raw, n)) {
      cleaned = validUtf8(raw, n);
      raw = cleaned.data();
      n = cleaned.size();
    }
    out_.put('"');
    size_t run = 0; // start of the pending run of bytes that need no escape
    for (size_t i = 0; i < n; ++i) {
      const unsigned char c = static_cast<unsigned char>(raw[i]);
      if (!needsEscape(c)) {
        continue;
      }
      out_.append(raw + run, i - run);
      run = i + 1;
      switch (c) {
        case '"':
          out_.append("\\\"", 2);
          break;
        case '\\':
          out_.append("\\\\", 2);
          break;
        case '\n':
          out_.append("\\n", 2);
          break;
        case '\r':
          out_.append("\\r", 2);
          break;
        case '\t':
          out_.append("\\t", 2);
          break;
        default: {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out_.append(buf, 6);
        }
      }
    }
    out_.append(raw + run, n - run);
    out_.put('"');
  }

  void encodeAlternative(std::monostate) {
    out_.append("null", 4);
  }
  void encodeAlternative(bool v) {
    v ? out_.append("true", 4) : out_.append("false", 5);
  }
  void encodeAlternative(int64_t v) {
    char buf[24];
    const auto result = std::to_chars(buf, buf + sizeof(buf), v);
    out_.append(buf, size_t(result.ptr - buf));
  }
  void encodeAlternative(double v) {
    if (!std::isfinite(v)) {
      out_.append("null", 4);
      return;
    }
    char buf[32];
    const int n = std::snprintf(buf, sizeof(buf), "%.17g", v);
    out_.append(buf, size_t(n));
    if (std::strpbrk(buf, ".eEn") == nullptr) {
      out_.append(".0", 2);
    }
  }
  void encodeAlternative(const std::string& v) {
    string(v.data(), v.size());
  }
  void encodeItems(const std::vector<DumpValue>& items) {
    out_.put('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i != 0) {
        out_.put(',');
      }
      encode(items[i]);
    }
    out_.put(']');
  }
  void encodeAlternative(const DumpValue::List& v) {
    encodeItems(v);
  }
  void encodeAlternative(const DumpValue::Tuple& v) {
    encodeItems(v.items);
  }
  void encodeAlternative(const DumpValue::Dict& v) {
    out_.put('{');
    for (size_t i = 0; i < v.size(); ++i) {
      if (i != 0) {
        out_.put(',');
      }
      string(v[i].first, std::strlen(v[i].first));
      out_.put(':');
      encode(v[i].second);
    }
    out_.put('}');
  }

  Out& out_;
};

// Appends to a std::string: JSON of single values inside a text built elsewhere.
class StringOut {
 public:
  explicit StringOut(std::string& s) : s_(s) {}
  void put(char c) {
    s_.push_back(c);
  }
  void append(const char* p, size_t n) {
    s_.append(p, n);
  }
  void append(const char* p) {
    s_.append(p);
  }

 private:
  std::string& s_;
};

} // namespace

std::string DumpValue::toPickle(const char* top_key, const DumpValue* top_value) const {
  OutBuffer out(1 << 20);
  out.append("\x80\x02", 2); // PROTO 2
  PickleEncoder encoder(out);
  if (top_key != nullptr && top_value != nullptr && std::holds_alternative<Dict>(value_)) {
    const Dict& items = std::get<Dict>(value_);
    std::vector<const DumpValue*> values; // borrowed: only `top_key`'s item is another
    values.reserve(items.size());
    for (const auto& kv : items) {
      values.push_back(std::strcmp(kv.first, top_key) == 0 ? top_value : &kv.second);
    }
    encoder.encodeDict(items, values);
  } else {
    encoder.encode(*this);
  }
  out.put('.'); // STOP
  return std::move(out).take();
}

std::string DumpValue::toJson() const {
  OutBuffer out(1 << 20);
  JsonEncoder<OutBuffer>(out).encode(*this);
  out.put('\n');
  return std::move(out).take();
}

void DumpValue::appendJson(std::string& out) const {
  StringOut sink(out);
  JsonEncoder<StringOut>(sink).encode(*this);
}

void DumpValue::appendJsonString(std::string& out, const char* s, size_t n) {
  StringOut sink(out);
  JsonEncoder<StringOut>(sink).encodeString(s, n);
}

} // namespace frnccl
