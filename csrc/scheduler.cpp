// How items are spread over threads:
// * openmp: torch's OpenMP team, entered through the runtime's GOMP_parallel entry point (libgomp
//   and LLVM's libomp both export it). The extension is linked against the runtime libtorch loaded
//   (setup.py finds it), whatever compiler built it: one thread team, never a second OpenMP
//   runtime beside torch's, and no compiler OpenMP support needed (clang, macOS). Right after a
//   torch op its workers are still spinning and start at once, but the region ends with a barrier
//   that waits for every worker: when other processes keep the cores busy, a worker that is not
//   running costs a scheduler time slice.
// * pool: helper tasks on ATen's inter-op pool; the caller works through the items itself and
//   waits only for items a helper has already claimed, so a helper the OS runs late costs nothing.
//   Waking the helper costs more than reusing a spinning OpenMP worker.
// * auto (default): openmp, until a region's barrier waits more than kBarrierAlarmNs after the
//   work ran out (a sign that a worker was not scheduled); then pool for kPoolHoldNs before trying
//   openmp again.
// bench/bench_cpp.py measures them (--scheduler); SPECDEC_CPU_SCHEDULER=openmp|pool|auto.
#include "scheduler.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#if defined(SPECDEC_OPENMP_RUNTIME)
extern "C" void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
#endif

namespace specdec {
namespace {

constexpr int64_t kSerialElements = 1 << 16;  // below this much work a parallel region costs more than it saves
constexpr int64_t kBarrierAlarmNs = 1000000;  // 1 ms: far above an item's duration (microseconds)
constexpr int64_t kPoolHoldNs = 1000000000;   // 1 s

enum class Scheduler { kAuto, kPool, kOpenMP };

Scheduler parse_scheduler(const std::string& name, bool* ok) {
  *ok = true;
  if (name == "auto") return Scheduler::kAuto;
  if (name == "pool") return Scheduler::kPool;
  if (name == "openmp") return Scheduler::kOpenMP;
  *ok = false;
  return Scheduler::kAuto;
}

int default_scheduler() {
  const char* env = std::getenv("SPECDEC_CPU_SCHEDULER");
  bool ok = false;
  const Scheduler chosen = env != nullptr ? parse_scheduler(env, &ok) : Scheduler::kAuto;
  return static_cast<int>(ok ? chosen : Scheduler::kAuto);
}

std::atomic<int> g_scheduler{default_scheduler()};
std::atomic<int64_t> g_pool_until_ns{0};  // auto: use the pool until this steady-clock time

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The items of one pass and how far they got. Every index in [0, count) is claimed by exactly one
// thread, and every claimed index is counted in `finished` once its item returned or threw (or
// was skipped after a failure), so `finished == count` means no item is running any more.
struct Work {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> finished{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  int64_t count = 0;
  const std::function<void(int64_t)>* fn = nullptr;  // read only for claimed items, all done before run_items returns

  void drain() {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < count; i = next.fetch_add(1, std::memory_order_relaxed)) {
      if (!failed.load(std::memory_order_relaxed)) {
        try {
          (*fn)(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
          failed.store(true, std::memory_order_relaxed);
        }
      }
      finished.fetch_add(1, std::memory_order_release);
    }
  }

  void rethrow() {
    if (error) std::rethrow_exception(error);
  }
};

#if defined(SPECDEC_OPENMP_RUNTIME)
struct OpenMPRegion {
  Work* work;
  std::atomic<int64_t> ran_out_ns{0};  // when a thread first found no item left
};

void openmp_body(void* data) {
  auto* region = static_cast<OpenMPRegion*>(data);
  region->work->drain();  // never throws
  int64_t expected = 0;
  region->ran_out_ns.compare_exchange_strong(expected, now_ns(), std::memory_order_relaxed);
}
#endif

void run_serial(int64_t count, const std::function<void(int64_t)>& fn) {
  for (int64_t i = 0; i < count; ++i) fn(i);
}

}  // namespace

bool openmp_linked() {
#if defined(SPECDEC_OPENMP_RUNTIME)
  return true;
#else
  return false;
#endif
}

bool set_scheduler(const std::string& name) {
  bool ok = false;
  const Scheduler chosen = parse_scheduler(name, &ok);
  if (ok) {
    g_scheduler.store(static_cast<int>(chosen));
    g_pool_until_ns.store(0);
  }
  return ok;
}

std::string scheduler() {
  switch (static_cast<Scheduler>(g_scheduler.load())) {
    case Scheduler::kPool: return "pool";
    case Scheduler::kOpenMP: return "openmp";
    default: return "auto";
  }
}

void run_items(int64_t count, int64_t elements, const std::function<void(int64_t)>& fn) {
  if (count <= 0) return;
  at::internal::lazy_init_num_threads();  // torch's thread count, also on a thread that never ran a torch op
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  if (elements < kSerialElements || threads <= 1 || at::in_parallel_region()) {
    run_serial(count, fn);
    return;
  }
  const Scheduler mode = static_cast<Scheduler>(g_scheduler.load(std::memory_order_relaxed));
  const bool use_pool = !openmp_linked() || mode == Scheduler::kPool || (mode == Scheduler::kAuto && now_ns() < g_pool_until_ns.load(std::memory_order_relaxed));
#if defined(SPECDEC_OPENMP_RUNTIME)
  if (!use_pool) {
    Work work;
    work.count = count;
    work.fn = &fn;
    OpenMPRegion region;
    region.work = &work;
    // 0 threads: the team torch configured (as at::parallel_for, which passes no num_threads).
    GOMP_parallel(&openmp_body, &region, 0, 0);
    if (mode == Scheduler::kAuto) {
      const int64_t end = now_ns();
      if (end - region.ran_out_ns.load(std::memory_order_relaxed) > kBarrierAlarmNs) g_pool_until_ns.store(end + kPoolHoldNs, std::memory_order_relaxed);
    }
    work.rethrow();
    return;
  }
#endif
  // The state lives in a shared_ptr so a helper that starts after this call returned still finds
  // it; such a helper finds every index claimed and touches nothing else (fn lives on our stack).
  auto work = std::make_shared<Work>();
  work->count = count;
  work->fn = &fn;
  const int64_t helpers = std::min<int64_t>(threads - 1, static_cast<int64_t>(at::get_num_interop_threads()));
  for (int64_t h = 0; h < helpers; ++h) at::launch([work] { work->drain(); });
  work->drain();
  // Every index is claimed; wait for the items helpers are still computing (a few microseconds each).
  while (work->finished.load(std::memory_order_acquire) < count) std::this_thread::yield();
  work->rethrow();
}

// ---------------------------------------------------------------------------------------------

namespace {
std::atomic<int64_t> g_selftest_running{0};
std::atomic<int64_t> g_selftest_started{0};
}  // namespace

int64_t scheduler_selftest_started() { return g_selftest_started.load(); }

int64_t scheduler_selftest(const std::string& scheduler_name, int64_t count, int64_t item_us, const std::string& throw_on) {
  bool ok = false;
  parse_scheduler(scheduler_name, &ok);
  if (!ok || (throw_on != "caller" && throw_on != "helper" && throw_on != "none")) throw std::invalid_argument("scheduler_selftest: bad arguments");
  const std::string previous = scheduler();
  set_scheduler(scheduler_name);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> helper_ran{false};
  std::atomic<bool> thrown{false};
  std::exception_ptr error;
  try {
    run_items(count, int64_t{1} << 30, [&](int64_t i) {
      g_selftest_started.fetch_add(1);
      g_selftest_running.fetch_add(1);
      struct Leave {
        ~Leave() { g_selftest_running.fetch_sub(1); }
      } leave;
      const bool on_caller = std::this_thread::get_id() == caller;
      if (!on_caller) helper_ran.store(true);
      // The caller's first item waits (up to 5 s) for a helper to take an item, so both throw
      // cases really run on two threads even on a busy machine.
      if (on_caller && i == 0) {
        const int64_t deadline = now_ns() + 5000000000LL;
        while (!helper_ran.load() && now_ns() < deadline) std::this_thread::yield();
      }
      const int64_t until = now_ns() + item_us * 1000;
      while (now_ns() < until) {
      }
      const bool want_throw = (throw_on == "caller" && on_caller && i > 0) || (throw_on == "helper" && !on_caller);
      if (want_throw && !thrown.exchange(true)) throw std::runtime_error("injected failure");
    });
  } catch (...) {
    error = std::current_exception();
  }
  const int64_t still_running = g_selftest_running.load();
  set_scheduler(previous);
  if (error) {
    if (still_running != 0) throw std::runtime_error("scheduler_selftest: items still running after the failure propagated");
    std::rethrow_exception(error);
  }
  return still_running;
}

}  // namespace specdec
