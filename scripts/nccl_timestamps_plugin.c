/*
 * A minimal NCCL profiler plugin for scripts/bench_nccl_timestamps.py: it keeps, per collective, the GPU
 * start and stop of each of its kernel's channels, as NCCL reports them, and lets the benchmark switch
 * NCCL's event mask between blocks. Built by the benchmark with the C compiler; not part of frnccl.
 *
 * The declarations below follow the layout of NCCL's profiler interface, version 4 (NCCL 2.26 and later
 * accept it), written out here so that no NCCL headers are needed: only the fields this plugin reads.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int nccl_result_t; /* ncclSuccess is 0 */
typedef void (*nccl_logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

enum { EVENT_COLL = 1 << 1, EVENT_KERNEL_CHANNEL = 1 << 6 };
enum { STATE_KERNEL_CHANNEL_STOP = 22 };

struct event_descr_v4 {
  uint8_t type;
  void* parent;
  int rank;
  union {
    struct {
      uint64_t seq;
      const char* func;
      const void* send_buff;
      void* recv_buff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t channels;
      uint8_t warps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      uint8_t channel;
      uint64_t gpu_timer; /* globaltimer at the channel's start, ns */
    } kernel_channel;
  };
};

union event_state_args_v4 {
  struct {
    uint64_t gpu_timer; /* globaltimer at the channel's stop, ns */
  } kernel_channel;
  size_t reserved[2];
};

/* Every handle starts with its event type, since stop and record get only the handle. Slots are reused in
 * turn; the benchmark reads the newest, long after their channels stopped. */
struct coll_slot {
  int type;
  int channels_started;
  int channels_stopped;
  int on_calling_thread;
  uint64_t first_start;
  uint64_t last_stop;
};
struct channel_slot {
  int type;
  struct coll_slot* coll;
  uint64_t start;
  uint64_t stop;
};

#define COLL_SLOTS (1 << 16)
#define CHANNEL_SLOTS (1 << 18)
#define LAG_SLOTS 8192
static struct coll_slot coll_slots[COLL_SLOTS];
static struct channel_slot channel_slots[CHANNEL_SLOTS];
static uint64_t next_coll, next_channel, next_lag;
static int64_t stop_lags_ns[LAG_SLOTS];
static int* nccl_event_mask; /* NCCL's mask: one for the whole process */
static int calling_thread;
static int64_t counts[6]; /* comms, colls, colls on the calling thread, channels started, channels stopped, orphans */

static int64_t wall_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void count(int which) {
  __atomic_add_fetch(&counts[which], 1, __ATOMIC_RELAXED);
}

static nccl_result_t plugin_init(void** context, int* event_mask, const char* comm_name, uint64_t comm_hash,
                                 int nodes, int ranks, int rank, nccl_logger_t log) {
  (void)comm_name, (void)comm_hash, (void)nodes, (void)ranks, (void)rank, (void)log;
  count(0);
  nccl_event_mask = event_mask;
  *event_mask = 0; /* the benchmark sets it per block */
  *context = coll_slots;
  return 0;
}

static nccl_result_t plugin_start_event(void* context, void** handle, struct event_descr_v4* descr) {
  (void)context;
  *handle = NULL;
  if (descr->type == EVENT_COLL) {
    struct coll_slot* coll = &coll_slots[__atomic_fetch_add(&next_coll, 1, __ATOMIC_RELAXED) % COLL_SLOTS];
    coll->type = EVENT_COLL;
    coll->channels_started = 0;
    coll->channels_stopped = 0;
    coll->first_start = UINT64_MAX;
    coll->last_stop = 0;
    coll->on_calling_thread = (int)syscall(SYS_gettid) == calling_thread;
    count(1);
    if (coll->on_calling_thread) {
      count(2);
    }
    *handle = coll;
  } else if (descr->type == EVENT_KERNEL_CHANNEL) {
    struct channel_slot* ch = &channel_slots[__atomic_fetch_add(&next_channel, 1, __ATOMIC_RELAXED) % CHANNEL_SLOTS];
    ch->type = EVENT_KERNEL_CHANNEL;
    ch->coll = (struct coll_slot*)descr->parent;
    ch->start = descr->kernel_channel.gpu_timer;
    ch->stop = 0;
    count(3);
    if (ch->coll == NULL || ch->coll->type != EVENT_COLL) {
      ch->coll = NULL;
      count(5);
    } else {
      /* One proxy thread reports a communicator's channels, so first/last need no compare-and-swap. */
      __atomic_add_fetch(&ch->coll->channels_started, 1, __ATOMIC_RELAXED);
      if (ch->start < ch->coll->first_start) {
        ch->coll->first_start = ch->start;
      }
    }
    *handle = ch;
  }
  return 0;
}

static nccl_result_t plugin_record_event_state(void* handle, int state, union event_state_args_v4* args) {
  if (handle != NULL && args != NULL && *(int*)handle == EVENT_KERNEL_CHANNEL && state == STATE_KERNEL_CHANNEL_STOP) {
    struct channel_slot* ch = handle;
    ch->stop = args->kernel_channel.gpu_timer;
    stop_lags_ns[__atomic_fetch_add(&next_lag, 1, __ATOMIC_RELAXED) % LAG_SLOTS] = wall_ns() - (int64_t)ch->stop;
  }
  return 0;
}

static nccl_result_t plugin_stop_event(void* handle) {
  if (handle != NULL && *(int*)handle == EVENT_KERNEL_CHANNEL) {
    struct channel_slot* ch = handle;
    count(4);
    if (ch->coll != NULL) {
      if (ch->stop > ch->coll->last_stop) {
        ch->coll->last_stop = ch->stop;
      }
      __atomic_add_fetch(&ch->coll->channels_stopped, 1, __ATOMIC_RELAXED);
    }
  }
  return 0;
}

static nccl_result_t plugin_finalize(void* context) {
  (void)context;
  return 0;
}

struct profiler_v4 {
  const char* name;
  void* init;
  void* start_event;
  void* stop_event;
  void* record_event_state;
  void* finalize;
};

__attribute__((visibility("default"))) struct profiler_v4 ncclProfiler_v4 = {
    "frnccl-bench-timestamps", plugin_init, plugin_start_event, plugin_stop_event, plugin_record_event_state,
    plugin_finalize};

/* The benchmark's side, through ctypes. */
__attribute__((visibility("default"))) int bench_set_event_mask(int mask) {
  if (nccl_event_mask == NULL) {
    return -1; /* NCCL has not initialized the plugin */
  }
  __atomic_store_n(nccl_event_mask, mask, __ATOMIC_SEQ_CST);
  return 0;
}

__attribute__((visibility("default"))) void bench_set_calling_thread(int tid) {
  calling_thread = tid;
}

__attribute__((visibility("default"))) void bench_counts(int64_t* out) {
  for (int i = 0; i < 6; ++i) {
    out[i] = __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
  }
}

/* The newest `n` collectives whose channels all stopped: GPU duration (ns) and channel count. */
__attribute__((visibility("default"))) int bench_newest_collectives(int64_t* duration_ns, int64_t* channels, int n) {
  int found = 0;
  const uint64_t end = __atomic_load_n(&next_coll, __ATOMIC_RELAXED);
  for (uint64_t i = end; i > 0 && found < n && end - i < COLL_SLOTS; --i) {
    const struct coll_slot* coll = &coll_slots[(i - 1) % COLL_SLOTS];
    if (coll->channels_started > 0 && coll->channels_stopped == coll->channels_started &&
        coll->last_stop > coll->first_start) {
      duration_ns[found] = (int64_t)(coll->last_stop - coll->first_start);
      channels[found] = coll->channels_started;
      ++found;
    }
  }
  return found;
}

/* The newest `n` figures of host wall clock at a channel's stop callback minus that channel's GPU stop. */
__attribute__((visibility("default"))) int bench_newest_stop_lags(int64_t* out, int n) {
  int found = 0;
  const uint64_t end = __atomic_load_n(&next_lag, __ATOMIC_RELAXED);
  for (uint64_t i = end; i > 0 && found < n && end - i < LAG_SLOTS; --i) {
    out[found++] = stop_lags_ns[(i - 1) % LAG_SLOTS];
  }
  return found;
}
