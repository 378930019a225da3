// Runs the items of one parallel pass on torch's threads. Every way of running them gives the same
// results (each item writes only its own slot; items are claimed from a shared counter); they differ
// in how they wait (see scheduler.cpp). Exception-safe: an item that throws (on any thread) stops
// the others from claiming new items, run_items waits until no item is running, then rethrows it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace specdec {

// fn(i) for i in [0, count); `elements` sizes the work (small work runs on the calling thread).
void run_items(int64_t count, int64_t elements, const std::function<void(int64_t)>& fn);

// 'auto' (default), 'openmp' or 'pool'; false for an unknown name. SPECDEC_CPU_SCHEDULER sets the default.
bool set_scheduler(const std::string& name);
std::string scheduler();

// Whether the extension is linked against the OpenMP runtime torch uses (else 'openmp' runs the pool).
bool openmp_linked();

// Test hook: runs `count` items of about `item_us` microseconds each with the named scheduler on at
// least two threads; an item throws std::runtime_error("injected failure") on the calling thread
// (throw_on = "caller") or on another thread (throw_on = "helper"). Returns the number of items
// still running when run_items returned (always 0: nothing may outlive the call).
int64_t scheduler_selftest(const std::string& scheduler_name, int64_t count, int64_t item_us, const std::string& throw_on);
// Items of scheduler_selftest started so far (a late start after the call returned would show here).
int64_t scheduler_selftest_started();

}  // namespace specdec
