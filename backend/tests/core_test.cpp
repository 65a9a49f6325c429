// Native tests of the recorder and the dump tree: no Python, no process group.
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "DumpValue.hpp"
#include "Recorder.hpp"

using namespace frnccl;

static int failures = 0;

#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

static void testJson() {
  DumpValue d = DumpValue::dict();
  d.set("a", int64_t(1));
  d.set("b", "x\"y\n");
  DumpValue l = DumpValue::list();
  l.push(true);
  l.push(DumpValue());
  l.push(1.5);
  d.set("c", std::move(l));
  d.set("t", DumpValue::Tuple{{"pg", "desc"}});
  EXPECT(d.toJson() == "{\"a\":1,\"b\":\"x\\\"y\\n\",\"c\":[true,null,1.5],\"t\":[\"pg\",\"desc\"]}\n");
}

static void testPickleBytes() {
  // {"k": [1, 2**40], "v": "k"} in protocol 2: PROTO, EMPTY_DICT, MARK, "k" BINPUT 0, EMPTY_LIST, MARK,
  // BININT, LONG1, APPENDS, "v" BINPUT 1, BINGET 0 (the repeated string comes from the memo), SETITEMS, STOP
  DumpValue d = DumpValue::dict();
  DumpValue l = DumpValue::list();
  l.push(int64_t(1));
  l.push(int64_t(1) << 40);
  d.set("k", std::move(l));
  d.set("v", "k");
  const std::string p = d.toPickle();
  const unsigned char bytes[] = {0x80, 0x02, '}', '(', 'X', 1, 0, 0, 0, 'k', 'q', 0, ']', '(', 'J', 1, 0, 0, 0,
                                 0x8a, 8, 0, 0, 0, 0, 0, 1, 0, 0, 'e', 'X', 1, 0, 0, 0, 'v', 'q', 1, 'h', 0,
                                 'u', '.'};
  const std::string expected(reinterpret_cast<const char*>(bytes), sizeof(bytes));
  EXPECT(p == expected);
}

static void testRingBufferDrops() {
  Recorder& rec = Recorder::get();
  rec.configure(4, CaptureMode::kNone);
  PgInfo a;
  a.name = "a";
  PgInfo b;
  b.name = "b";
  const int32_t pa = rec.registerPg(a);
  const int32_t pb = rec.registerPg(b);
  at::Tensor t = at::ones({2, 3});
  std::vector<at::Tensor> ts{t};
  for (int i = 1; i <= 6; ++i) {
    OpRecord op{pa, OpKind::kAllreduce, InnerKind::kGloo, i, 0, i, 1000, -1, -1};
    rec.record(op, ts, ts);
  }
  OpRecord send{pb, OpKind::kSend, InnerKind::kGloo, 0, 1, 7, 1000, 1, 1};
  const int64_t id = rec.record(send, ts, ts);
  EXPECT(id == 6);
  Snapshot snap = rec.snapshot(false);
  EXPECT(snap.entries.size() == 4);
  EXPECT(snap.entries.front().record_id == 3);
  EXPECT(snap.pgs[pa].last_dropped_collective == 3); // seqs 1..3 were evicted
  EXPECT(snap.pgs[pb].last_dropped_p2p == -1);
  EXPECT(snap.pgs[pa].last_enqueued_collective == 6);
  EXPECT(snap.entries.back().input_ranks.size() == 1 && snap.entries.back().shapes.size() == 4);
  rec.markCompleted(id, 123, 1.f, 0, 0);
  EXPECT(rec.snapshot(false).pgs[pb].last_completed_p2p == 1);
  rec.markStarted(0, 5); // evicted: ignored
  EXPECT(rec.snapshot(false).entries.front().started_ns == 0);
}

int main() {
  testJson();
  testPickleBytes();
  testRingBufferDrops();
  if (failures == 0) {
    std::printf("frnccl core tests: all passed\n");
  }
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
