/// \file sched.h
/// \brief The CPU emulator's core: blocks of fibers, warp-collective and barrier rendezvous,
/// schedules (seeds), error reporting, and the grid launcher.
///
/// Model: every CUDA thread of a block is a fiber; the block's fibers run cooperatively on one
/// host thread until each exits. A fiber runs until it reaches a primitive that needs other
/// threads (warp collective, barrier, `__activemask`) or a seeded preemption point. Blocks are
/// distributed over a small pool of host threads; a block never migrates between host threads,
/// which is what makes `__shared__` (`thread_local`) storage per block.
#pragma once

#include <kernkit/emu/context.h>

#include <cxxabi.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

/// \brief Marks the runtime's functions that are defined out of line, in `sched_impl.h`: in the
/// shared helper object the emu backend links (kernkit/jit/prebuilt.py), or in a unit compiled
/// without one (host_helper.h includes `sched_impl.h` there). Hidden: each library binds its own copy.
#define KERNKIT_EMU_RUNTIME __attribute__((visibility("hidden")))

namespace kernkit {
namespace emu {

/// \brief Launch configuration of one emulated kernel launch.
struct LaunchConfig {
  dim3 grid;    ///< grid dimensions
  dim3 block;   ///< block dimensions
  size_t smem;  ///< dynamic shared memory bytes per block
  /// \brief Schedule seed: -1 (default) reads `KERNKIT_EMU_SEED` (unset: 0); 0 is the natural
  /// order; any other value a pseudo-random interleaving of the block's threads.
  int64_t seed = -1;
};

namespace detail {

/// \brief Collective kinds. The value also identifies the call in mismatch reports.
enum class Op : uint8_t {
  kShflIdx,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
  kSyncWarp,
  kMatchAny,
  kMatchAll,
  kReduceAddU,
  kReduceMinU,
  kReduceMaxU,
  kReduceMinS,
  kReduceMaxS,
  kReduceAnd,
  kReduceOr,
  kReduceXor,
  kActiveMask,
  kSyncThreads,
};

/// \brief The CUDA spelling of an `Op`, for messages.
KERNKIT_EMU_RUNTIME const char* op_name(Op op);

/// \brief A call site of a primitive: which primitive, and where in the source.
struct Site {
  Op op = Op::kSyncWarp;
  const char* file = "";
  int line = 0;
  int column = 0;
  bool operator==(const Site& o) const {
    return op == o.op && line == o.line && column == o.column && (file == o.file || std::strcmp(file, o.file) == 0);
  }
  bool operator!=(const Site& o) const { return !(*this == o); }
};

/// \brief A call site as messages print it: the primitive, then `file:line`.
KERNKIT_EMU_RUNTIME std::ostream& operator<<(std::ostream& os, const Site& s);

/// \brief Fiber states.
enum class State : uint8_t { kFresh, kReady, kRunning, kWaitWarp, kWaitBlock, kWaitActive, kExited };

/// \brief One simulated CUDA thread.
struct Fiber {
  Context ctx;
  Stack stack;
  uint3 tid;
  uint32_t linear = 0;
  State state = State::kFresh;
  // Pending collective.
  Site site;
  uint32_t mask = 0;
  uint64_t value = 0;
  int32_t b = 0;  ///< shuffle lane/offset
  int32_t c = 0;  ///< shuffle clamp/segment word
  uint64_t result = 0;
#if defined(KERNKIT_EMU_ASAN)
  void* fake_stack = nullptr;
#endif
};

/// \brief Per-warp bookkeeping: bit i is lane i.
struct WarpState {
  uint32_t exited = 0;       ///< exited, or lane beyond the block's last thread
  uint32_t missing = 0;      ///< lanes that do not exist (partial last warp)
  uint32_t wait_warp = 0;    ///< waiting at a warp collective
  uint32_t wait_block = 0;   ///< waiting at __syncthreads
  uint32_t wait_active = 0;  ///< waiting at __activemask
};

/// \brief Type-erased kernel invocation.
struct KernelThunk {
  void (*invoke)(const void* kernel, void* params) = nullptr;
  const void* kernel = nullptr;
  void* params = nullptr;
  const char* signature = "";
};

/// \brief Shared state of one launch (all host threads).
struct LaunchState {
  KernelThunk thunk;
  dim3 grid, block;
  size_t smem = 0;
  uint64_t seed = 0;
  uint32_t nthreads = 0;
  uint64_t nblocks = 0;
  size_t stack_size = 0;
  std::atomic<uint64_t> next_block{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
};

/// \brief splitmix64: the schedule's pseudo-random source (per block, from seed and block id).
struct Rng {
  uint64_t s = 0;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

/// \brief Everything one host thread needs to run blocks.
struct Worker {
  StackPool stacks;
  Context sched;
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  std::vector<uint32_t> ready;
  size_t ready_head = 0;
  Fiber* cur = nullptr;
  LaunchState* launch = nullptr;
  uint3 block_idx{0, 0, 0};
  uint32_t alive = 0;
  uint32_t bar_count = 0;
  int32_t bar_acc_count = 0;
  bool bar_acc_and = true;
  bool bar_acc_or = false;
  Site bar_site;
  uint32_t bar_first = 0;
  bool failed = false;
  std::exception_ptr error;
  Rng rng;
  bool random = false;
  std::vector<unsigned char> dyn_smem_storage;
  unsigned char* dyn_smem = nullptr;
#if defined(KERNKIT_EMU_ASAN)
  const void* sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
  void* sched_fake_stack = nullptr;
#endif
};

inline thread_local Worker* tl_worker = nullptr;

}  // namespace detail
}  // namespace emu
}  // namespace kernkit

/// \brief Built-in variables. They are host-thread-local objects updated by the scheduler before
/// it resumes a fiber (threadIdx) or starts a block (the others), not macros, so that struct
/// fields with the same names (`cudaLaunchConfig_t::gridDim`) keep working.
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};
inline constexpr int warpSize = 32;

namespace kernkit {
namespace emu {
namespace detail {

/// \brief Readable name of the running kernel: its symbol (demangled) when `dladdr` finds one,
/// else its signature.
KERNKIT_EMU_RUNTIME std::string kernel_name(const KernelThunk& t);

/// \brief A fiber as messages name it: its thread index, warp and lane.
KERNKIT_EMU_RUNTIME std::string fiber_name(const Fiber& f);

/// \brief Throw the emulator's error for the running fiber: kernel, block, thread, then `what`.
[[noreturn]] KERNKIT_EMU_RUNTIME void fail(const std::string& what);

inline void push_ready(Worker& w, uint32_t idx) {
  w.fibers[idx].state = State::kReady;
  w.ready.push_back(idx);
}

/// \brief Suspend the running fiber and return to the scheduler; returns when resumed.
inline void suspend(Worker& w) {
  Fiber& f = *w.cur;
#if defined(KERNKIT_EMU_ASAN)
  __sanitizer_start_switch_fiber(&f.fake_stack, w.sched_stack_bottom, w.sched_stack_size);
  Context::swap(f.ctx, w.sched);
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#else
  Context::swap(f.ctx, w.sched);
#endif
}

/// \brief Seeded preemption point: under a nonzero seed, sometimes let another thread run.
inline void maybe_yield() {
  Worker* w = tl_worker;
  if (w == nullptr || !w->random) return;
  if ((w->rng.next() & 3u) != 0) return;
  push_ready(*w, static_cast<uint32_t>(w->cur - w->fibers.data()));
  suspend(*w);
}

inline WarpState& warp_of(Worker& w, const Fiber& f) { return w.warps[f.linear / 32]; }
inline Fiber& lane_fiber(Worker& w, uint32_t warp, uint32_t lane) { return w.fibers[warp * 32 + lane]; }

/// \brief Why lane `lane` of warp `warp` cannot join a collective: it does not exist, or exited.
KERNKIT_EMU_RUNTIME std::string lane_absent(const Worker& w, uint32_t warp, uint32_t lane);

/// \brief Resolve `__activemask` when no lane of the warp can make progress on its own.
KERNKIT_EMU_RUNTIME void try_resolve_active(Worker& w, uint32_t warp);

/// \brief Release every thread waiting at `__syncthreads` (the caller, if it waits, continues).
KERNKIT_EMU_RUNTIME void release_barrier(Worker& w);

/// \brief Bookkeeping when the running fiber's kernel body returns; may report an error.
KERNKIT_EMU_RUNTIME void on_exit(Worker& w);

/// \brief Compute the result of a completed warp collective for lane `i` of group `mask`.
KERNKIT_EMU_RUNTIME uint64_t collective_result(Worker& w, uint32_t warp, uint32_t i, uint32_t mask);

/// \brief Rendezvous of the lanes named in `mask` at one warp-collective call site.
///
/// Every lane named in `mask` must reach the same call site with the same mask. An exited lane,
/// a lane that does not exist, or a lane waiting for the caller at a different call site (or at
/// `__syncthreads`) is an error naming that lane and both source locations.
/// \return This lane's result.
KERNKIT_EMU_RUNTIME uint64_t warp_collective(const Site& site, uint32_t mask, uint64_t value, int32_t b, int32_t c);

/// \brief `__syncthreads` and its count/and/or variants. Waits for every non-exited thread of
/// the block; all of them must wait at the same call site.
/// \param kind 0: count, 1: and, 2: or.
KERNKIT_EMU_RUNTIME int32_t block_barrier(const Site& site, int32_t pred, int kind);

/// \brief `__activemask`: the lanes of the warp that reach the same call site while no other
/// lane of the warp can still get there (they exited or wait elsewhere).
KERNKIT_EMU_RUNTIME uint32_t active_mask(const Site& site);

/// \brief Body of every fiber: run the kernel, capture any exception, report the exit.
KERNKIT_EMU_RUNTIME void fiber_main(void* arg);

/// \brief The message of a block whose threads all wait: where the first eight wait.
KERNKIT_EMU_RUNTIME std::string deadlock_report(Worker& w);

/// \brief Run one block to completion on the calling host thread.
KERNKIT_EMU_RUNTIME void run_block(Worker& w, LaunchState& L, uint64_t b);

/// \brief A fixed pool of host threads that run the blocks of one launch at a time.
class HostPool {
 public:
  /// \brief Run `fn` on `n` host threads (the caller is one of them) and wait for all.
  void run(unsigned n, const std::function<void()>& fn) {
    std::unique_lock<std::mutex> lk(m_);
    while (threads_.size() + 1 < n) threads_.emplace_back([this] { loop(); });
    job_ = &fn;
    pending_ = n - 1;
    want_ = n - 1;
    ++gen_;
    cv_.notify_all();
    lk.unlock();
    fn();
    lk.lock();
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return gen_ != seen && want_ > 0; });
      seen = gen_;
      --want_;
      const std::function<void()>* job = job_;
      lk.unlock();
      (*job)();
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void()>* job_ = nullptr;
  uint64_t gen_ = 0;
  unsigned pending_ = 0;
  unsigned want_ = 0;
};

/// \brief The process-wide pool and the lock that serializes launches (both leaked on purpose:
/// the pool's threads are detached at exit).
///
/// A `fork()`ed child (a DataLoader worker, a multiprocessing pool) inherits neither the pool's
/// threads nor a consistent state of its mutexes, so the child starts from a new pool and a new
/// lock: the old ones are abandoned, not destroyed, since destroying a `std::thread` that was
/// never joined terminates the process.
struct HostState {
  HostPool* pool = new HostPool();
  std::mutex* launch = new std::mutex();
};

inline HostState& host_state() {
  static HostState* state = [] {
    auto* s = new HostState();
    pthread_atfork(nullptr, nullptr, [] { host_state() = HostState(); });
    return s;
  }();
  return *state;
}

inline HostPool& host_pool() { return *host_state().pool; }

inline std::mutex& launch_mutex() { return *host_state().launch; }

/// \brief Seed set by `ScheduleGuard` for launches from this host thread; -1 when none.
inline thread_local int64_t tl_seed_override = -1;

/// \brief Environment variable `name` as an unsigned integer (any base `strtoull` reads), else `dflt`.
KERNKIT_EMU_RUNTIME uint64_t env_u64(const char* name, uint64_t dflt);

inline Worker& this_worker() {
  static thread_local std::unique_ptr<Worker> w;
  if (!w) w.reset(new Worker());
  return *w;
}

/// \brief Validate the launch, then run every block; rethrow the first error.
KERNKIT_EMU_RUNTIME void launch_impl(const LaunchConfig& cfg, const KernelThunk& thunk);

template <class Tuple, class... P>
void invoke_kernel(const void* kernel, void* params) {
  auto fn = reinterpret_cast<void (*)(P...)>(const_cast<void*>(kernel));
  std::apply(fn, *static_cast<Tuple*>(params));
}

template <class... P>
const char* signature() {
  static const std::string s = [] {
    std::string out;
    const char* names[] = {typeid(P).name()..., ""};
    for (size_t i = 0; i < sizeof...(P); ++i) {
      int status = 0;
      char* d = abi::__cxa_demangle(names[i], nullptr, nullptr, &status);
      if (i) out += ", ";
      out += (status == 0 && d) ? d : names[i];
      std::free(d);
    }
    return out;
  }();
  return s.c_str();
}

}  // namespace detail

/// \brief Run `kernel` over the grid on the CPU.
///
/// Blocks run in any order over a pool of host threads (`KERNKIT_EMU_THREADS`, default the
/// number of cores); the threads of one block run as fibers of one host thread, interleaved by
/// the schedule that `cfg.seed`, a `ScheduleGuard` or `KERNKIT_EMU_SEED` selects.
/// \tparam P The kernel's parameter types.
/// \param cfg Grid, block, dynamic shared memory and schedule seed.
/// \param kernel The `__global__` function.
/// \param args Its arguments (converted to `P...`, copied once, then copied into every thread).
/// \throws kernkit::host::PanicError on an invalid configuration or any error found while the
/// kernel ran (divergent collective, deadlock, trap, an exception in the kernel).
template <class... P, class... A>
void launch(const LaunchConfig& cfg, void (*kernel)(P...), A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernkit::emu::launch: wrong number of kernel arguments");
  using Tuple = std::tuple<std::decay_t<P>...>;
  Tuple params(static_cast<P>(std::forward<A>(args))...);
  detail::KernelThunk thunk;
  thunk.invoke = &detail::invoke_kernel<Tuple, P...>;
  thunk.kernel = reinterpret_cast<const void*>(kernel);
  thunk.params = &params;
  thunk.signature = detail::signature<P...>();
  detail::launch_impl(cfg, thunk);
}

/// \brief Within its lifetime, launches from the current host thread use `seed` (unless their
/// `LaunchConfig::seed` is set), overriding `KERNKIT_EMU_SEED`.
class ScheduleGuard {
 public:
  /// \param seed 0 for the natural schedule, anything else for a pseudo-random one.
  explicit ScheduleGuard(int64_t seed) : prev_(detail::tl_seed_override) { detail::tl_seed_override = seed; }
  ScheduleGuard(const ScheduleGuard&) = delete;
  ScheduleGuard& operator=(const ScheduleGuard&) = delete;
  ~ScheduleGuard() { detail::tl_seed_override = prev_; }

 private:
  int64_t prev_;
};

/// \brief Base address of the running block's dynamic shared memory (`LaunchConfig::smem` bytes).
inline void* dynamic_smem() { return detail::tl_worker->dyn_smem; }

}  // namespace emu
}  // namespace kernkit
