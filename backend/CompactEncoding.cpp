#include "CompactEncoding.hpp"

#include <charconv>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "DumpSchema.hpp"

namespace frnccl {

namespace {

using namespace keys;

// The writer's choice of column form per key, as compact.py's encoder makes it.
constexpr const char* kDeltaKeys[] = {kRecordId, kCollectiveSeqId, kP2PSeqId, kOpId, kTimeCreatedNs};
constexpr const char* kOffsetBase = kTimeCreatedNs;
constexpr const char* kOffsetKeys[] = {kTimeStartedNs, kTimeCompletedNs, kTimeGpuStartedNs, kTimeGpuCompletedNs};
// As distinct as the entries: a table would only add an index.
constexpr const char* kPlainKeys[] = {kDurationMs, kIsP2P, kRetired};

template <size_t N>
bool oneOf(const char* key, const char* const (&set)[N]) {
  for (const char* k : set) {
    if (std::strcmp(key, k) == 0) {
      return true;
    }
  }
  return false;
}

// One entry key's values, oldest entry first; nullptr where an entry lacks the key.
using Column = std::vector<const DumpValue*>;

bool allInts(const Column& col) {
  for (const DumpValue* v : col) {
    if (v == nullptr || !v->isInt()) {
      return false;
    }
  }
  return true;
}

void appendInt(std::string& out, int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, size_t(r.ptr - buf));
}

void appendKey(std::string& out, const char* key) {
  DumpValue::appendJsonString(out, key, std::strlen(key));
  out.push_back(':');
}

// Structural hash and equality of values, so a table finds repeats without
// writing each value out first (a caller stack is a few kB of JSON).
size_t hashValue(const DumpValue& value);

struct HashVisitor {
  size_t operator()(std::monostate) const {
    return 0x9e37;
  }
  size_t operator()(bool v) const {
    return v ? 0x51 : 0x50;
  }
  size_t operator()(int64_t v) const {
    return std::hash<int64_t>()(v);
  }
  size_t operator()(double v) const {
    return std::hash<double>()(v) ^ 0x3d;
  }
  size_t operator()(const std::string& v) const {
    return std::hash<std::string_view>()(v);
  }
  size_t items(const std::vector<DumpValue>& items, size_t seed) const {
    size_t h = seed;
    for (const auto& item : items) {
      h = h * 1000003u ^ hashValue(item);
    }
    return h;
  }
  size_t operator()(const DumpValue::List& v) const {
    return items(v, 0x11);
  }
  size_t operator()(const DumpValue::Tuple& v) const {
    return items(v.items, 0x12);
  }
  size_t operator()(const DumpValue::Dict& v) const {
    size_t h = 0x13;
    for (const auto& kv : v) {
      h = (h * 1000003u ^ std::hash<std::string_view>()(kv.first)) * 1000003u ^ hashValue(kv.second);
    }
    return h;
  }
};

size_t hashValue(const DumpValue& value) {
  return value.visit(HashVisitor{});
}

bool equalValues(const DumpValue& a, const DumpValue& b);

struct EqualVisitor {
  const DumpValue& other;
  template <class T>
  bool operator()(const T& mine) const {
    return other.visit([&](const auto& theirs) { return same(mine, theirs); });
  }
  template <class A, class B>
  static bool same(const A&, const B&) {
    return false; // different kinds
  }
  static bool same(std::monostate, std::monostate) {
    return true;
  }
  static bool same(bool a, bool b) {
    return a == b;
  }
  static bool same(int64_t a, int64_t b) {
    return a == b;
  }
  static bool same(double a, double b) {
    return a == b;
  }
  static bool same(const std::string& a, const std::string& b) {
    return a == b;
  }
  static bool sameItems(const std::vector<DumpValue>& a, const std::vector<DumpValue>& b) {
    if (a.size() != b.size()) {
      return false;
    }
    for (size_t i = 0; i < a.size(); ++i) {
      if (!equalValues(a[i], b[i])) {
        return false;
      }
    }
    return true;
  }
  static bool same(const DumpValue::List& a, const DumpValue::List& b) {
    return sameItems(a, b);
  }
  static bool same(const DumpValue::Tuple& a, const DumpValue::Tuple& b) {
    return sameItems(a.items, b.items);
  }
  static bool same(const DumpValue::Dict& a, const DumpValue::Dict& b) {
    if (a.size() != b.size()) {
      return false;
    }
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::strcmp(a[i].first, b[i].first) != 0 || !equalValues(a[i].second, b[i].second)) {
        return false;
      }
    }
    return true;
  }
};

bool equalValues(const DumpValue& a, const DumpValue& b) {
  return &a == &b || a.visit(EqualVisitor{b});
}

struct ValueHash {
  size_t operator()(const DumpValue* v) const {
    return hashValue(*v);
  }
};
struct ValueEqual {
  bool operator()(const DumpValue* a, const DumpValue* b) const {
    return equalValues(*a, *b);
  }
};

void appendValueOrNull(std::string& out, const DumpValue* v) {
  if (v == nullptr) {
    out.append("null");
  } else {
    v->appendJson(out);
  }
}

void appendPlain(std::string& out, const Column& col) {
  out.push_back('[');
  for (size_t i = 0; i < col.size(); ++i) {
    if (i != 0) {
      out.push_back(',');
    }
    appendValueOrNull(out, col[i]);
  }
  out.push_back(']');
}

void appendDelta(std::string& out, const Column& col) {
  out.append("{");
  appendKey(out, kColumnDelta);
  out.push_back('[');
  int64_t previous = 0;
  for (size_t i = 0; i < col.size(); ++i) {
    if (i != 0) {
      out.push_back(',');
    }
    const int64_t v = col[i]->asInt();
    // Counters and wall-clock ns are >= 0, so the difference fits; unsigned
    // arithmetic keeps any other value from overflowing (undefined behaviour).
    appendInt(out, int64_t(uint64_t(v) - uint64_t(previous)));
    previous = v;
  }
  out.append("]}");
}

void appendOffset(std::string& out, const Column& col, const Column& base) {
  out.append("{");
  appendKey(out, kColumnOffsetFrom);
  DumpValue::appendJsonString(out, kOffsetBase, std::strlen(kOffsetBase));
  out.push_back(',');
  appendKey(out, kColumnValues);
  out.push_back('[');
  for (size_t i = 0; i < col.size(); ++i) {
    if (i != 0) {
      out.push_back(',');
    }
    const int64_t v = col[i]->asInt();
    if (v == 0) {
      out.append("null"); // not seen: 0, not an offset
    } else {
      appendInt(out, int64_t(uint64_t(v) - uint64_t(base[i]->asInt())));
    }
  }
  out.append("]}");
}

void appendTable(std::string& out, const Column& col) {
  std::unordered_map<const DumpValue*, int64_t, ValueHash, ValueEqual> seen;
  std::vector<const DumpValue*> table;
  std::vector<int64_t> index;
  index.reserve(col.size());
  const DumpValue none;
  for (const DumpValue* v : col) {
    const DumpValue* value = v != nullptr ? v : &none;
    auto found = seen.emplace(value, int64_t(table.size()));
    if (found.second) {
      table.push_back(value);
    }
    index.push_back(found.first->second);
  }
  out.append("{");
  appendKey(out, kColumnTable);
  out.push_back('[');
  for (size_t i = 0; i < table.size(); ++i) {
    if (i != 0) {
      out.push_back(',');
    }
    table[i]->appendJson(out);
  }
  out.append("],");
  appendKey(out, kColumnIndex);
  out.push_back('[');
  for (size_t i = 0; i < index.size(); ++i) {
    if (i != 0) {
      out.push_back(',');
    }
    appendInt(out, index[i]);
  }
  out.append("]}");
}

// The union of the entries' keys, in first-seen order, each with its column.
struct Columns {
  std::vector<const char*> keys;
  std::vector<Column> columns;

  explicit Columns(const DumpValue::List& entries) {
    for (size_t i = 0; i < entries.size(); ++i) {
      const DumpValue::Dict* row = entries[i].visit([](const auto& v) -> const DumpValue::Dict* {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, DumpValue::Dict>) {
          return &v;
        } else {
          return nullptr;
        }
      });
      if (row == nullptr) {
        continue; // DumpWriter::build makes only dicts; anything else has no keys
      }
      for (size_t k = 0; k < row->size(); ++k) {
        const char* key = (*row)[k].first;
        // Every entry sets its keys in the same order: the k-th key is almost always the k-th column.
        size_t c = k < keys.size() && std::strcmp(keys[k], key) == 0 ? k : find(key);
        if (c == keys.size()) {
          keys.push_back(key);
          columns.emplace_back(entries.size(), nullptr);
        }
        columns[c][i] = &(*row)[k].second;
      }
    }
  }

  size_t find(const char* key) const {
    for (size_t c = 0; c < keys.size(); ++c) {
      if (std::strcmp(keys[c], key) == 0) {
        return c;
      }
    }
    return keys.size();
  }
};

void appendEntries(std::string& out, const DumpValue::List& entries) {
  const Columns cols(entries);
  const size_t base = cols.find(kOffsetBase);
  const bool base_ints = base < cols.keys.size() && allInts(cols.columns[base]);
  out.append("{");
  appendKey(out, kColumnsCount);
  appendInt(out, int64_t(entries.size()));
  out.push_back(',');
  appendKey(out, kColumns);
  out.push_back('{');
  for (size_t c = 0; c < cols.keys.size(); ++c) {
    if (c != 0) {
      out.push_back(',');
    }
    const char* key = cols.keys[c];
    const Column& col = cols.columns[c];
    appendKey(out, key);
    if (oneOf(key, kDeltaKeys) && allInts(col)) {
      appendDelta(out, col);
    } else if (oneOf(key, kOffsetKeys) && base_ints && allInts(col)) {
      appendOffset(out, col, cols.columns[base]);
    } else if (oneOf(key, kPlainKeys)) {
      appendPlain(out, col);
    } else {
      appendTable(out, col);
    }
  }
  out.append("}}");
}

} // namespace

std::string CompactEncoding::toJson(const DumpValue& dump) {
  std::string out;
  out.reserve(4 << 20);
  out.push_back('{');
  const DumpValue* entries = nullptr;
  for (const auto& kv : dump.asDict()) {
    if (std::strcmp(kv.first, kEntries) == 0) {
      entries = &kv.second;
      continue;
    }
    appendKey(out, kv.first);
    kv.second.appendJson(out);
    out.push_back(',');
  }
  appendKey(out, kEncoding);
  DumpValue::appendJsonString(out, kCompactEncoding, std::strlen(kCompactEncoding));
  out.push_back(',');
  appendKey(out, kEntries);
  static const DumpValue::List kNoEntries;
  appendEntries(out, entries != nullptr ? entries->asList() : kNoEntries);
  out.append("}\n");
  return out;
}

} // namespace frnccl
