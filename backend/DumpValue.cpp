#include "DumpValue.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>

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

std::string validUtf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out.push_back('?');
      i += 1;
    }
  }
  return out;
}

void putLE32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
}

void pickleString(std::string& out, const char* s, size_t n) {
  if (isAscii(s, n)) {
    out.push_back('X'); // BINUNICODE
    putLE32(out, static_cast<uint32_t>(n));
    out.append(s, n);
    return;
  }
  const std::string clean = validUtf8(std::string(s, n));
  out.push_back('X');
  putLE32(out, static_cast<uint32_t>(clean.size()));
  out += clean;
}

} // namespace

std::string DumpValue::toPickle() const {
  std::string out;
  out.reserve(1 << 20);
  out += "\x80\x02"; // PROTO 2
  writePickle(out);
  out.push_back('.'); // STOP
  return out;
}

void DumpValue::writePickle(std::string& out) const {
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          out.push_back('N');
        } else if constexpr (std::is_same_v<T, bool>) {
          out.push_back(v ? '\x88' : '\x89');
        } else if constexpr (std::is_same_v<T, int64_t>) {
          if (v >= INT32_MIN && v <= INT32_MAX) {
            out.push_back('J'); // BININT
            putLE32(out, static_cast<uint32_t>(static_cast<int32_t>(v)));
          } else {
            out.push_back('\x8a'); // LONG1: little-endian two's complement
            out.push_back('\x08');
            for (int i = 0; i < 8; ++i) {
              out.push_back(static_cast<char>((uint64_t(v) >> (8 * i)) & 0xFF));
            }
          }
        } else if constexpr (std::is_same_v<T, double>) {
          out.push_back('G'); // BINFLOAT, big-endian
          uint64_t bits = 0;
          std::memcpy(&bits, &v, sizeof(bits));
          for (int i = 7; i >= 0; --i) {
            out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
          }
        } else if constexpr (std::is_same_v<T, std::string>) {
          pickleString(out, v.data(), v.size());
        } else if constexpr (std::is_same_v<T, List>) {
          out.push_back(']'); // EMPTY_LIST
          if (!v.empty()) {
            out.push_back('('); // MARK
            for (const auto& item : v) {
              item.writePickle(out);
            }
            out.push_back('e'); // APPENDS
          }
        } else if constexpr (std::is_same_v<T, Tuple>) {
          out.push_back('(');
          for (const auto& item : v.items) {
            item.writePickle(out);
          }
          out.push_back('t'); // TUPLE
        } else if constexpr (std::is_same_v<T, Dict>) {
          out.push_back('}'); // EMPTY_DICT
          if (!v.empty()) {
            out.push_back('(');
            for (const auto& kv : v) {
              pickleString(out, kv.first, std::strlen(kv.first));
              kv.second.writePickle(out);
            }
            out.push_back('u'); // SETITEMS
          }
        }
      },
      value_);
}

namespace {

void jsonString(std::string& out, const char* raw, size_t n) {
  std::string cleaned;
  if (!isAscii(raw, n)) {
    cleaned = validUtf8(std::string(raw, n));
    raw = cleaned.data();
    n = cleaned.size();
  }
  out.push_back('"');
  for (size_t i = 0; i < n; ++i) {
    const char ch = raw[i];
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

} // namespace

std::string DumpValue::toJson() const {
  std::string out;
  out.reserve(1 << 20);
  writeJson(out);
  out.push_back('\n');
  return out;
}

void DumpValue::writeJson(std::string& out) const {
  std::visit(
      [&out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          out += "null";
        } else if constexpr (std::is_same_v<T, bool>) {
          out += v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, int64_t>) {
          out += std::to_string(v);
        } else if constexpr (std::is_same_v<T, double>) {
          if (!std::isfinite(v)) {
            out += "null";
          } else {
            char buf[32];
            std::snprintf(buf, sizeof(buf), "%.17g", v);
            out += buf;
            if (std::strpbrk(buf, ".eEn") == nullptr) {
              out += ".0";
            }
          }
        } else if constexpr (std::is_same_v<T, std::string>) {
          jsonString(out, v.data(), v.size());
        } else if constexpr (std::is_same_v<T, List> || std::is_same_v<T, Tuple>) {
          const auto& items = [&]() -> const std::vector<DumpValue>& {
            if constexpr (std::is_same_v<T, Tuple>) {
              return v.items;
            } else {
              return v;
            }
          }();
          out.push_back('[');
          bool first = true;
          for (const auto& item : items) {
            if (!first) {
              out.push_back(',');
            }
            first = false;
            item.writeJson(out);
          }
          out.push_back(']');
        } else if constexpr (std::is_same_v<T, Dict>) {
          out.push_back('{');
          bool first = true;
          for (const auto& kv : v) {
            if (!first) {
              out.push_back(',');
            }
            first = false;
            jsonString(out, kv.first, std::strlen(kv.first));
            out.push_back(':');
            kv.second.writeJson(out);
          }
          out.push_back('}');
        }
      },
      value_);
}

} // namespace frnccl
