#pragma once

// A small JSON reader for rank summaries (RankSummary.hpp) only: bounded input, bounded depth, integers
// only (no field of a summary is fractional), no exceptions. Store values are hostile: whatever it cannot
// read, it refuses, and the verdict counts that rank's summary as unreadable.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace frnccl::summary_json {

struct Json {
  enum Type { kNull, kBool, kNum, kStr, kArr, kObj } type = kNull;
  bool b = false;
  int64_t n = 0;
  std::string s;
  std::vector<Json> a;
  std::vector<std::pair<std::string, Json>> o;

  const Json* get(const char* key) const {
    for (const auto& [k, v] : o) {
      if (k == key) {
        return &v;
      }
    }
    return nullptr;
  }
  int64_t num(const char* key, int64_t fallback) const {
    const Json* v = get(key);
    return v != nullptr && v->type == kNum ? v->n : fallback;
  }
  std::string str(const char* key) const {
    const Json* v = get(key);
    return v != nullptr && v->type == kStr ? v->s : "";
  }
  bool flag(const char* key) const {
    const Json* v = get(key);
    return v != nullptr && v->type == kBool && v->b;
  }
};

class Reader {
 public:
  explicit Reader(const std::string& text) : t_(text) {}
  bool parse(Json& out) {
    if (!value(out, 0)) {
      return false;
    }
    space();
    return i_ == t_.size();
  }

 private:
  static constexpr int kMaxDepth = 8;
  void space() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) {
      ++i_;
    }
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (t_.compare(i_, w.size(), w) != 0) {
      return false;
    }
    i_ += w.size();
    return true;
  }
  bool string(std::string& out) {
    if (i_ >= t_.size() || t_[i_] != '"') {
      return false;
    }
    ++i_;
    while (i_ < t_.size()) {
      const char c = t_[i_++];
      if (c == '"') {
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        return false;
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= t_.size()) {
        return false;
      }
      const char e = t_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out.push_back(e); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          if (i_ + 4 > t_.size()) {
            return false;
          }
          unsigned code = 0;
          for (int k = 0; k < 4; ++k) {
            const char h = t_[i_++];
            code <<= 4;
            if (h >= '0' && h <= '9') code |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f') code |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') code |= unsigned(h - 'A' + 10);
            else return false;
          }
          out.push_back(code < 0x80 ? char(code) : '?'); // shown escaped by printable() anyway
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool value(Json& out, int depth) {
    if (depth > kMaxDepth) {
      return false;
    }
    space();
    if (i_ >= t_.size()) {
      return false;
    }
    const char c = t_[i_];
    if (c == '{') {
      ++i_;
      out.type = Json::kObj;
      space();
      if (i_ < t_.size() && t_[i_] == '}') {
        ++i_;
        return true;
      }
      while (true) {
        space();
        std::string key;
        if (!string(key)) {
          return false;
        }
        space();
        if (i_ >= t_.size() || t_[i_++] != ':') {
          return false;
        }
        Json v;
        if (!value(v, depth + 1)) {
          return false;
        }
        out.o.emplace_back(std::move(key), std::move(v));
        space();
        if (i_ < t_.size() && t_[i_] == ',') {
          ++i_;
          continue;
        }
        return i_ < t_.size() && t_[i_++] == '}';
      }
    }
    if (c == '[') {
      ++i_;
      out.type = Json::kArr;
      space();
      if (i_ < t_.size() && t_[i_] == ']') {
        ++i_;
        return true;
      }
      while (true) {
        Json v;
        if (!value(v, depth + 1)) {
          return false;
        }
        out.a.push_back(std::move(v));
        space();
        if (i_ < t_.size() && t_[i_] == ',') {
          ++i_;
          continue;
        }
        return i_ < t_.size() && t_[i_++] == ']';
      }
    }
    if (c == '"') {
      out.type = Json::kStr;
      return string(out.s);
    }
    if (c == 't' || c == 'f') {
      out.type = Json::kBool;
      out.b = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      return literal("null");
    }
    bool negative = false;
    if (c == '-') {
      negative = true;
      ++i_;
    }
    size_t digits = 0;
    uint64_t n = 0;
    while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
      const uint64_t digit = uint64_t(t_[i_++] - '0');
      if (++digits > 19 || n > (uint64_t(INT64_MAX) - digit) / 10) {
        return false; // beyond int64: no field of a summary is
      }
      n = n * 10 + digit;
    }
    if (digits == 0) {
      return false;
    }
    out.type = Json::kNum;
    out.n = negative ? -int64_t(n) : int64_t(n);
    return true;
  }

  const std::string& t_;
  size_t i_ = 0;
};

} // namespace frnccl::summary_json
