// CUDA-only: completion markers and GPU timestamps for ops on CUDA tensors.
// Compiled only against a CUDA build of torch (see setup.py / CMakeLists.txt).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>

#include "Clock.hpp"
#include "DeviceMarker.hpp"
#include "InnerProgress.hpp"
#include "StreamOrder.hpp"

namespace frnccl {

namespace {

// Maps GPU event times onto the wall clock: an event recorded on an idle
// stream of ours completes almost at once (unless it waits behind other
// streams' work, below), so its time is "now" on the CPU too.
// Renewed every g_clock_sync_interval_ns: cudaEventElapsedTime gives float
// milliseconds, whose step grows with the distance from the reference (a
// quarter millisecond an hour later, 8 ms a day later), and the GPU's clock
// drifts from the wall clock, which NTP steers.
struct Calibration {
  cudaStream_t stream = nullptr; // ours, idle but for these events; kept for the process's life
  cudaEvent_t reference = nullptr; // completed; its GPU time is reference_wall_ns
  cudaEvent_t candidate = nullptr; // the next reference once it completes in time
  bool candidate_pending = false; // recorded, not yet seen complete
  int64_t reference_wall_ns = 0; // 0: no reference yet, so no GPU times
  int64_t tried_mono_ns = 0;
};

std::atomic<int64_t> g_clock_sync_interval_ns{10LL * 1000 * 1000 * 1000};
std::atomic<int64_t> g_clock_syncs{0};
// How long the watchdog waits for a reference event: a bounded spin, never a
// synchronize, so a GPU that does not run the event soon (streams share the
// device's hardware queues, one with CUDA_DEVICE_MAX_CONNECTIONS=1; or the
// device is wedged) cannot stall the thread that detects hangs. The first
// reference may wait longer, as no GPU time is mapped without it; a renewal
// that does not complete in time leaves the current one in use. (Events may be
// older than the reference: the time between them is then negative, as CUDA allows.)
constexpr int64_t kFirstReferenceWaitNs = 100LL * 1000 * 1000;
constexpr int64_t kRenewalWaitNs = 1000 * 1000;

// Only the watchdog maps times, one op at a time: the table's lock is held
// for one op's mapping and, once an interval, for one bounded wait.
std::mutex g_calibration_mutex;

void renewLocked(Calibration& c, int64_t wait_ns) {
  if (c.candidate_pending) {
    const cudaError_t status = cudaEventQuery(c.candidate);
    if (status == cudaErrorNotReady) {
      return; // still behind other work; the current reference stays in use
    }
    (void)cudaGetLastError();
    c.candidate_pending = false; // done at an unknown time since: of no use, recorded anew below
  }
  const int64_t before = wallNs();
  if (cudaEventRecord(c.candidate, c.stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  c.candidate_pending = true;
  while (true) {
    const cudaError_t status = cudaEventQuery(c.candidate);
    const int64_t after = wallNs();
    if (status == cudaSuccess) {
      // Seen complete a query's latency (1-2 us) after its GPU time; the
      // record before it took longer to reach the GPU, so `before` is no
      // closer (on an H200, mid-way between them mapped ops 3 us before issue).
      std::swap(c.reference, c.candidate);
      c.reference_wall_ns = after;
      c.candidate_pending = false;
      g_clock_syncs.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (status != cudaErrorNotReady) {
      (void)cudaGetLastError();
      c.candidate_pending = false;
      return;
    }
    if (after - before > wait_ns) {
      return; // left pending: looked at again at the next try
    }
  }
}

Calibration& calibrationLocked(int device) {
  static auto* table = new std::unordered_map<int, Calibration>(); // leaked: used until exit
  Calibration& c = (*table)[device];
  const int64_t now = monoNs();
  if (c.tried_mono_ns != 0 && now - c.tried_mono_ns < g_clock_sync_interval_ns.load(std::memory_order_relaxed)) {
    return c;
  }
  c.tried_mono_ns = now;
  cudaStream_t stream = nullptr;
  if (c.stream == nullptr && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess) {
    c.stream = stream;
  }
  for (cudaEvent_t* event : {&c.reference, &c.candidate}) {
    cudaEvent_t made = nullptr;
    if (*event == nullptr && cudaEventCreateWithFlags(&made, cudaEventDefault) == cudaSuccess) {
      *event = made;
    }
  }
  if (c.stream == nullptr || c.reference == nullptr || c.candidate == nullptr) {
    (void)cudaGetLastError();
    return c;
  }
  renewLocked(c, c.reference_wall_ns == 0 ? kFirstReferenceWaitNs : kRenewalWaitNs);
  return c;
}

void bindDevice(int device);

// The op path records an event per op. Through the runtime (cudaEventRecord)
// each call first checks the calling thread's runtime state; the driver's
// entry point, looked up once in the libcuda that torch loaded, skips that
// and, unlike the runtime, leaves no error for the application's next
// cudaGetLastError() if it fails. The runtime call remains the fallback
// (libcuda not found, or no current context on this thread).
using DriverEventRecord = int (*)(cudaEvent_t, cudaStream_t); // CUresult cuEventRecord(CUevent, CUstream)

DriverEventRecord driverEventRecord() {
  static const DriverEventRecord record = []() -> DriverEventRecord {
    void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return libcuda == nullptr ? nullptr : reinterpret_cast<DriverEventRecord>(dlsym(libcuda, "cuEventRecord"));
  }();
  return record;
}

void recordEvent(cudaEvent_t event, cudaStream_t stream) {
  const DriverEventRecord record = driverEventRecord();
  if (record != nullptr && record(event, stream) == 0) {
    return;
  }
  if (cudaEventRecord(event, stream) != cudaSuccess) {
    (void)cudaGetLastError(); // frnccl's own failure is not the application's error
  }
}

// A stream's place in this order must match the order of the work on it when
// threads share a stream, so tickets are taken, and end events recorded,
// under one (uncontended) lock.
std::mutex g_order_mutex;
uint64_t g_next_ticket = 0;
std::atomic<int64_t> g_own_end_events{0};
std::atomic<int64_t> g_catch_up_end_events{0};
std::atomic<int64_t> g_by_torch_watchdog{0};

// torch's own streams (the default stream and its pools) live as long as the
// process; an external stream's id is its cudaStream_t, an even number
// (c10/cuda/CUDAStream.cpp). Only torch's own streams get catch-up events.
bool isTorchOwnedStream(const c10::cuda::CUDAStream& stream) {
  const c10::StreamId id = stream.id();
  return id == 0 || (id & 1) != 0;
}

// The watchdog asks about events while a training thread may be capturing a
// CUDA graph. In the default (global) capture mode such a call from another
// thread is refused and invalidates the capture, so queries run in relaxed
// mode, as torch's own NCCL watchdog does; the caller's mode is restored.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() {
    if (cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
      (void)cudaGetLastError();
      restore_ = false;
    }
  }
  ~RelaxedCaptureMode() {
    if (restore_ && cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool restore_ = true;
};

class CudaMarker final : public DeviceMarker {
 public:
  // Events are made once per marker and kept while it is pooled: untimed
  // markers have an end event, timed ones a start and an end event.
  CudaMarker(int device, bool timed) : device_(device), timed_(timed) {
    // An event belongs to the device current at its creation, and the
    // caller's current device need not be the tensor's.
    int current = -1;
    const bool switched = cudaGetDevice(&current) == cudaSuccess && current != device &&
        cudaSetDevice(device) == cudaSuccess;
    const unsigned flags = timed ? cudaEventDefault : cudaEventDisableTiming;
    if (timed && cudaEventCreateWithFlags(&start_, flags) != cudaSuccess) {
      start_ = nullptr;
    }
    if (cudaEventCreateWithFlags(&end_, flags) != cudaSuccess) {
      end_ = nullptr;
    }
    if (switched) {
      cudaSetDevice(current);
    }
    (void)cudaGetLastError();
  }
  // Markers live as long as the process (see MarkerPool), so their events are never destroyed.
  ~CudaMarker() override = default;

  // A pooled marker starts each op afresh; its events are reused.
  void reset(int64_t end_event_interval_ns) {
    end_event_interval_ns_ = end_event_interval_ns;
    has_end_event_ = false;
    progress_ = nullptr;
    inner_seq_ = -1;
    torch_owned_stream_ = false;
    stream_ = 0;
    ticket_ = 0;
  }
  void release() override;

  void recordStart() override {
    if (timed_ && start_ != nullptr) {
      recordEvent(start_, c10::cuda::getCurrentCUDAStream(device_).stream());
    }
  }
  void settleBy(const InnerProgress* progress, int64_t inner_seq) override {
    progress_ = progress;
    inner_seq_ = inner_seq;
  }
  void recordEnd() override {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
    cudaStream_t stream = current.stream();
    stream_ = reinterpret_cast<uint64_t>(stream);
    torch_owned_stream_ = isTorchOwnedStream(current);
    // Should torch's status be distrusted later, the op falls back to a
    // catch-up event, which only torch's own streams may get.
    if (!torch_owned_stream_ || timed_) {
      progress_ = nullptr;
    }
    // Ops on a stream frnccl may not place a catch-up event on all get their own.
    // The interval is tested first: at its default (0, every op) the sampler and the clock stay off the op path.
    thread_local EndEventSampler sampler;
    const bool own_event = progress_ == nullptr &&
        (end_event_interval_ns_ <= 0 || timed_ || !torch_owned_stream_ ||
         sampler.due(device_, stream_, monoNs(), end_event_interval_ns_));
    std::lock_guard<std::mutex> lock(g_order_mutex);
    ticket_ = ++g_next_ticket;
    // Counters are written under g_order_mutex and read without it: no read-modify-write needed.
    if (own_event && end_ != nullptr) {
      recordEvent(end_, stream);
      g_own_end_events.store(g_own_end_events.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    } else if (progress_ != nullptr) {
      g_by_torch_watchdog.store(g_by_torch_watchdog.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
    has_end_event_ = own_event;
  }
  bool knowsCompletion() const override {
    return has_end_event_ || settledByTorchWatchdog();
  }
  bool settledByTorchWatchdog() const override {
    return !has_end_event_ && progress_ != nullptr && progress_->trusted();
  }
  bool placeEndEventNow() override {
    if (knowsCompletion() || !torch_owned_stream_ || end_ == nullptr) {
      return false;
    }
    bindDevice(device_);
    RelaxedCaptureMode relaxed;
    auto stream = reinterpret_cast<cudaStream_t>(stream_);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
      (void)cudaGetLastError();
      return false; // an event recorded now would join the graph; try again next poll
    }
    std::lock_guard<std::mutex> lock(g_order_mutex);
    ticket_ = ++g_next_ticket;
    recordEvent(end_, stream);
    g_catch_up_end_events.store(g_catch_up_end_events.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    has_end_event_ = true;
    return true;
  }
  uint64_t stream() const override {
    return stream_;
  }
  uint64_t ticket() const override {
    return ticket_;
  }
  bool started() override {
    if (start_ == nullptr) {
      return false;
    }
    bindDevice(device_);
    RelaxedCaptureMode relaxed;
    return cudaEventQuery(start_) == cudaSuccess;
  }
  bool completed() override {
    if (!has_end_event_) {
      // Otherwise settled by a later op on its stream (Watchdog::settleInOrder).
      return progress_ != nullptr && progress_->covers(inner_seq_);
    }
    if (end_ == nullptr) {
      return true; // the event could not be created: never hold the op forever
    }
    // The op's own device: querying from a thread bound to no device would
    // create a context on GPU 0 in every rank's process.
    bindDevice(device_);
    RelaxedCaptureMode relaxed;
    cudaError_t status = cudaEventQuery(end_);
    if (status == cudaErrorNotReady) {
      return false;
    }
    (void)cudaGetLastError(); // do not leave a sticky error for the application
    return true;
  }
  bool timed() const override {
    return timed_;
  }
  void bindThread() override {
    bindDevice(device_);
  }
  void gpuTimes(int64_t& start_ns, int64_t& end_ns, float& duration_ms) override {
    if (!timed_ || start_ == nullptr || end_ == nullptr) {
      return;
    }
    bindDevice(device_);
    RelaxedCaptureMode relaxed;
    std::lock_guard<std::mutex> lock(g_calibration_mutex);
    const Calibration& cal = calibrationLocked(device_);
    // Two driver calls, not three: the end is the start plus the duration, which also keeps end - start
    // equal to the duration where separate mappings would round apart.
    float from_ref_start = 0.f, duration = 0.f;
    if (cal.reference_wall_ns == 0 || cudaEventElapsedTime(&duration, start_, end_) != cudaSuccess ||
        cudaEventElapsedTime(&from_ref_start, cal.reference, start_) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    start_ns = cal.reference_wall_ns + int64_t(double(from_ref_start) * 1e6);
    end_ns = start_ns + int64_t(double(duration) * 1e6);
    duration_ms = duration;
  }
  int device() const override {
    return device_;
  }

 private:
  const int device_;
  const bool timed_;
  int64_t end_event_interval_ns_ = 0;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t end_ = nullptr;
  bool has_end_event_ = false;
  const InnerProgress* progress_ = nullptr; // set: torch's watchdog settles the op (InnerProgress.hpp)
  int64_t inner_seq_ = -1;
  bool torch_owned_stream_ = false;
  uint64_t stream_ = 0;
  uint64_t ticket_ = 0;
};

// Every marker ever made, free or in use: a marker is taken by the op path
// and given back by the watchdog once it is done with the op, so the pool
// grows to the most ops in flight at once, plus a batch per issuing thread,
// and no further. Leaked with its markers: events outlive static destruction.
// Lock: mutex_ guards the free lists; the watchdog gives markers back one by
// one, and an issuing thread takes a batch at a time into its own stash, so
// the op path meets the watchdog on this lock once per batch, not per op.
class MarkerPool {
 public:
  static constexpr size_t kBatch = 16;

  CudaMarker* take(int device, bool timed, int64_t end_event_interval_ns);
  void give(CudaMarker* marker, bool timed) {
    std::lock_guard<std::mutex> lock(mutex_);
    listFor(marker->device(), timed).push_back(marker);
  }
  // Moves up to kBatch free markers of this kind into `out`.
  void takeBatch(size_t key, std::vector<CudaMarker*>& out) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& free = listAt(key);
    const size_t n = std::min(free.size(), kBatch);
    out.insert(out.end(), free.end() - n, free.end());
    free.resize(free.size() - n);
  }
  void giveAll(size_t key, std::vector<CudaMarker*>& markers) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& free = listAt(key);
    free.insert(free.end(), markers.begin(), markers.end());
    markers.clear();
  }
  static size_t keyFor(int device, bool timed) {
    return size_t(device) * 2 + (timed ? 1 : 0);
  }

 private:
  // Indexed, not hashed.
  std::vector<CudaMarker*>& listAt(size_t key) {
    if (key >= free_.size()) {
      free_.resize(key + 1);
    }
    return free_[key];
  }
  std::vector<CudaMarker*>& listFor(int device, bool timed) {
    return listAt(keyFor(device, timed));
  }
  std::mutex mutex_;
  std::vector<std::vector<CudaMarker*>> free_;
};

MarkerPool& markerPool() {
  static MarkerPool* pool = std::make_unique<MarkerPool>().release(); // leaked: see MarkerPool
  return *pool;
}

// An issuing thread's markers taken from the pool and not yet used, by kind;
// handed back to the pool when the thread ends.
struct MarkerStash {
  std::vector<std::vector<CudaMarker*>> by_key;
  ~MarkerStash() {
    for (size_t key = 0; key < by_key.size(); ++key) {
      if (!by_key[key].empty()) {
        markerPool().giveAll(key, by_key[key]);
      }
    }
  }
};

CudaMarker* MarkerPool::take(int device, bool timed, int64_t end_event_interval_ns) {
  thread_local MarkerStash stash;
  const size_t key = keyFor(device, timed);
  if (key >= stash.by_key.size()) {
    stash.by_key.resize(key + 1);
  }
  auto& mine = stash.by_key[key];
  if (mine.empty()) {
    takeBatch(key, mine);
  }
  CudaMarker* marker = nullptr;
  if (!mine.empty()) {
    marker = mine.back();
    mine.pop_back();
  } else {
    // Owned by the pool from now on (see the class comment).
    marker = std::make_unique<CudaMarker>(device, timed).release();
  }
  marker->reset(end_event_interval_ns);
  return marker;
}

void CudaMarker::release() {
  markerPool().give(this, timed_);
}

MarkerPtr makeCudaMarker(int device, bool timed, int64_t end_event_interval_ns) {
  return MarkerPtr(markerPool().take(device, timed, end_event_interval_ns));
}

void bindDevice(int device) {
  // Cached per thread: the watchdog calls this before every event query.
  thread_local int bound = -1;
  if (bound == device) {
    return;
  }
  if (cudaSetDevice(device) == cudaSuccess) {
    bound = device;
  } else {
    (void)cudaGetLastError();
  }
}

struct Registrar {
  Registrar() {
    setDeviceMarkerFactory(&makeCudaMarker);
  }
};
Registrar registrar;

} // namespace

void setClockSyncInterval(int64_t interval_ms) {
  g_clock_sync_interval_ns.store(std::max<int64_t>(interval_ms, 1) * 1000 * 1000, std::memory_order_relaxed);
}

int64_t clockSyncs() {
  return g_clock_syncs.load(std::memory_order_relaxed);
}

EndEventCounts endEventCounts() {
  return {g_own_end_events.load(), g_catch_up_end_events.load(), g_by_torch_watchdog.load()};
}

uint64_t currentStreamId(int device) {
  // The default stream's handle is null: shift every handle by one so that 0 stays "none".
  return reinterpret_cast<uint64_t>(c10::cuda::getCurrentCUDAStream(device).stream()) + 1;
}

const char* cudaPartsSkipped() {
  return "";
}

const char* ncclVersionString() {
  static const std::string version = [] {
    // Asked of the NCCL that torch loaded, so no NCCL headers are needed to build.
    using GetVersion = int (*)(int*);
    auto get = reinterpret_cast<GetVersion>(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
    int v = 0;
    if (get == nullptr || get(&v) != 0 || v <= 0) {
      return std::string("unknown");
    }
    // NCCL encodes MAJOR*10000 + MINOR*100 + PATCH (2.9 and later).
    return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
  }();
  return version.c_str();
}

} // namespace frnccl
