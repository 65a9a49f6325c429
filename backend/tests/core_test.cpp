// Native tests of the recorder, the dump tree and the watchdog's stream order: no Python, no process group.
#include <ATen/ATen.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <spawn.h>

extern char** environ;

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "Clock.hpp"
#include "CompactEncoding.hpp"
#include "DumpSchema.hpp"
#include "DumpValue.hpp"
#include "DumpWriter.hpp"
#include "Gzip.hpp"
#include "HeartbeatMonitor.hpp"
#include "MonitorDetail.hpp"
#include "StoreWaiter.hpp"
#include "InnerProgress.hpp"
#include "Recorder.hpp"
#include "StreamOrder.hpp"
#include "Watchdog.hpp"

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

// Three entries in the row form DumpWriter::build makes: each key gets the column form compact.py's
// encoder gives it (the Python decoder's round trip is tested in test/test_compact_dump.py).
static void testCompactColumns() {
  DumpValue d = DumpValue::dict();
  d.set("rank", int64_t(3));
  DumpValue entries = DumpValue::list();
  const int64_t created[] = {1000, 1500, 1700};
  const int64_t started[] = {1010, 0, 1750};
  const char* names[] = {"gloo:all_reduce", "gloo:broadcast", "gloo:all_reduce"};
  for (int i = 0; i < 3; ++i) {
    DumpValue e = DumpValue::dict();
    e.set("record_id", int64_t(7 + i));
    e.set("profiling_name", names[i]);
    e.set("time_created_ns", created[i]);
    e.set("time_discovered_started_ns", started[i]);
    if (i != 1) {
      e.set("duration_ms", 0.5 * (i + 1));
    }
    DumpValue frames = DumpValue::list();
    DumpValue f = DumpValue::dict();
    f.set("name", "step");
    f.set("line", int64_t(i == 2 ? 9 : 4));
    frames.push(std::move(f));
    e.set("frames", std::move(frames));
    entries.push(std::move(e));
  }
  d.set("entries", std::move(entries));
  d.set("thread_stacks", "t");
  EXPECT(CompactEncoding::toJson(d) ==
         "{\"rank\":3,\"thread_stacks\":\"t\",\"encoding\":\"columns-2\",\"entries\":{\"count\":3,\"columns\":{"
         "\"record_id\":{\"delta\":\"000101\",\"start\":7},"
         "\"profiling_name\":{\"table\":[\"gloo:all_reduce\",\"gloo:broadcast\"],\"index\":\"010\"},"
         "\"time_created_ns\":{\"delta\":\"000001f400c8\",\"start\":1000},"
         "\"time_discovered_started_ns\":{\"offset_from\":\"time_created_ns\",\"values\":\"0a8032\"},"
         "\"duration_ms\":[0.5,null,1.5],"
         "\"frames\":{\"table\":[[{\"name\":\"step\",\"line\":4}],[{\"name\":\"step\",\"line\":9}]],"
         "\"index\":\"001\"}}}}\n");
}

// A table of more than 64 values cannot be coded one character per entry: its index stays a JSON list.
static void testCompactIndexPastTheAlphabet() {
  DumpValue d = DumpValue::dict();
  DumpValue entries = DumpValue::list();
  for (int i = 0; i < 66; ++i) {
    DumpValue e = DumpValue::dict();
    e.set("profiling_name", "op" + std::to_string(i % 65));
    entries.push(std::move(e));
  }
  d.set("entries", std::move(entries));
  std::string index = "[";
  for (int i = 0; i < 66; ++i) {
    index += (i != 0 ? "," : "") + std::to_string(i % 65);
  }
  const std::string json = CompactEncoding::toJson(d);
  EXPECT(json.find("\"index\":" + index + "]}") != std::string::npos);
}

// RFC 1952 framing around compress2's deflate: header, CRC-32 and size of the input.
static void testGzipFraming() {
  Gzip zlib("libz.so.1");
  EXPECT(zlib.available());
  if (zlib.available()) {
    const std::string gz = zlib.compress("hello world", 1);
    const unsigned char header[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 3};
    EXPECT(gz.size() > 18 && gz.compare(0, 10, std::string(reinterpret_cast<const char*>(header), 10)) == 0);
    // crc32("hello world") = 0x0d4a1185, then ISIZE 11, both little-endian
    const unsigned char trailer[] = {0x85, 0x11, 0x4a, 0x0d, 11, 0, 0, 0};
    EXPECT(gz.compare(gz.size() - 8, 8, std::string(reinterpret_cast<const char*>(trailer), 8)) == 0);
  }
  Gzip missing("libfrnccl-no-such-zlib.so.1");
  EXPECT(!missing.available() && missing.unavailableReason().find("libfrnccl-no-such-zlib.so.1") != std::string::npos);
  bool threw = false;
  try {
    missing.compress("x", 1);
  } catch (const std::runtime_error&) {
    threw = true;
  }
  EXPECT(threw);
}

// Ops' ages are read on the coarse clock, which can lag a tick or more behind (tickless idle; 1.5 ticks
// seen here): sleeping a fixed time past an age does not make the watchdog see it. Waits until the coarse
// clock itself has moved on by `ns` (at most a second).
static void sleepOnCoarseClock(int64_t ns) {
  const int64_t target = coarseMonoNs() + ns;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (coarseMonoNs() < target && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Past the watchdog's catch-up age (2 ms).
constexpr int64_t kPastCatchUpNs = 3 * 1000 * 1000;

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

// A new life of the process (init_process_group after destroy_process_group): the recorder starts empty,
// and neither the last life's groups (torch names the new ones "0", "1", ... again) nor an op recorded later
// on one of them (a group kept past its teardown) reaches a dump.
static void testNewLifeStartsTheRecorderEmpty() {
  Recorder& rec = Recorder::get();
  rec.configure(4, CaptureMode::kNone);
  at::Tensor t = at::ones({2});
  std::vector<at::Tensor> ts{t};
  PgInfo old_info;
  old_info.name = "0";
  old_info.global_ranks = {0, 1};
  const int32_t old_pg = rec.registerPg(old_info);
  rec.record(OpRecord{old_pg, OpKind::kAllreduce, InnerKind::kGloo, 1, 0, 1, 1000, -1, -1}, ts, ts);
  const int64_t life = rec.snapshot(false).life + 1;
  rec.startLife(life);
  const Snapshot empty = rec.snapshot(false);
  EXPECT(empty.life == life && empty.entries.empty());
  EXPECT(empty.pgs.at(old_pg).global_ranks.empty()); // never dumped again: its rank list is let go of
  PgInfo fresh;
  fresh.name = "0";
  fresh.global_ranks = {1, 0};
  const int32_t new_pg = rec.registerPg(fresh);
  EXPECT(new_pg != old_pg);
  const int64_t mine = rec.record(OpRecord{new_pg, OpKind::kAllreduce, InnerKind::kGloo, 1, 0, 1, 1000, -1, -1}, ts, ts);
  rec.record(OpRecord{old_pg, OpKind::kAllreduce, InnerKind::kGloo, 2, 0, 2, 1000, -1, -1}, ts, ts);
  const Snapshot snap = rec.snapshot(false);
  EXPECT(snap.entries.size() == 1 && snap.entries[0].record_id == mine && snap.entries[0].pg_index == new_pg);
  EXPECT(snap.pgs.at(new_pg).life == life && snap.pgs.at(old_pg).life == life - 1);
  Config config;
  DumpRequest request;
  request.incident_id = "life";
  const DumpValue dump = DumpWriter::build(config, request, snap, nullptr, "", "", WatchdogHealth{});
  using namespace keys;
  EXPECT(dump.find(kLife) != nullptr && dump.find(kLife)->asInt() == life);
  const DumpValue::Dict& groups = dump.find(kPgConfig)->asDict();
  EXPECT(groups.size() == 1 && std::string(groups[0].first) == "0");
  EXPECT(groups[0].second.find(kPgMembers)->asString() == "1,0");
  EXPECT(dump.find(kPgStatus)->asDict().size() == 1 && dump.find(kEntries)->asList().size() == 1);
}

static void testCountSettled() {
  // Ops 0..5 of one stream; end events on 1, 3 and 5 only.
  const std::vector<bool> has_event{false, true, false, true, false, true};
  std::vector<int> asked;
  auto settle = [&](std::vector<bool> complete) {
    asked.clear();
    return countSettled(
        has_event.size(), [&](size_t i) { return bool(has_event[i]); },
        [&](size_t i) {
          asked.push_back(int(i));
          EXPECT(has_event[i]); // never asks about an op without an event
          return bool(complete[i]);
        });
  };
  EXPECT(settle({false, false, false, false, false, false}) == 0);
  EXPECT(settle({true, true, false, false, false, false}) == 2); // 0 is settled by 1's event
  EXPECT(settle({true, true, true, true, false, false}) == 4); // 4 waits for 5 (or a catch-up)
  EXPECT(settle({true, true, true, true, true, true}) == 6);
  EXPECT(asked.size() <= 2);
  EXPECT(countSettled(0, [](size_t) { return true; }, [](size_t) { return true; }) == 0);
  EXPECT(countSettled(3, [](size_t) { return false; }, [](size_t) { return true; }) == 0);
}

static void testEndEventSampler() {
  EndEventSampler sampler;
  const int64_t ms = 1000 * 1000;
  EXPECT(sampler.due(0, 7, 10 * ms, ms)); // first op on a stream
  EXPECT(!sampler.due(0, 7, 10 * ms + 1, ms));
  EXPECT(!sampler.due(0, 7, 11 * ms - 1, ms));
  EXPECT(sampler.due(0, 7, 11 * ms, ms)); // an interval later
  EXPECT(sampler.due(0, 8, 11 * ms + 1, ms)); // another stream
  EXPECT(sampler.due(0, 7, 11 * ms + 2, ms)); // and back
  EXPECT(sampler.due(0, 7, 11 * ms + 3, 0)); // interval 0: every op
  EXPECT(sampler.due(0, 7, 11 * ms + 3, 0));
  // Every device's default stream is the null handle: the same handle on another device is another stream.
  EXPECT(sampler.due(0, 0, 20 * ms, ms));
  EXPECT(!sampler.due(0, 0, 20 * ms + 1, ms));
  EXPECT(sampler.due(1, 0, 20 * ms + 2, ms));
}

// Stands in for a CUDA end event: `done` plays the GPU, stream order is the ticket.
// Atomics: the watchdog's own thread may poll between the test's pollNow() calls.
// Tickets are counted per FakeStream from 1; `ticket_offset` keeps those of
// several streams apart, as the process-wide counter of CudaMarker.cpp does.
struct FakeStream {
  int device = 0;
  uint64_t handle = 1;
  uint64_t ticket_offset = 0;
  std::atomic<uint64_t> next_ticket{0};
  std::atomic<uint64_t> completed_up_to{0}; // tickets <= this have run
  std::atomic<int> catch_ups{0};
  std::atomic<uint64_t> started_up_to{0}; // timed markers: tickets <= this have started
  std::atomic<int> start_queries[16] = {}; // by ticket: driver calls a timed marker's started() would make
};

class FakeMarker final : public DeviceMarker {
 public:
  FakeMarker(std::shared_ptr<FakeStream> stream, bool own_event, bool timed = false)
      : stream_(std::move(stream)), has_event_(own_event), timed_(timed), ticket_(++stream_->next_ticket) {}
  void recordStart() override {}
  void settleBy(const InnerProgress* progress, int64_t inner_seq) override {
    progress_ = progress;
    inner_seq_ = inner_seq;
  }
  void recordEnd() override {}
  bool knowsCompletion() const override {
    return has_event_ || settledByTorchWatchdog();
  }
  bool settledByTorchWatchdog() const override {
    return !has_event_ && progress_ != nullptr && progress_->trusted();
  }
  bool placeEndEventNow() override {
    if (knowsCompletion()) {
      return false;
    }
    ticket_ = ++stream_->next_ticket;
    has_event_ = true;
    ++stream_->catch_ups;
    return true;
  }
  bool started() override {
    ++stream_->start_queries[ticket_ % 16];
    return timed_ && ticket_ <= stream_->started_up_to;
  }
  bool completed() override {
    if (!has_event_) {
      return progress_ != nullptr && progress_->covers(inner_seq_);
    }
    return ticket_ <= stream_->completed_up_to;
  }
  bool timed() const override {
    return timed_;
  }
  void bindThread() override {}
  void gpuTimes(int64_t&, int64_t&, float&) override {}
  int device() const override {
    return stream_->device;
  }
  uint64_t stream() const override {
    return stream_->handle;
  }
  uint64_t ticket() const override {
    return stream_->ticket_offset + ticket_;
  }

 private:
  std::shared_ptr<FakeStream> stream_;
  bool has_event_;
  bool timed_;
  uint64_t ticket_;
  const InnerProgress* progress_ = nullptr;
  int64_t inner_seq_ = -1;
};

// A new group `name` in the recorder (sized by the first test that configures it; later calls keep that size).
static int32_t registerTestPg(const char* name) {
  Recorder& rec = Recorder::get();
  rec.configure(64, CaptureMode::kNone);
  PgInfo info;
  info.name = name;
  return rec.registerPg(info);
}

// A synchronous NCCL all_reduce of group `pg`, recorded and ready for the watchdog to follow through `marker`.
static TrackedOp recordedSyncOp(int32_t pg, int64_t seq, int64_t timeout_ms, MarkerPtr marker) {
  std::vector<at::Tensor> none;
  OpRecord op{pg, OpKind::kAllreduce, InnerKind::kNccl, seq, 0, seq, timeout_ms, -1, -1};
  TrackedOp tracked;
  tracked.record_id = Recorder::get().record(op, none, none);
  tracked.pg_index = pg;
  tracked.seq = seq;
  tracked.created_mono_ns = coarseMonoNs();
  tracked.timeout_ms = timeout_ms;
  tracked.marker = std::move(marker);
  tracked.on_gpu = true;
  return tracked;
}

// A Work the test completes, or fails, when it chooses; it reports completion, as Gloo's AsyncWork does.
class SettableWork : public c10d::Work {
 public:
  void settle(std::exception_ptr error = nullptr) {
    finish(error);
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue());
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_ = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
};

// A Work that never says its op completed, even after wait(), and has no future: Gloo's reduce_scatter
// family's (LambdaWork) before torch 2.14.
class SilentWork : public c10d::Work {};

// A Gloo op of group `pg`, recorded and ready for the watchdog to follow through `work` (none: a blocking
// op, done on return).
static TrackedOp trackedCpuOp(int32_t pg, int64_t seq, c10::intrusive_ptr<c10d::Work> work,
                              OpKind kind = OpKind::kAllreduce) {
  std::vector<at::Tensor> none;
  OpRecord op{pg, kind, InnerKind::kGloo, seq, 0, seq, 60 * 1000, -1, -1};
  TrackedOp tracked;
  tracked.record_id = Recorder::get().record(op, none, none);
  tracked.pg_index = pg;
  tracked.op = kind;
  tracked.seq = seq;
  tracked.created_mono_ns = coarseMonoNs();
  tracked.timeout_ms = 60 * 1000;
  tracked.completion_reported = workReportsCompletion(work);
  tracked.work = std::move(work);
  return tracked;
}

static bool recordedComplete(int64_t record_id) {
  for (const auto& e : Recorder::get().snapshot(false).entries) {
    if (e.record_id == record_id) {
      return e.completed_ns != 0;
    }
  }
  return false;
}

static bool recordedStarted(int64_t record_id) {
  for (const auto& e : Recorder::get().snapshot(false).entries) {
    if (e.record_id == record_id) {
      return e.started_ns != 0;
    }
  }
  return false;
}

// Timed ops queued behind one whose GPU start has not fired cannot have started either: a poll asks
// the driver about the first of them only, not about every op in the queue; another stream's queue is
// asked about on its own.
static void testWatchdogAsksOneStartPerStream() {
  const int32_t pg = registerTestPg("start_queries");
  auto stream = std::make_shared<FakeStream>();
  Watchdog watchdog(/*poll_ms=*/1000, [](const Incident&) {});
  std::vector<int64_t> ids;
  for (int64_t seq = 1; seq <= 4; ++seq) {
    TrackedOp tracked = recordedSyncOp(pg, seq, 60 * 1000, makeMarker<FakeMarker>(stream, true, /*timed=*/true));
    ids.push_back(tracked.record_id);
    watchdog.track(std::move(tracked));
  }
  // The watchdog's thread may poll too, so the counts below hold for any number of polls.
  auto asked = [&](uint64_t ticket) { return stream->start_queries[ticket].load(); };
  watchdog.pollNow();
  // The first op has nothing before it, so it has started without asking; the second is asked, and
  // has not started; the two behind it are never asked.
  EXPECT(asked(1) == 0 && asked(2) >= 1 && asked(3) == 0 && asked(4) == 0);
  EXPECT(recordedStarted(ids[0]) && !recordedStarted(ids[1]) && !recordedStarted(ids[3]));
  stream->started_up_to = 2; // the second op's start event fires
  watchdog.pollNow();
  EXPECT(asked(3) >= 1 && asked(4) == 0); // now the third is the first not started
  EXPECT(recordedStarted(ids[1]) && !recordedStarted(ids[2]) && !recordedStarted(ids[3]));
  // An op of the same group on another stream of the device, issued last: its queue there is its own.
  auto side = std::make_shared<FakeStream>();
  side->handle = 2;
  side->ticket_offset = 1000;
  side->started_up_to = 1;
  TrackedOp on_side = recordedSyncOp(pg, 5, 60 * 1000, makeMarker<FakeMarker>(side, true, /*timed=*/true));
  const int64_t side_id = on_side.record_id;
  watchdog.track(std::move(on_side));
  watchdog.pollNow();
  EXPECT(side->start_queries[1].load() >= 1 && recordedStarted(side_id));
  EXPECT(asked(4) == 0 && !recordedStarted(ids[3]));
  stream->completed_up_to = stream->next_ticket.load();
  side->completed_up_to = side->next_ticket.load();
  watchdog.pollNow();
  EXPECT(recordedComplete(ids[3]) && recordedStarted(ids[3]) && recordedComplete(side_id));
  watchdog.stop(1000);
}

// Every device's default stream has the null handle. An op that completed on one device's default stream
// proves nothing of an earlier op on another device's: that one may hang, and must time out.
static void testWatchdogKeepsDevicesApart() {
  const int32_t pg0 = registerTestPg("device_0");
  const int32_t pg1 = registerTestPg("device_1");
  auto gpu0 = std::make_shared<FakeStream>();
  auto gpu1 = std::make_shared<FakeStream>();
  gpu0->handle = gpu1->handle = 0;
  gpu1->device = 1;
  gpu1->ticket_offset = 1000;
  std::vector<Incident> incidents;
  Watchdog watchdog(/*poll_ms=*/1000, [&](const Incident& i) { incidents.push_back(i); });
  TrackedOp hung = recordedSyncOp(pg0, 1, /*timeout_ms=*/300, makeMarker<FakeMarker>(gpu0, true));
  TrackedOp done = recordedSyncOp(pg1, 1, 60 * 1000, makeMarker<FakeMarker>(gpu1, true));
  const int64_t hung_id = hung.record_id, done_id = done.record_id;
  watchdog.track(std::move(hung));
  watchdog.track(std::move(done));
  gpu1->completed_up_to = gpu1->next_ticket.load();
  watchdog.pollNow();
  EXPECT(recordedComplete(done_id) && !recordedComplete(hung_id));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  watchdog.pollNow();
  EXPECT(!recordedComplete(hung_id) && incidents.size() == 1 && incidents[0].reason == "timeout");
  watchdog.stop(1000);
}

// A group's CPU (Gloo) and CUDA (NCCL) ops run apart. A Gloo op whose Work never reports completion (as
// Gloo's reduce_scatter family's does not) counts as done once a later op of its group completes: a later
// CPU op, not a CUDA op that finished first.
static void testWatchdogKeepsCpuAndGpuOpsApart() {
  const int32_t pg = registerTestPg("cpu_and_gpu");
  auto stream = std::make_shared<FakeStream>();
  Watchdog watchdog(/*poll_ms=*/1000, [](const Incident&) {});
  TrackedOp reduce_scatter = trackedCpuOp(pg, 1, c10::make_intrusive<SilentWork>(), OpKind::kReduceScatter);
  const int64_t reduce_scatter_id = reduce_scatter.record_id;
  watchdog.track(std::move(reduce_scatter));
  TrackedOp gpu_op = recordedSyncOp(pg, 2, 60 * 1000, makeMarker<FakeMarker>(stream, true));
  const int64_t gpu_id = gpu_op.record_id;
  watchdog.track(std::move(gpu_op));
  stream->completed_up_to = stream->next_ticket.load();
  watchdog.pollNow();
  watchdog.pollNow();
  EXPECT(recordedComplete(gpu_id) && !recordedComplete(reduce_scatter_id));
  auto later = c10::make_intrusive<SettableWork>();
  later->settle();
  TrackedOp later_cpu_op = trackedCpuOp(pg, 3, later);
  const int64_t later_id = later_cpu_op.record_id;
  watchdog.track(std::move(later_cpu_op));
  watchdog.pollNow();
  watchdog.pollNow();
  EXPECT(recordedComplete(later_id) && recordedComplete(reduce_scatter_id));
  watchdog.stop(1000);
  watchdog.releaseFinished(100);
}

// Only a collective settles the older collectives of its lane whose Works cannot report: a p2p op involves
// one peer, so it neither settles nor is settled by another op. A failure the caller saw later, for a
// collective already settled so, is still an incident, and its entry is retired as failed.
static void testLaneSettlesCollectivesOnly() {
  const int32_t pg = registerTestPg("lane_collectives");
  std::vector<Incident> incidents;
  std::mutex incidents_mutex;
  Watchdog watchdog(/*poll_ms=*/1000, [&](const Incident& i) {
    std::lock_guard<std::mutex> lock(incidents_mutex);
    incidents.push_back(i);
  });
  TrackedOp recv = trackedCpuOp(pg, 1, c10::make_intrusive<SilentWork>(), OpKind::kRecv);
  const int64_t recv_id = recv.record_id;
  watchdog.track(std::move(recv));
  TrackedOp collective = trackedCpuOp(pg, 1, c10::make_intrusive<SilentWork>(), OpKind::kAllreduce);
  const int64_t collective_id = collective.record_id;
  watchdog.track(std::move(collective));
  auto send = c10::make_intrusive<SettableWork>();
  send->settle();
  watchdog.track(trackedCpuOp(pg, 2, send, OpKind::kSend));
  watchdog.pollNow();
  watchdog.pollNow();
  EXPECT(!recordedComplete(collective_id) && !recordedComplete(recv_id)); // a p2p op proves nothing of them
  auto later = c10::make_intrusive<SettableWork>();
  later->settle();
  watchdog.track(trackedCpuOp(pg, 2, later));
  watchdog.pollNow();
  watchdog.pollNow();
  EXPECT(recordedComplete(collective_id) && !recordedComplete(recv_id));
  // The settled collective's own error reaches the caller after all (Gloo runs a group's ops on several
  // threads): the job-wide dump must not miss it.
  watchdog.noteFailure(NotedFailure{collective_id, pg, OpKind::kAllreduce, 1, false, 60 * 1000, coarseMonoNs(),
                                    std::make_exception_ptr(std::runtime_error("Connection closed by peer"))});
  watchdog.pollNow();
  {
    std::lock_guard<std::mutex> lock(incidents_mutex);
    EXPECT(incidents.size() == 1 && incidents[0].reason == "error");
  }
  watchdog.stop(1000);
  watchdog.releaseFinished(100);
}

// An op whose Work cannot report completion is done once the program has moved past it: the caller's wait()
// returned, or a later collective of its lane completed. Whatever op it is: there is no list of such ops. It
// is never timed out on the clock alone, nor holds its lane busy; an op whose Work does report still times out.
static void testOpWhoseWorkCannotReportIsSettledByTheProgram() {
  const int32_t pg = registerTestPg("moved_past");
  std::atomic<int> incidents{0};
  Watchdog watchdog(/*poll_ms=*/1000, [&](const Incident&) { incidents.fetch_add(1); });
  auto short_deadline = [&](TrackedOp op) {
    op.timeout_ms = 200;
    return op;
  };
  EXPECT(!workReportsCompletion(c10::make_intrusive<SilentWork>()));
  EXPECT(workReportsCompletion(c10::make_intrusive<SettableWork>()));
  // Waited for: the caller saw it finish.
  TrackedOp waited = short_deadline(trackedCpuOp(pg, 1, c10::make_intrusive<SilentWork>(), OpKind::kAllgatherBase));
  const int64_t waited_id = waited.record_id;
  watchdog.track(std::move(waited));
  const int64_t waited_wall = wallNs();
  watchdog.noteCompletion(waited_id, waited_wall);
  // Nothing shows it done, past its deadline: not completed, not an incident, and the op issued after it
  // on its lane is seen to start.
  const int32_t pg2 = registerTestPg("moved_past_lane");
  TrackedOp silent = short_deadline(trackedCpuOp(pg2, 1, c10::make_intrusive<SilentWork>(), OpKind::kBroadcast));
  const int64_t silent_id = silent.record_id;
  watchdog.track(std::move(silent));
  auto later = c10::make_intrusive<SettableWork>();
  TrackedOp later_op = trackedCpuOp(pg2, 2, later);
  const int64_t later_id = later_op.record_id;
  watchdog.track(std::move(later_op));
  sleepOnCoarseClock(300 * 1000 * 1000LL);
  watchdog.pollNow();
  EXPECT(incidents.load() == 0);
  EXPECT(recordedComplete(waited_id) && !recordedComplete(silent_id) && recordedStarted(later_id));
  for (const auto& e : Recorder::get().snapshot(false).entries) {
    if (e.record_id == waited_id) {
      EXPECT(e.completed_ns == waited_wall); // when the wait returned, not when the watchdog looked
    }
  }
  // Moved past: the later collective of its lane completed.
  later->settle();
  watchdog.pollNow();
  watchdog.pollNow();
  EXPECT(incidents.load() == 0 && recordedComplete(later_id) && recordedComplete(silent_id));
  // A Work that can report, and has not: past its deadline, it times out.
  watchdog.track(short_deadline(trackedCpuOp(pg, 2, c10::make_intrusive<SettableWork>())));
  sleepOnCoarseClock(300 * 1000 * 1000LL);
  watchdog.pollNow();
  EXPECT(incidents.load() == 1);
  watchdog.stop(1000);
  watchdog.releaseFinished(100);
}

static void testWatchdogInfersCompletionInStreamOrder() {
  const int32_t pg = registerTestPg("stream_order");
  auto stream = std::make_shared<FakeStream>();
  std::vector<Incident> incidents;
  Watchdog watchdog(/*poll_ms=*/1000, [&](const Incident& i) { incidents.push_back(i); });
  std::vector<int64_t> ids;
  auto issue = [&](bool own_event) {
    TrackedOp tracked =
        recordedSyncOp(pg, int64_t(ids.size()) + 1, 60 * 1000, makeMarker<FakeMarker>(stream, own_event));
    ids.push_back(tracked.record_id);
    watchdog.track(std::move(tracked));
  };
  auto completed = recordedComplete;
  // Ops 1-4: only the first has an end event. The GPU runs all of them.
  const int64_t issued = coarseMonoNs(); // no later than any op's creation time
  issue(true);
  issue(false);
  issue(false);
  issue(false);
  stream->completed_up_to = stream->next_ticket.load();
  watchdog.pollNow();
  // Young by the watchdog's clock; a loaded machine (or a tick of the coarse clock) may make it older.
  const bool polled_young = coarseMonoNs() - issued < 1000 * 1000;
  EXPECT(completed(ids[0]));
  EXPECT(!completed(ids[1]) && !completed(ids[3])); // nothing after them proves them done yet
  EXPECT(!polled_young || stream->catch_ups == 0); // too young for a catch-up event
  sleepOnCoarseClock(kPastCatchUpNs);
  watchdog.pollNow(); // the burst's last op is now old enough: the watchdog places an event after it
  EXPECT(stream->catch_ups == 1);
  EXPECT(!completed(ids[3]));
  stream->completed_up_to = stream->next_ticket.load(); // the GPU reaches the catch-up event
  watchdog.pollNow();
  EXPECT(completed(ids[1]) && completed(ids[2]) && completed(ids[3]));

  // A hung op without an event of its own still times out: its catch-up event never completes.
  issue(false);
  sleepOnCoarseClock(kPastCatchUpNs);
  watchdog.pollNow();
  EXPECT(stream->catch_ups == 2);
  watchdog.pollNow();
  EXPECT(!completed(ids[4]));
  EXPECT(incidents.empty());
  watchdog.stop(1000);
}

// Stands in for torch's ProcessGroupStatus: the two seqs its NCCL watchdog publishes.
struct FakeStatus {
  int64_t last_enqueued = -1;
  int64_t last_completed = -1;
};

static std::unique_ptr<InnerProgress> fakeProgress(const std::shared_ptr<FakeStatus>& status) {
  return std::make_unique<InnerProgress>(status, &status->last_enqueued, &status->last_completed);
}

static void testInnerProgressTrust() {
  auto status = std::make_shared<FakeStatus>();
  {
    auto progress = fakeProgress(status);
    EXPECT(progress->trusted());
    progress->admit(/*p2p=*/false, /*stream=*/7);
    progress->admit(false, 7);
    EXPECT(progress->trusted());
    EXPECT(progress->anchorFor(4, 5) == 5);
    EXPECT(progress->anchorFor(5, 5) == -1); // not enqueued for torch's watchdog (graph capture, coalescing)
    EXPECT(progress->anchorFor(4, 6) == -1); // another thread's op came between
    status->last_completed = 4;
    EXPECT(progress->covers(4) && !progress->covers(5));
    progress->admit(false, 8); // an op on another stream may complete out of order
    EXPECT(!progress->trusted() && !progress->covers(4) && progress->anchorFor(6, 7) == -1);
    progress->admit(false, 7);
    EXPECT(!progress->trusted()); // never trusted again
  }
  {
    auto progress = fakeProgress(status);
    progress->admit(false, 7);
    progress->admit(/*p2p=*/true, 7); // p2p seqs are published in the same fields
    EXPECT(!progress->trusted());
  }
  {
    auto progress = fakeProgress(status);
    progress->admit(false, 0); // stream unknown
    EXPECT(!progress->trusted());
  }
}

// Synchronous ops settled by torch's watchdog need no end event; once the
// group runs a p2p op, those still pending fall back to a catch-up event.
static void testWatchdogSettlesByTorchProgress() {
  const int32_t pg = registerTestPg("torch_progress");
  auto stream = std::make_shared<FakeStream>();
  auto status = std::make_shared<FakeStatus>();
  auto progress = fakeProgress(status);
  std::vector<Incident> incidents;
  Watchdog watchdog(/*poll_ms=*/1000, [&](const Incident& i) { incidents.push_back(i); });
  std::vector<int64_t> ids;
  auto issue = [&](bool p2p) {
    progress->admit(p2p, /*stream=*/1);
    const int64_t before = progress->lastEnqueued();
    status->last_enqueued = p2p ? 1 : before + 1; // torch's p2p seqs restart from 1
    TrackedOp tracked = recordedSyncOp(
        pg, int64_t(ids.size()) + 1, 60 * 1000, makeMarker<FakeMarker>(stream, /*own_event=*/false));
    ids.push_back(tracked.record_id);
    const int64_t inner_seq = progress->anchorFor(before, progress->lastEnqueued());
    if (inner_seq >= 0) {
      tracked.marker->settleBy(progress.get(), inner_seq);
    }
    watchdog.track(std::move(tracked));
  };
  auto completed = recordedComplete;
  issue(false); // inner seq 0
  issue(false); // 1
  issue(false); // 2
  status->last_completed = 1; // torch's watchdog saw 0 and 1 complete
  watchdog.pollNow();
  EXPECT(completed(ids[0]) && completed(ids[1]) && !completed(ids[2]));
  sleepOnCoarseClock(kPastCatchUpNs);
  watchdog.pollNow();
  EXPECT(stream->catch_ups == 0); // torch's watchdog answers for op 2: no catch-up event
  EXPECT(!completed(ids[2]));

  // p2p ops publish their own seqs in the same field (from 1, and later past op 2's): op 2 must
  // neither be settled by them nor wait on them forever.
  issue(true);
  for (int64_t p2p_seq : {1, 100}) {
    status->last_completed = p2p_seq;
    watchdog.pollNow();
    EXPECT(!completed(ids[2]));
  }
  sleepOnCoarseClock(kPastCatchUpNs);
  watchdog.pollNow();
  EXPECT(stream->catch_ups == 1); // placed after the p2p op, the last on the stream
  stream->completed_up_to = stream->next_ticket.load();
  watchdog.pollNow();
  EXPECT(completed(ids[2]) && completed(ids[3]));
  EXPECT(incidents.empty());
  watchdog.stop(1000);
}

// torch's watchdog publishes completions once per loop (100 ms apart): an op it
// settles is not called timed out until that lag has passed too; an op with an
// end event of its own is.
static void testTorchSettledOpTimesOutAfterTheLag() {
  const int32_t pg = registerTestPg("torch_lag");
  auto stream = std::make_shared<FakeStream>();
  auto status = std::make_shared<FakeStatus>();
  auto progress = fakeProgress(status);
  auto hang = [&](Watchdog& watchdog, bool settled_by_torch) {
    TrackedOp tracked = recordedSyncOp(pg, 1, /*timeout_ms=*/1, makeMarker<FakeMarker>(stream, !settled_by_torch));
    if (settled_by_torch) {
      progress->admit(false, 1);
      status->last_enqueued += 1;
      tracked.marker->settleBy(progress.get(), status->last_enqueued); // never completes
    }
    watchdog.track(std::move(tracked));
  };
  std::vector<Incident> by_torch, by_event;
  Watchdog torch_settled(/*poll_ms=*/1000, [&](const Incident& i) { by_torch.push_back(i); });
  Watchdog own_event(/*poll_ms=*/1000, [&](const Incident& i) { by_event.push_back(i); });
  hang(torch_settled, true);
  hang(own_event, false);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  torch_settled.pollNow();
  own_event.pollNow();
  EXPECT(by_torch.empty());
  EXPECT(by_event.size() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  torch_settled.pollNow();
  EXPECT(by_torch.size() == 1 && by_torch[0].reason == "timeout");
  torch_settled.stop(1000);
  own_event.stop(1000);
}

// A finished op's Work, recording which thread destroyed it.
class FakeWork : public c10d::Work {
 public:
  explicit FakeWork(std::atomic<int>& destroyed, std::thread::id& destroyed_on)
      : destroyed_(destroyed), destroyed_on_(destroyed_on) {}
  ~FakeWork() override {
    destroyed_on_ = std::this_thread::get_id();
    destroyed_.fetch_add(1);
  }
  bool isCompleted() override {
    return true;
  }

 private:
  std::atomic<int>& destroyed_;
  std::thread::id& destroyed_on_;
};

// The dump an incident leads to shows what completed in the same pass as the failed op: when the incident is
// reported, the pass's progress is already in the recorder.
static void testIncidentFollowsItsPassProgress() {
  const int32_t pg = registerTestPg("incident_after_progress");
  std::atomic<int64_t> done_id{-1};
  std::atomic<int> reported{0};
  std::atomic<bool> done_was_complete{false};
  Watchdog watchdog(/*poll_ms=*/1000, [&](const Incident&) {
    done_was_complete = recordedComplete(done_id.load());
    reported.fetch_add(1);
  });
  auto done = c10::make_intrusive<SettableWork>();
  auto failed = c10::make_intrusive<SettableWork>();
  done->settle();
  failed->settle(std::make_exception_ptr(std::runtime_error("Connection closed by peer")));
  TrackedOp done_op = trackedCpuOp(pg, 1, done);
  done_id = done_op.record_id;
  watchdog.track(std::move(done_op));
  watchdog.track(trackedCpuOp(pg, 2, failed));
  watchdog.pollNow(); // both in one pass, whichever thread runs it
  EXPECT(reported.load() == 1 && done_was_complete.load());
  watchdog.stop(1000);
  watchdog.releaseFinished(100);
}

// A dump asks the watchdog for a pass of its own: an op that completed a moment before shows as completed,
// not as the last periodic poll (up to the idle pause old) left it.
static void testFreshPollSeesJustCompletedOps() {
  const int32_t pg = registerTestPg("fresh_poll");
  Watchdog watchdog(/*poll_ms=*/5000, [](const Incident&) {});
  // Idle, the pause doubles from 10 ms: by now the thread is in a pause of 640 ms that began at about 630 ms.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto work = c10::make_intrusive<SettableWork>();
  work->settle();
  TrackedOp op = trackedCpuOp(pg, 1, work);
  const int64_t id = op.record_id;
  watchdog.track(std::move(op));
  const auto start = std::chrono::steady_clock::now();
  const bool fresh = watchdog.awaitFreshPoll(2000);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT(fresh && recordedComplete(id));
  EXPECT(waited < std::chrono::milliseconds(300));
  watchdog.stop(1000);
  watchdog.releaseFinished(100);
  // A stopped watchdog polls no more: the caller is not kept waiting.
  const auto after_stop = std::chrono::steady_clock::now();
  EXPECT(!watchdog.awaitFreshPoll(2000));
  EXPECT(std::chrono::steady_clock::now() - after_stop < std::chrono::milliseconds(100));
}

static void testFinishedWorkOutlivesItsWorker() {
  const int32_t pg = registerTestPg("finished_works");
  Watchdog watchdog(/*poll_ms=*/1000, [](const Incident&) {});
  std::atomic<int> destroyed{0};
  std::thread::id destroyed_on;
  auto issue = [&](int64_t seq, bool worker_may_hold_work = true) {
    auto work = c10::make_intrusive<FakeWork>(destroyed, destroyed_on);
    TrackedOp tracked = trackedCpuOp(pg, seq, work);
    tracked.worker_may_hold_work = worker_may_hold_work;
    watchdog.track(std::move(tracked));
    return work; // the reference an inner backend's worker thread, or the caller, would still hold
  };

  // A worker still holding the Work: the watchdog's reference is kept, so the worker's is not the last.
  auto held_by_worker = issue(1);
  watchdog.pollNow();
  watchdog.releaseFinished();
  EXPECT(destroyed.load() == 0 && held_by_worker.use_count() == 2);
  held_by_worker.reset(); // the worker lets go; the watchdog's reference is now the last
  watchdog.releaseFinished();
  EXPECT(destroyed.load() == 0); // kept Works are looked at again after a busy poll's interval, not by every op
  sleepOnCoarseClock(10 * 1000 * 1000);
  watchdog.releaseFinished();
  EXPECT(destroyed.load() == 1 && destroyed_on == std::this_thread::get_id());

  // At exit: wait for the worker, then drop the Work on the calling thread.
  auto held_at_exit = issue(2);
  watchdog.pollNow();
  std::thread worker([work = std::move(held_at_exit)]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    work.reset();
  });
  const auto start = std::chrono::steady_clock::now();
  watchdog.releaseFinished(/*settle_ms=*/5000);
  const auto waited = std::chrono::steady_clock::now() - start;
  worker.join();
  EXPECT(destroyed.load() == 2 && destroyed_on == std::this_thread::get_id());
  EXPECT(waited >= std::chrono::milliseconds(20) && waited < std::chrono::milliseconds(4000));

  // At exit, a Work still shared after the wait is dropped by the watchdog anyway: exit is never held up.
  auto never_released = issue(3);
  watchdog.pollNow();
  watchdog.releaseFinished(/*settle_ms=*/20);
  EXPECT(never_released.use_count() == 1);

  // A Work no inner thread holds (NCCL's), still referenced by the caller: the watchdog lets go of it at
  // once, on the op path and at teardown alike, with no wait; the caller's reference is then the last.
  auto held_by_caller = issue(4, /*worker_may_hold_work=*/false);
  watchdog.pollNow();
  watchdog.releaseFinished();
  EXPECT(held_by_caller.use_count() == 1);
  auto held_at_teardown = issue(5, /*worker_may_hold_work=*/false);
  watchdog.pollNow();
  const auto teardown_start = std::chrono::steady_clock::now();
  watchdog.releaseFinished(/*settle_ms=*/5000);
  EXPECT(held_at_teardown.use_count() == 1);
  EXPECT(std::chrono::steady_clock::now() - teardown_start < std::chrono::milliseconds(1000));
  const int destroyed_before = destroyed.load();
  held_by_caller.reset();
  held_at_teardown.reset();
  EXPECT(destroyed.load() == destroyed_before + 2 && destroyed_on == std::this_thread::get_id());
  watchdog.stop(1000);
}

// A monitor that writes small unsymbolized dumps into `dir` and looks in the store every 50 ms. The
// dump deadline is long, so a lock taken in the test is not stale by age (two deadlines).
static Config monitorTestConfig(const char* dir, int64_t world_size, int64_t rank) {
  Config config;
  config.dump_dir = dir;
  config.stacks = StackMode::kNone;
  config.symbolize_timeout_ms = 0;
  config.write_json = false;
  config.heartbeat_timeout_ms = 0;
  config.coord_check_ms = 50;
  config.dump_timeout_ms = 20000;
  config.world_size = world_size;
  config.rank = rank;
  return config;
}

// A store whose connection breaks at the first read of a request (frnccl/incident/<n>) once
// `break_on_check` is set: every call after that fails, as TCPStore's do once its socket is closed.
class BreakingStore : public c10d::HashStore {
 public:
  std::atomic<bool> break_on_check{false};
  std::atomic<bool> broken{false};

  int64_t add(const std::string& key, int64_t value) override {
    failIfBroken();
    return HashStore::add(key, value);
  }
  bool check(const std::vector<std::string>& keys) override {
    failIfBroken();
    if (break_on_check.load()) {
      broken = true;
      throw c10::DistNetworkError("Connection reset by peer");
    }
    return HashStore::check(keys);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    failIfBroken();
    return HashStore::get(key);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    failIfBroken();
    HashStore::set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    failIfBroken();
    if (break_on_check.load() && key.rfind("frnccl/incident/", 0) == 0) {
      broken = true;
      throw c10::DistNetworkError("Connection reset by peer");
    }
    return HashStore::compareSet(key, expected, desired);
  }
  bool deleteKey(const std::string& key) override {
    failIfBroken();
    return HashStore::deleteKey(key);
  }

 private:
  void failIfBroken() {
    if (broken.load()) {
      throw c10::DistNetworkError("Broken pipe");
    }
  }
};

// A request that joined another rank's incident is served locally at the next look once the store's
// connection is lost, whichever call lost it: it used to wait out the takeover grace (10 s) when the
// error came from a call other than the poll's first.
static void testJoinedRequestServedOnceStoreLost() {
  HeartbeatMonitor::notePythonFinalizing(); // no interpreter in this process
  char dir[] = "/tmp/frnccl_core_test_XXXXXX";
  EXPECT(mkdtemp(dir) != nullptr);
  Config config = monitorTestConfig(dir, /*world_size=*/2, /*rank=*/1);
  auto store = c10::make_intrusive<BreakingStore>();
  const std::string lock = "20261201-000000.000-error-r0|" + std::to_string(wallNs()); // rank 0's, fresh
  store->set("frnccl/active", std::vector<uint8_t>(lock.begin(), lock.end()));
  HeartbeatMonitor monitor(config, store, [] { return WatchdogHealth{}; }, [] { return int64_t(1); },
                           [](int64_t) { return true; });
  std::atomic<int64_t> served_ns{0};
  std::string served_id;
  monitor.requestJobDump("error", "op failed", [&](const std::string& id) {
    served_id = id;
    served_ns = monoNs();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300)); // joined rank 0's incident by now
  EXPECT(served_ns.load() == 0);
  store->break_on_check = true;
  store->HashStore::add("frnccl/incident_seq", 1); // rank 0 asks; this rank's read of the request breaks
  const int64_t broke_ns = monoNs();
  while (served_ns.load() == 0 && monoNs() - broke_ns < 15LL * 1000000000LL) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT(served_ns.load() != 0 && served_ns.load() - broke_ns < 2LL * 1000000000LL);
  EXPECT(served_id.size() > 6 && served_id.compare(served_id.size() - 6, 6, "-local") == 0);
  monitor.stop(1000);
  std::system(("rm -rf '" + std::string(dir) + "'").c_str());
}

// A group's members are written once, as runs: the pg_config of a rank of a 100,000-rank TP x DP job
// (default group, its TP group, its DP group, and a group with no run form) is as long as at world size 16.
static void testMembersDoNotGrowWithTheWorld() {
  using namespace keys;
  auto config_json = [](int64_t world, int64_t tp, int64_t rank) {
    Snapshot snap;
    auto group = [&](const char* name, std::vector<int64_t> ranks) {
      PgInfo pg;
      pg.pg_id = int32_t(snap.pgs.size());
      pg.name = name;
      pg.size = int64_t(ranks.size());
      pg.global_ranks = std::move(ranks);
      snap.pgs.push_back(std::move(pg));
    };
    std::vector<int64_t> all, tp_ranks, dp_ranks;
    for (int64_t r = 0; r < world; ++r) {
      all.push_back(r);
      if (r / tp == rank / tp) {
        tp_ranks.push_back(r);
      }
      if (r % tp == rank % tp) {
        dp_ranks.push_back(r);
      }
    }
    group("0", all);
    group("1", tp_ranks);
    group("2", dp_ranks);
    group("3", {7, 3, 12, 5});
    Config config;
    DumpRequest request;
    request.incident_id = "members";
    const DumpValue dump = DumpWriter::build(config, request, snap, nullptr, "", "", WatchdogHealth{});
    const DumpValue::Dict& groups = dump.find(kPgConfig)->asDict();
    EXPECT(groups.size() == 4);
    for (const auto& g : groups) {
      EXPECT(g.second.find(kPgGlobalRanks) == nullptr && g.second.find(kPgRanksString) == nullptr);
    }
    std::string text;
    dump.find(kPgConfig)->appendJson(text);
    return std::make_pair(groups[0].second.find(kPgMembers)->asString() + " " +
                              groups[1].second.find(kPgMembers)->asString() + " " +
                              groups[2].second.find(kPgMembers)->asString() + " " +
                              groups[3].second.find(kPgMembers)->asString(),
                          text.size());
  };
  const auto big = config_json(100000, 8, 99989);
  EXPECT(big.first == "0:100000 99984:99992 5:100005:8 7,3,12,5");
  const auto small = config_json(16, 8, 13);
  EXPECT(small.first == "0:16 8:16 5,13 7,3,12,5");
  EXPECT(big.second - small.second < 64); // the digits of the bigger numbers only
  EXPECT(CompactEncoding::members({}).empty());
  EXPECT(CompactEncoding::members({4, 2, 0, -2}) == "4:-4:-2");
  EXPECT(CompactEncoding::members({0, 1, 5, 6, 7}) == "0,1,5:8");
  EXPECT(CompactEncoding::members({INT64_MIN, 0, INT64_MAX}) == std::to_string(INT64_MIN) + ",0," +
                                                                       std::to_string(INT64_MAX));
}

// The lists one read names the ranks from: junk any store client appended is skipped, a rank's last
// +/- entry counts.
static void testRanksInList() {
  using frnccl::monitor_detail::ranksInList;
  const std::vector<bool> writers = ranksInList("0,2,x,,-1,99,2,12345678901,3", 4);
  EXPECT((writers == std::vector<bool>{true, false, true, true}));
  const std::vector<bool> left = ranksInList("+1,+3,-1,+0,-0,+1,-2", 4);
  EXPECT((left == std::vector<bool>{false, true, false, true}));
  EXPECT(ranksInList("", 3) == std::vector<bool>(3, false));
}

// The waiter counts a wake at start and each time its key is set, deleting the key each time; once
// stopped, setting the key ends its wait at once and the thread finishes.
static void testStoreWaiterWakesAndStops() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  StoreWaiter waiter(store, "frnccl/wake/0", std::make_shared<std::mutex>());
  auto waitFor = [](const std::function<bool()>& cond) {
    const int64_t until = monoNs() + 5000LL * 1000000LL;
    while (!cond() && monoNs() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return cond();
  };
  EXPECT(waitFor([&] { return waiter.wakes() >= 1 && waiter.listening(); }));
  const int64_t before = waiter.wakes();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT(waiter.wakes() == before); // nothing set: no wake
  store->set("frnccl/wake/0", std::vector<uint8_t>{'1'});
  EXPECT(waitFor([&] { return waiter.wakes() == before + 1 && !store->check({"frnccl/wake/0"}); }));
  waiter.stop();
  store->set("frnccl/wake/0", std::vector<uint8_t>{'1'});
  EXPECT(waiter.join(2000));
  EXPECT(!waiter.listening() && !waiter.gaveUp());
}

// Run as `frnccl_core_test --stuck-watchdog-child DIR`: one rank whose watchdog
// never beats, over a store holding an frnccl/active lock taken 9.5 s ago that
// no request follows (its trigger is gone), so the watchdog_stuck request joins
// an incident that never asks this rank to dump.
static int stuckWatchdogChild(const char* dir) {
  HeartbeatMonitor::notePythonFinalizing(); // no interpreter in this process
  Config config = monitorTestConfig(dir, /*world_size=*/1, /*rank=*/0);
  config.heartbeat_timeout_ms = 300;
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string lock = "20261201-000000.000-timeout-r1|" + std::to_string(wallNs() - 9500LL * 1000000LL);
  store->set("frnccl/active", std::vector<uint8_t>(lock.begin(), lock.end()));
  // A stuck watchdog: its heartbeat never moves, and it serves no pass.
  HeartbeatMonitor monitor(config, store, [] { return WatchdogHealth{}; }, [] { return int64_t(1); }, [](int64_t ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return false;
  });
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 3; // the monitor should have ended the process (6) long before
}

// A stuck watchdog ends the process (6) only once this rank's dump is written,
// also when its request joined another incident: it used to exit at once.
static void testStuckWatchdogDumpsBeforeExit() {
  char dir[] = "/tmp/frnccl_core_test_XXXXXX";
  EXPECT(mkdtemp(dir) != nullptr);
  const std::string log = std::string(dir) + "/child.log";
  // posix_spawn, not fork: no atfork handler of the libraries this test links (CUDA's, OpenMP's) runs.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // The monitor's log lines, shown only if the test fails.
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  char self[] = "/proc/self/exe";
  char name[] = "frnccl_core_test";
  char flag[] = "--stuck-watchdog-child";
  char* child_argv[] = {name, flag, dir, nullptr};
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, self, &actions, nullptr, child_argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  EXPECT(spawned == 0);
  if (spawned != 0) {
    return;
  }
  int status = 0;
  const int64_t deadline = monoNs() + 60LL * 1000000000LL;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (monoNs() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 6);
  int dumps = 0;
  // POSIX calls: with std::filesystem here, this test crashed (SIGSEGV, cause not pinned down) when
  // built against torch 2.11+cu130 on the GPU image, and passed against torch 2.13 CPU.
  if (DIR* folder = opendir(dir)) {
    while (const dirent* incident = readdir(folder)) {
      struct stat file {};
      const std::string rank_file = std::string(dir) + "/" + incident->d_name + "/compact/frnccl_rank_0.json.gz";
      dumps += incident->d_name[0] != '.' && stat(rank_file.c_str(), &file) == 0 ? 1 : 0;
    }
    closedir(folder);
  }
  EXPECT(dumps == 1);
  if (dumps != 1 || !WIFEXITED(status) || WEXITSTATUS(status) != 6) {
    std::fprintf(stderr, "child's log (%s):\n", log.c_str());
    std::fflush(stderr);
    std::system(("cat " + log + " >&2").c_str());
    return; // leaves the folder for a look
  }
  std::system(("rm -rf '" + std::string(dir) + "'").c_str());
}

// Names each test on stderr first, so a crash in CTest's log says where it happened.
static void run(const char* name, void (*test)()) {
  std::fprintf(stderr, "[ RUN  ] %s\n", name);
  std::fflush(stderr);
  test();
  std::fprintf(stderr, "[ DONE ] %s\n", name);
  std::fflush(stderr);
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--stuck-watchdog-child") {
    return stuckWatchdogChild(argv[2]);
  }
  run("testJson", testJson);
  run("testPickleBytes", testPickleBytes);
  run("testCompactColumns", testCompactColumns);
  run("testCompactIndexPastTheAlphabet", testCompactIndexPastTheAlphabet);
  run("testGzipFraming", testGzipFraming);
  run("testRingBufferDrops", testRingBufferDrops);
  run("testCountSettled", testCountSettled);
  run("testEndEventSampler", testEndEventSampler);
  run("testWatchdogInfersCompletionInStreamOrder", testWatchdogInfersCompletionInStreamOrder);
  run("testWatchdogAsksOneStartPerStream", testWatchdogAsksOneStartPerStream);
  run("testWatchdogKeepsDevicesApart", testWatchdogKeepsDevicesApart);
  run("testWatchdogKeepsCpuAndGpuOpsApart", testWatchdogKeepsCpuAndGpuOpsApart);
  run("testOpWhoseWorkCannotReportIsSettledByTheProgram", testOpWhoseWorkCannotReportIsSettledByTheProgram);
  run("testLaneSettlesCollectivesOnly", testLaneSettlesCollectivesOnly);
  run("testInnerProgressTrust", testInnerProgressTrust);
  run("testWatchdogSettlesByTorchProgress", testWatchdogSettlesByTorchProgress);
  run("testTorchSettledOpTimesOutAfterTheLag", testTorchSettledOpTimesOutAfterTheLag);
  run("testIncidentFollowsItsPassProgress", testIncidentFollowsItsPassProgress);
  run("testFreshPollSeesJustCompletedOps", testFreshPollSeesJustCompletedOps);
  run("testFinishedWorkOutlivesItsWorker", testFinishedWorkOutlivesItsWorker);
  run("testJoinedRequestServedOnceStoreLost", testJoinedRequestServedOnceStoreLost);
  run("testStuckWatchdogDumpsBeforeExit", testStuckWatchdogDumpsBeforeExit);
  run("testRanksInList", testRanksInList);
  run("testMembersDoNotGrowWithTheWorld", testMembersDoNotGrowWithTheWorld);
  run("testStoreWaiterWakesAndStops", testStoreWaiterWakesAndStops);
  run("testNewLifeStartsTheRecorderEmpty", testNewLifeStartsTheRecorderEmpty); // last: the recorder's life moves on
  if (failures == 0) {
    std::printf("frnccl core tests: all passed\n");
    std::fflush(stdout); // before static destruction, whatever it does
  }
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
