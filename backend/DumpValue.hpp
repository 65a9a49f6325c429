#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace frnccl {

// A plain-data tree: the one in-memory form of a dump. The per-entry code
// builds it once (DumpWriter.cpp); pickle, JSON and Chrome trace only
// serialize it, so the three formats cannot drift apart.
class DumpValue {
 public:
  using List = std::vector<DumpValue>;
  struct Tuple {
    std::vector<DumpValue> items;
  };
  // Keys are static strings (dump_keys.def) or interned ones (group names):
  // a dump of 20,000 entries sets half a million keys, so none is copied.
  using Dict = std::vector<std::pair<const char*, DumpValue>>;

  DumpValue() : value_(std::monostate{}) {}
  DumpValue(bool v) : value_(v) {}
  DumpValue(int v) : value_(int64_t(v)) {}
  DumpValue(int64_t v) : value_(v) {}
  DumpValue(uint64_t v) : value_(int64_t(v)) {}
  DumpValue(double v) : value_(v) {}
  DumpValue(std::string v) : value_(std::move(v)) {}
  DumpValue(const char* v) : value_(std::string(v)) {}
  DumpValue(List v) : value_(std::move(v)) {}
  DumpValue(Tuple v) : value_(std::move(v)) {}
  DumpValue(Dict v) : value_(std::move(v)) {}

  // `expected` reserves room up front: an entry's dict holds ~26 items, and
  // growing it one by one would move every item several times.
  static DumpValue dict(size_t expected = 0) {
    Dict d;
    d.reserve(expected);
    return DumpValue(std::move(d));
  }
  static DumpValue list(size_t expected = 0) {
    List l;
    l.reserve(expected);
    return DumpValue(std::move(l));
  }

  // Appends to a dict. `key` must outlive the tree: a schema constant or intern()ed.
  DumpValue& set(const char* key, DumpValue v);
  // A stable copy of a key that is not a schema constant (group names, ids).
  static const char* intern(const std::string& key);
  // Appends to a list.
  DumpValue& push(DumpValue v);

  const DumpValue* find(const std::string& key) const;
  bool isNone() const {
    return std::holds_alternative<std::monostate>(value_);
  }
  // An integer (not a bool).
  bool isInt() const {
    return std::holds_alternative<int64_t>(value_);
  }
  int64_t asInt() const;
  double asDouble() const;
  const std::string& asString() const;
  const List& asList() const;
  const Dict& asDict() const;

  // Structural equality and hash: same kinds, same contents (dict keys compared as text).
  bool equals(const DumpValue& other) const;
  size_t hash() const;

  // Pickle protocol 2 of plain types only: pickle.loads needs no imports.
  // Repeated strings (keys, op names, dtypes, file names) are written once
  // and referenced through the pickle memo after that.
  // With `top_key`, this dict's item of that key is written as `*top_value`
  // instead: what the pickle alone adds (torch's ranks strings), without a copy of the tree.
  std::string toPickle(const char* top_key = nullptr, const DumpValue* top_value = nullptr) const;
  std::string toJson() const;
  // Appends this value's JSON (no newline) to `out`.
  void appendJson(std::string& out) const;
  // Appends `s` as a JSON string (quoted, escaped, made valid UTF-8) to `out`.
  static void appendJsonString(std::string& out, const char* s, size_t n);

  template <class Visitor>
  decltype(auto) visit(Visitor&& visitor) const {
    return std::visit(std::forward<Visitor>(visitor), value_);
  }

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, List, Tuple, Dict>
      value_;
};

} // namespace frnccl
