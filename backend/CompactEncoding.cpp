#include "CompactEncoding.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
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

void appendInt(std::string& out, int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, size_t(r.ptr - buf));
}

// Packed integer columns: W = 2, 4, 8 or 16 hex digits per value, two's
// complement, most significant first, each column as narrow as its values
// allow. A reader turns them into numbers in C (bytes.fromhex, array), where a
// JSON list costs a Python object per number first. In an offset column the
// most negative W-digit value stands for null.
class PackedInts {
 public:
  // The narrowest width holding [lo, hi]; with nulls, lo must also stay above
  // the width's most negative value, which stands for null.
  PackedInts(int64_t lo, int64_t hi, bool nulls) {
    for (const int digits : {2, 4, 8}) {
      const int64_t top = int64_t(1) << (4 * digits - 1);
      if (lo >= -top + (nulls ? 1 : 0) && hi < top) {
        digits_ = digits;
        return;
      }
    }
  }

  void append(std::string& out, uint64_t v) const {
    static constexpr char kDigits[] = "0123456789abcdef";
    char buf[16];
    for (int i = digits_ - 1; i >= 0; --i) {
      buf[i] = kDigits[v & 0xf];
      v >>= 4;
    }
    out.append(buf, size_t(digits_));
  }

  uint64_t null() const {
    return uint64_t(1) << (4 * digits_ - 1); // its low digits_ digits: 8 then zeros
  }

 private:
  int digits_ = 16;
};

// Table positions as one character each (compact.py: CODE_ALPHABET), for
// tables of up to 64 values.
constexpr char kCodeAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_";
constexpr size_t kCodedTableMax = sizeof(kCodeAlphabet) - 1;

void appendKey(std::string& out, const char* key) {
  DumpValue::appendJsonString(out, key, std::strlen(key));
  out.push_back(':');
}

// Tables find repeats by structural hash and equality, without writing each
// value out first (a caller stack is a few kB of JSON).
struct ValueHash {
  size_t operator()(const DumpValue* v) const {
    return v->hash();
  }
};
struct ValueEqual {
  bool operator()(const DumpValue* a, const DumpValue* b) const {
    return a->equals(*b);
  }
};

const DumpValue kNone;

// A table column: each distinct value once, and each entry's position in it.
class Table {
 public:
  void add(const DumpValue* v) {
    const DumpValue* value = v != nullptr ? v : &kNone;
    // A ring buffer repeats the op before it more often than not: one comparison instead of a hash.
    if (previous_ != nullptr && previous_->equals(*value)) {
      index_.push_back(index_.back());
      return;
    }
    auto found = seen_.emplace(value, int64_t(table_.size()));
    if (found.second) {
      table_.push_back(value);
    }
    index_.push_back(found.first->second);
    previous_ = value;
  }

  void write(std::string& out) const {
    out.append("{");
    appendKey(out, kColumnTable);
    out.push_back('[');
    for (size_t i = 0; i < table_.size(); ++i) {
      if (i != 0) {
        out.push_back(',');
      }
      table_[i]->appendJson(out);
    }
    out.append("],");
    appendKey(out, kColumnIndex);
    if (table_.size() <= kCodedTableMax) {
      out.push_back('"');
      for (const int64_t i : index_) {
        out.push_back(kCodeAlphabet[i]);
      }
      out.append("\"}");
      return;
    }
    out.push_back('[');
    for (size_t i = 0; i < index_.size(); ++i) {
      if (i != 0) {
        out.push_back(',');
      }
      appendInt(out, index_[i]);
    }
    out.append("]}");
  }

 private:
  std::unordered_map<const DumpValue*, int64_t, ValueHash, ValueEqual> seen_;
  std::vector<const DumpValue*> table_;
  std::vector<int64_t> index_;
  const DumpValue* previous_ = nullptr;
};

enum class Form : uint8_t { kDelta, kOffset, kPlain, kTable };

// One entry key's column, filled entry by entry. The entries are read once, in
// order: a pass per column over a 20,000-entry tree would fetch every entry's
// dict from memory once per key (~25 times), which cost more than the rest.
struct Column {
  const char* key;
  Form form;
  size_t filled = 0; // entries seen so far, with or without this key
  // kDelta, kOffset: the integers, and the values themselves should one not be an integer.
  std::vector<int64_t> ints;
  std::vector<const DumpValue*> values;
  bool all_ints = true;
  std::string plain; // kPlain: the JSON list's items
  Table table;

  Column(const char* k, size_t expected) : key(k) {
    form = oneOf(k, kDeltaKeys) ? Form::kDelta
        : oneOf(k, kOffsetKeys) ? Form::kOffset
        : oneOf(k, kPlainKeys)  ? Form::kPlain
                                : Form::kTable;
    if (form == Form::kDelta || form == Form::kOffset) {
      ints.reserve(expected);
      values.reserve(expected);
    }
  }

  // The value of the next entry; nullptr: the entry lacks the key.
  void add(const DumpValue* v) {
    ++filled;
    switch (form) {
      case Form::kDelta:
      case Form::kOffset:
        values.push_back(v);
        if (v != nullptr && v->isInt()) {
          ints.push_back(v->asInt());
        } else {
          all_ints = false;
          ints.push_back(0);
        }
        break;
      case Form::kPlain:
        if (filled != 1) {
          plain.push_back(',');
        }
        if (v == nullptr) {
          plain.append("null");
        } else {
          v->appendJson(plain);
        }
        break;
      case Form::kTable:
        table.add(v);
        break;
    }
  }
  void padTo(size_t n) {
    while (filled < n) {
      add(nullptr);
    }
  }
};

// a - b; callers check first that it fits (deltasFit, offsetsFit).
int64_t difference(int64_t a, int64_t b) {
  return int64_t(uint64_t(a) - uint64_t(b));
}

bool fits(int64_t a, int64_t b) {
  int64_t d = 0;
  return !__builtin_sub_overflow(a, b, &d);
}

// Counters and wall-clock ns are >= 0, so their steps always fit in 64 bits;
// a column whose steps do not (never from DumpWriter::build) is written as a table.
bool deltasFit(const std::vector<int64_t>& ints) {
  for (size_t i = 1; i < ints.size(); ++i) {
    if (!fits(ints[i], ints[i - 1])) {
      return false;
    }
  }
  return true;
}

// Likewise for offsets, which also may not be the most negative value (null at 16 digits).
bool offsetsFit(const std::vector<int64_t>& ints, const std::vector<int64_t>& base) {
  for (size_t i = 0; i < ints.size(); ++i) {
    if (ints[i] != 0 && (!fits(ints[i], base[i]) || difference(ints[i], base[i]) == INT64_MIN)) {
      return false;
    }
  }
  return true;
}

// The first value is the start, so the width is set by the steps alone.
void appendDelta(std::string& out, const std::vector<int64_t>& ints) {
  int64_t lo = 0;
  int64_t hi = 0;
  for (size_t i = 1; i < ints.size(); ++i) {
    const int64_t d = difference(ints[i], ints[i - 1]);
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  const PackedInts packed(lo, hi, false);
  out.append("{");
  appendKey(out, kColumnDelta);
  out.push_back('"');
  for (size_t i = 0; i < ints.size(); ++i) {
    packed.append(out, i == 0 ? 0 : uint64_t(difference(ints[i], ints[i - 1])));
  }
  out.append("\",");
  appendKey(out, kColumnStart);
  appendInt(out, ints.empty() ? 0 : ints[0]);
  out.append("}");
}

void appendOffset(std::string& out, const std::vector<int64_t>& ints, const std::vector<int64_t>& base) {
  int64_t lo = 0;
  int64_t hi = 0;
  for (size_t i = 0; i < ints.size(); ++i) {
    if (ints[i] != 0) { // 0: not seen, written as null
      const int64_t o = difference(ints[i], base[i]);
      lo = std::min(lo, o);
      hi = std::max(hi, o);
    }
  }
  const PackedInts packed(lo, hi, true);
  out.append("{");
  appendKey(out, kColumnOffsetFrom);
  DumpValue::appendJsonString(out, kOffsetBase, std::strlen(kOffsetBase));
  out.push_back(',');
  appendKey(out, kColumnValues);
  out.push_back('"');
  for (size_t i = 0; i < ints.size(); ++i) {
    packed.append(out, ints[i] == 0 ? packed.null() : uint64_t(difference(ints[i], base[i])));
  }
  out.append("\"}");
}

const DumpValue::Dict* asDictOrNull(const DumpValue& v) {
  return v.visit([](const auto& x) -> const DumpValue::Dict* {
    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, DumpValue::Dict>) {
      return &x;
    } else {
      return nullptr;
    }
  });
}

void appendEntries(std::string& out, const DumpValue::List& entries) {
  const size_t n = entries.size();
  std::vector<Column> cols;
  cols.reserve(32);
  auto find = [&](const char* key) {
    for (size_t c = 0; c < cols.size(); ++c) {
      if (cols[c].key == key || std::strcmp(cols[c].key, key) == 0) {
        return c;
      }
    }
    return cols.size();
  };
  for (size_t i = 0; i < n; ++i) {
    const DumpValue::Dict* row = asDictOrNull(entries[i]);
    if (row == nullptr) {
      continue; // DumpWriter::build makes only dicts; anything else has no keys
    }
    for (size_t k = 0; k < row->size(); ++k) {
      const char* key = (*row)[k].first;
      // Every entry sets its keys in the same order: the k-th key is almost always the k-th column.
      size_t c = k < cols.size() && (cols[k].key == key || std::strcmp(cols[k].key, key) == 0) ? k : find(key);
      if (c == cols.size()) {
        cols.emplace_back(key, n);
      }
      cols[c].padTo(i); // the entries before this one that lacked the key
      if (cols[c].filled == i) {
        cols[c].add(&(*row)[k].second);
      } // else: a key repeated within one entry; the first one counts
    }
  }
  for (Column& col : cols) {
    col.padTo(n);
  }
  const size_t base = find(kOffsetBase);
  const bool base_ints = base < cols.size() && cols[base].form == Form::kDelta && cols[base].all_ints;

  out.append("{");
  appendKey(out, kColumnsCount);
  appendInt(out, int64_t(n));
  out.push_back(',');
  appendKey(out, kColumns);
  out.push_back('{');
  for (size_t c = 0; c < cols.size(); ++c) {
    if (c != 0) {
      out.push_back(',');
    }
    const Column& col = cols[c];
    appendKey(out, col.key);
    if (col.form == Form::kDelta && col.all_ints && deltasFit(col.ints)) {
      appendDelta(out, col.ints);
    } else if (col.form == Form::kOffset && col.all_ints && base_ints && offsetsFit(col.ints, cols[base].ints)) {
      appendOffset(out, col.ints, cols[base].ints);
    } else if (col.form == Form::kPlain) {
      out.push_back('[');
      out.append(col.plain);
      out.push_back(']');
    } else if (col.form == Form::kTable) {
      col.table.write(out);
    } else {
      // A counter or time that is not an integer everywhere, or whose steps do not fit in 64 bits (never
      // from DumpWriter::build): a table.
      Table table;
      for (const DumpValue* v : col.values) {
        table.add(v);
      }
      table.write(out);
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

std::string CompactEncoding::members(const std::vector<int64_t>& ranks) {
  std::string out;
  const size_t n = ranks.size();
  size_t i = 0;
  while (i < n) {
    if (!out.empty()) {
      out += ',';
    }
    out += std::to_string(ranks[i]);
    // A run: three or more ranks a constant, non-zero step apart (differences
    // checked for overflow: a stop past int64 is no run).
    int64_t step = 0;
    size_t k = i + 1;
    if (k < n && !__builtin_sub_overflow(ranks[k], ranks[i], &step) && step != 0) {
      int64_t d = 0;
      while (k < n && !__builtin_sub_overflow(ranks[k], ranks[k - 1], &d) && d == step) {
        ++k;
      }
    }
    int64_t stop = 0;
    if (k - i >= 3 && !__builtin_add_overflow(ranks[k - 1], step, &stop)) {
      out += ':' + std::to_string(stop);
      if (step != 1) {
        out += ':' + std::to_string(step);
      }
      i = k;
    } else {
      ++i;
    }
  }
  return out;
}

std::string CompactEncoding::torchRanks(const std::string& members) {
  std::string out = "[";
  const char* p = members.data();
  const char* const end = p + members.size();
  while (p < end) {
    int64_t run[3] = {0, 0, 1};
    int parts = 0;
    for (; parts < 3; ++parts) {
      auto got = std::from_chars(p, end, run[parts]);
      if (got.ec != std::errc()) {
        return out + "]"; // not members() text: what was read so far
      }
      p = got.ptr;
      if (p == end || *p != ':') {
        break;
      }
      ++p;
    }
    auto add = [&](int64_t r) { out += (out.size() > 1 ? ", " : "") + std::to_string(r); };
    if (parts == 0) {
      add(run[0]);
    } else if (run[2] > 0) {
      for (int64_t r = run[0]; r < run[1]; r += run[2]) {
        add(r);
      }
    } else if (run[2] < 0) {
      for (int64_t r = run[0]; r > run[1]; r += run[2]) {
        add(r);
      }
    }
    if (p < end && *p == ',') {
      ++p;
    } else if (p < end) {
      break;
    }
  }
  return out + "]";
}

} // namespace frnccl
