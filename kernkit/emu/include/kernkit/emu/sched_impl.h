/// \file sched_impl.h
/// \brief The definitions of the emulator's runtime functions that sched.h declares
/// `KERNKIT_EMU_RUNTIME`: the launch, the block scheduler, the warp collectives and barriers,
/// and the error reports. The same code in every emulator specialization (about half of an
/// emulator unit's code), so it is compiled once, into the shared helper object the emu backend
/// links, or into a unit compiled without one: host_helper.h includes this header where
/// `KERNKIT_HOST_DEFINE_HELPERS` is 1 in an emulator build. One translation unit of a library
/// includes it.
#pragma once

#include <kernkit/emu/sched.h>

#include <tvm/ffi/error.h>

#include <dlfcn.h>

#include <algorithm>
#include <sstream>

namespace kernkit {
namespace emu {
namespace detail {

const char* op_name(Op op) {
  switch (op) {
    case Op::kShflIdx: return "__shfl_sync";
    case Op::kShflUp: return "__shfl_up_sync";
    case Op::kShflDown: return "__shfl_down_sync";
    case Op::kShflXor: return "__shfl_xor_sync";
    case Op::kBallot: return "__ballot_sync";
    case Op::kAny: return "__any_sync";
    case Op::kAll: return "__all_sync";
    case Op::kSyncWarp: return "__syncwarp";
    case Op::kMatchAny: return "__match_any_sync";
    case Op::kMatchAll: return "__match_all_sync";
    case Op::kReduceAddU: return "__reduce_add_sync";
    case Op::kReduceMinU:
    case Op::kReduceMinS: return "__reduce_min_sync";
    case Op::kReduceMaxU:
    case Op::kReduceMaxS: return "__reduce_max_sync";
    case Op::kReduceAnd: return "__reduce_and_sync";
    case Op::kReduceOr: return "__reduce_or_sync";
    case Op::kReduceXor: return "__reduce_xor_sync";
    case Op::kActiveMask: return "__activemask";
    case Op::kSyncThreads: return "__syncthreads";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, const Site& s) {
  return os << op_name(s.op) << " at " << s.file << ":" << s.line;
}

std::string kernel_name(const KernelThunk& t) {
  Dl_info info{};
  if (dladdr(t.kernel, &info) != 0 && info.dli_sname != nullptr && info.dli_saddr == t.kernel) {
    int status = 0;
    char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string s = (status == 0 && d != nullptr) ? std::string(d) : std::string(info.dli_sname);
    std::free(d);
    return s;
  }
  return std::string("kernel with parameters (") + t.signature + ")";
}

std::string fiber_name(const Fiber& f) {
  std::ostringstream os;
  os << "thread (" << f.tid.x << "," << f.tid.y << "," << f.tid.z << ") [warp " << (f.linear / 32) << " lane "
     << (f.linear % 32) << "]";
  return os.str();
}

[[noreturn]] void fail(const std::string& what) {
  Worker& w = *tl_worker;
  std::ostringstream os;
  os << "kernkit emu: " << kernel_name(w.launch->thunk) << ": block (" << w.block_idx.x << "," << w.block_idx.y << ","
     << w.block_idx.z << "), " << fiber_name(*w.cur) << ": " << what;
  TVM_FFI_THROW(RuntimeError) << os.str();
  TVM_FFI_UNREACHABLE();
}

std::string lane_absent(const Worker& w, uint32_t warp, uint32_t lane) {
  std::ostringstream os;
  if (w.warps[warp].missing & (1u << lane)) {
    os << "lane " << lane << " does not exist (the block has " << w.launch->nthreads << " threads)";
  } else {
    const Fiber& g = w.fibers[warp * 32 + lane];
    os << "lane " << lane << " (" << fiber_name(g) << ") exited without reaching it";
  }
  return os.str();
}

void try_resolve_active(Worker& w, uint32_t warp) {
  WarpState& ws = w.warps[warp];
  if (ws.wait_active == 0) return;
  if ((ws.exited | ws.wait_warp | ws.wait_block | ws.wait_active) != 0xffffffffu) return;
  uint32_t left = ws.wait_active;
  while (left) {
    const uint32_t lead = static_cast<uint32_t>(__builtin_ctz(left));
    const Site site = lane_fiber(w, warp, lead).site;
    uint32_t group = 0;
    for (uint32_t m = left; m; m &= m - 1) {
      const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
      if (lane_fiber(w, warp, l).site == site) group |= 1u << l;
    }
    for (uint32_t m = group; m; m &= m - 1) {
      const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
      Fiber& g = lane_fiber(w, warp, l);
      g.result = group;
      if (&g != w.cur) push_ready(w, warp * 32 + l);
    }
    left &= ~group;
  }
  ws.wait_active = 0;
}

void release_barrier(Worker& w) {
  for (uint32_t wi = 0; wi < w.warps.size(); ++wi) {
    WarpState& ws = w.warps[wi];
    for (uint32_t m = ws.wait_block; m; m &= m - 1) {
      const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
      Fiber& g = lane_fiber(w, wi, l);
      if (g.value == 0) g.result = static_cast<uint64_t>(static_cast<uint32_t>(w.bar_acc_count));
      else if (g.value == 1) g.result = w.bar_acc_and ? 1 : 0;
      else g.result = w.bar_acc_or ? 1 : 0;
      if (&g != w.cur) push_ready(w, wi * 32 + l);
    }
    ws.wait_block = 0;
  }
  w.bar_count = 0;
  w.bar_acc_count = 0;
  w.bar_acc_and = true;
  w.bar_acc_or = false;
}

void on_exit(Worker& w) {
  Fiber& f = *w.cur;
  const uint32_t warp = f.linear / 32, lane = f.linear % 32, bit = 1u << lane;
  WarpState& ws = w.warps[warp];
  ws.exited |= bit;
  f.state = State::kExited;
  --w.alive;
  for (uint32_t m = ws.wait_warp; m; m &= m - 1) {
    const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
    const Fiber& g = lane_fiber(w, warp, l);
    if (g.mask & bit) {
      std::ostringstream os;
      os << "lane " << lane << " exited without reaching " << g.site << " (mask 0x" << std::hex << g.mask << std::dec
         << ") where lane " << l << " waits for it (divergent warp)";
      fail(os.str());
    }
  }
  if (w.bar_count > 0 && w.bar_count == w.alive) release_barrier(w);
  try_resolve_active(w, warp);
}

uint64_t collective_result(Worker& w, uint32_t warp, uint32_t i, uint32_t mask) {
  const Fiber& f = lane_fiber(w, warp, i);
  switch (f.site.op) {
    case Op::kShflIdx:
    case Op::kShflUp:
    case Op::kShflDown:
    case Op::kShflXor: {
      // PTX shfl.sync: c[4:0] is the clamp value, c[12:8] the segment mask.
      const int32_t lane = static_cast<int32_t>(i);
      const int32_t bval = f.b & 0x1f;
      const int32_t cval = f.c & 0x1f;
      const int32_t segmask = (f.c >> 8) & 0x1f;
      const int32_t max_lane = (lane & segmask) | (cval & ~segmask);
      const int32_t min_lane = lane & segmask;
      int32_t j = lane;
      bool pval = true;
      switch (f.site.op) {
        case Op::kShflUp: j = lane - bval; pval = (j >= max_lane); break;
        case Op::kShflDown: j = lane + bval; pval = (j <= max_lane); break;
        case Op::kShflXor: j = lane ^ bval; pval = (j <= max_lane); break;
        default: j = min_lane | (bval & ~segmask); pval = (j <= max_lane); break;
      }
      if (!pval) j = lane;
      // A source lane outside the mask is undefined on the GPU; the emulator returns the
      // caller's own value (documented).
      if (!(mask & (1u << j))) j = lane;
      return lane_fiber(w, warp, static_cast<uint32_t>(j)).value;
    }
    case Op::kBallot:
    case Op::kAny:
    case Op::kAll: {
      uint32_t ballot = 0;
      for (uint32_t m = mask; m; m &= m - 1) {
        const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
        if (lane_fiber(w, warp, l).value != 0) ballot |= 1u << l;
      }
      if (f.site.op == Op::kBallot) return ballot;
      if (f.site.op == Op::kAny) return ballot != 0;
      return ballot == mask;
    }
    case Op::kMatchAny:
    case Op::kMatchAll: {
      uint32_t same = 0;
      for (uint32_t m = mask; m; m &= m - 1) {
        const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
        if (lane_fiber(w, warp, l).value == f.value) same |= 1u << l;
      }
      if (f.site.op == Op::kMatchAny) return same;
      return same == mask ? (uint64_t{1} << 32) | mask : 0;  // bit 32: the predicate
    }
    case Op::kReduceAddU:
    case Op::kReduceMinU:
    case Op::kReduceMaxU:
    case Op::kReduceMinS:
    case Op::kReduceMaxS:
    case Op::kReduceAnd:
    case Op::kReduceOr:
    case Op::kReduceXor: {
      bool first = true;
      uint32_t acc = 0;
      for (uint32_t m = mask; m; m &= m - 1) {
        const uint32_t v = static_cast<uint32_t>(lane_fiber(w, warp, static_cast<uint32_t>(__builtin_ctz(m))).value);
        if (first) { acc = v; first = false; continue; }
        switch (f.site.op) {
          case Op::kReduceAddU: acc += v; break;
          case Op::kReduceMinU: acc = std::min(acc, v); break;
          case Op::kReduceMaxU: acc = std::max(acc, v); break;
          case Op::kReduceMinS: acc = static_cast<uint32_t>(std::min(static_cast<int32_t>(acc), static_cast<int32_t>(v))); break;
          case Op::kReduceMaxS: acc = static_cast<uint32_t>(std::max(static_cast<int32_t>(acc), static_cast<int32_t>(v))); break;
          case Op::kReduceAnd: acc &= v; break;
          case Op::kReduceOr: acc |= v; break;
          default: acc ^= v; break;
        }
      }
      return acc;
    }
    default: return 0;
  }
}

uint64_t warp_collective(const Site& site, uint32_t mask, uint64_t value, int32_t b, int32_t c) {
  Worker& w = *tl_worker;
  maybe_yield();
  Fiber& f = *w.cur;
  const uint32_t warp = f.linear / 32, lane = f.linear % 32, bit = 1u << lane;
  WarpState& ws = w.warps[warp];
  if (!(mask & bit)) {
    std::ostringstream err;
    err << site << ": the calling lane " << lane << " is not in mask 0x" << std::hex << mask;
    fail(err.str());
  }
  if (mask & ws.exited) {
    std::ostringstream err;
    err << site << " with mask 0x" << std::hex << mask << std::dec << ": "
        << lane_absent(w, warp, static_cast<uint32_t>(__builtin_ctz(mask & ws.exited)));
    fail(err.str());
  }
  if (mask & ws.wait_block) {
    const uint32_t l = static_cast<uint32_t>(__builtin_ctz(mask & ws.wait_block));
    std::ostringstream err;
    err << site << " with mask 0x" << std::hex << mask << std::dec << ": lane " << l << " ("
        << fiber_name(lane_fiber(w, warp, l)) << ") is waiting at " << lane_fiber(w, warp, l).site
        << " instead (divergent warp)";
    fail(err.str());
  }
  uint32_t group = bit;
  for (uint32_t m = ws.wait_warp; m; m &= m - 1) {
    const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
    const Fiber& g = lane_fiber(w, warp, l);
    const bool same = g.site == site && g.mask == mask;
    if (same) {
      group |= 1u << l;
    } else if (g.mask & bit) {
      std::ostringstream err;
      err << site << " with mask 0x" << std::hex << mask << std::dec << ": lane " << l << " ("
          << fiber_name(g) << ") waits for this lane at " << g.site << " with mask 0x" << std::hex << g.mask
          << std::dec << " (divergent warp)";
      fail(err.str());
    }
  }
  f.site = site;
  f.mask = mask;
  f.value = value;
  f.b = b;
  f.c = c;
  if (group == mask) {
    for (uint32_t m = mask; m; m &= m - 1) {
      const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
      lane_fiber(w, warp, l).result = collective_result(w, warp, l, mask);
    }
    ws.wait_warp &= ~mask;
    for (uint32_t m = mask & ~bit; m; m &= m - 1) push_ready(w, warp * 32 + static_cast<uint32_t>(__builtin_ctz(m)));
    // Under a seed, sometimes let the released lanes run before this one.
    maybe_yield();
    return f.result;
  }
  ws.wait_warp |= bit;
  f.state = State::kWaitWarp;
  try_resolve_active(w, warp);
  suspend(w);
  return f.result;
}

int32_t block_barrier(const Site& site, int32_t pred, int kind) {
  Worker& w = *tl_worker;
  maybe_yield();
  Fiber& f = *w.cur;
  const uint32_t warp = f.linear / 32, lane = f.linear % 32, bit = 1u << lane;
  WarpState& ws = w.warps[warp];
  for (uint32_t m = ws.wait_warp; m; m &= m - 1) {
    const uint32_t l = static_cast<uint32_t>(__builtin_ctz(m));
    const Fiber& g = lane_fiber(w, warp, l);
    if (g.mask & bit) {
      std::ostringstream err;
      err << site << ": lane " << l << " (" << fiber_name(g) << ") waits for this lane at " << g.site
          << " with mask 0x" << std::hex << g.mask << std::dec << " (divergent warp)";
      fail(err.str());
    }
  }
  if (w.bar_count == 0) {
    w.bar_site = site;
    w.bar_first = f.linear;
  } else if (w.bar_site != site) {
    std::ostringstream err;
    err << site << ": " << fiber_name(w.fibers[w.bar_first]) << " waits at a different barrier, " << w.bar_site
        << " (divergent __syncthreads)";
    fail(err.str());
  }
  f.site = site;
  f.value = static_cast<uint64_t>(kind);
  ++w.bar_count;
  w.bar_acc_count += pred != 0;
  w.bar_acc_and = w.bar_acc_and && pred != 0;
  w.bar_acc_or = w.bar_acc_or || pred != 0;
  ws.wait_block |= bit;
  f.state = State::kWaitBlock;
  if (w.bar_count == w.alive) {
    release_barrier(w);
    f.state = State::kRunning;
    maybe_yield();
    return static_cast<int32_t>(f.result);
  }
  try_resolve_active(w, warp);
  suspend(w);
  return static_cast<int32_t>(f.result);
}

uint32_t active_mask(const Site& site) {
  Worker& w = *tl_worker;
  maybe_yield();
  Fiber& f = *w.cur;
  const uint32_t warp = f.linear / 32, bit = 1u << (f.linear % 32);
  WarpState& ws = w.warps[warp];
  f.site = site;
  ws.wait_active |= bit;
  f.state = State::kWaitActive;
  try_resolve_active(w, warp);
  if (ws.wait_active & bit) suspend(w);
  f.state = State::kRunning;
  return static_cast<uint32_t>(f.result);
}

void fiber_main(void* arg) {
  Worker& w = *static_cast<Worker*>(arg);
#if defined(KERNKIT_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &w.sched_stack_bottom, &w.sched_stack_size);
#endif
  try {
    w.launch->thunk.invoke(w.launch->thunk.kernel, w.launch->thunk.params);
    on_exit(w);
  } catch (...) {
    if (!w.failed) {
      w.failed = true;
      w.error = std::current_exception();
    }
  }
  if (w.cur->state != State::kExited) w.cur->state = State::kExited;
#if defined(KERNKIT_EMU_ASAN)
  // nullptr: this fiber's fake stack can be freed, it never runs again.
  __sanitizer_start_switch_fiber(nullptr, w.sched_stack_bottom, w.sched_stack_size);
#endif
  Context::swap(w.cur->ctx, w.sched);
  std::abort();  // never resumed
}

std::string deadlock_report(Worker& w) {
  std::ostringstream os;
  os << "deadlock: no thread can make progress;";
  int shown = 0;
  for (const Fiber& g : w.fibers) {
    if (g.state == State::kExited || g.state == State::kFresh) continue;
    if (shown++ == 8) {
      os << " ...";
      break;
    }
    os << " " << fiber_name(g) << " waits at " << g.site;
    if (g.state == State::kWaitWarp) os << " (mask 0x" << std::hex << g.mask << std::dec << ")";
    os << ";";
  }
  return os.str();
}

void run_block(Worker& w, LaunchState& L, uint64_t b) {
  const uint32_t n = L.nthreads;
  const uint32_t nwarps = (n + 31) / 32;
  w.launch = &L;
  w.block_idx = uint3{static_cast<unsigned>(b % L.grid.x), static_cast<unsigned>((b / L.grid.x) % L.grid.y),
                      static_cast<unsigned>(b / (static_cast<uint64_t>(L.grid.x) * L.grid.y))};
  blockIdx = w.block_idx;
  blockDim = L.block;
  gridDim = L.grid;
  w.fibers.resize(n);
  w.warps.assign(nwarps, WarpState{});
  for (uint32_t t = 0; t < n; ++t) {
    Fiber& f = w.fibers[t];
    f.state = State::kFresh;
    f.linear = t;
    f.tid = uint3{t % L.block.x, (t / L.block.x) % L.block.y, t / (L.block.x * L.block.y)};
    f.stack = Stack{};
  }
  if (n % 32) w.warps[nwarps - 1].missing = w.warps[nwarps - 1].exited = ~((1u << (n % 32)) - 1u);
  w.ready.clear();
  w.ready_head = 0;
  for (uint32_t t = 0; t < n; ++t) w.ready.push_back(t);
  w.alive = n;
  w.bar_count = 0;
  w.bar_acc_count = 0;
  w.bar_acc_and = true;
  w.bar_acc_or = false;
  w.failed = false;
  w.error = nullptr;
  w.random = L.seed != 0;
  w.rng.s = L.seed * 0xD1B54A32D192ED03ull + b;
  if (L.smem) {
    // Fresh contents per block: a deterministic pattern that depends on the seed, so reading
    // dynamic shared memory before writing it shows up as a seed-dependent result.
    const unsigned char fill = static_cast<unsigned char>(0xA5u ^ (L.seed * 0x3Bu));
    std::memset(w.dyn_smem, fill, L.smem);
  }
  while (!w.failed) {
    uint32_t idx;
    if (w.ready_head == w.ready.size()) break;
    if (w.random) {
      const size_t avail = w.ready.size() - w.ready_head;
      const size_t k = w.ready_head + static_cast<size_t>(w.rng.next() % avail);
      std::swap(w.ready[k], w.ready[w.ready_head]);
    }
    idx = w.ready[w.ready_head++];
    if (w.ready_head > 4096 && w.ready_head * 2 > w.ready.size()) {
      w.ready.erase(w.ready.begin(), w.ready.begin() + static_cast<std::ptrdiff_t>(w.ready_head));
      w.ready_head = 0;
    }
    Fiber& f = w.fibers[idx];
    if (f.stack.base == nullptr) {
      f.stack = w.stacks.acquire(L.stack_size);
      if (f.stack.base == nullptr) {
        w.failed = true;
        w.error = std::make_exception_ptr(
            ::tvm::ffi::Error("RuntimeError", "kernkit emu: out of memory for fiber stacks", ""));
        break;
      }
      f.ctx.init(f.stack, &fiber_main, &w);
    }
    f.state = State::kRunning;
    w.cur = &f;
    threadIdx = f.tid;
#if defined(KERNKIT_EMU_ASAN)
    __sanitizer_start_switch_fiber(&w.sched_fake_stack, f.stack.base, f.stack.size);
    Context::swap(w.sched, f.ctx);
    __sanitizer_finish_switch_fiber(w.sched_fake_stack, nullptr, nullptr);
#else
    Context::swap(w.sched, f.ctx);
#endif
    if (f.state == State::kExited) {
      w.stacks.release(f.stack, false);
      f.stack = Stack{};
    }
  }
  if (!w.failed && w.alive != 0) {
    // Report the deadlock from the point of view of the first waiting thread.
    for (Fiber& g : w.fibers) {
      if (g.state != State::kExited && g.state != State::kFresh) {
        w.cur = &g;
        break;
      }
    }
    try {
      fail(deadlock_report(w));
    } catch (...) {
      w.failed = true;
      w.error = std::current_exception();
    }
  }
  // Stacks of fibers abandoned after an error go back to the pool.
  for (Fiber& g : w.fibers) {
    if (g.stack.base != nullptr) {
      w.stacks.release(g.stack, true);
      g.stack = Stack{};
    }
  }
  w.cur = nullptr;
}

uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return dflt;
  return std::strtoull(s, nullptr, 0);
}

void launch_impl(const LaunchConfig& cfg, const KernelThunk& thunk) {
  const dim3 g = cfg.grid, bl = cfg.block;
  const uint64_t nthreads = static_cast<uint64_t>(bl.x) * bl.y * bl.z;
  const uint64_t nblocks = static_cast<uint64_t>(g.x) * g.y * g.z;
  if (nthreads == 0 || nthreads > 1024 || bl.z > 64) {
    TVM_FFI_THROW(RuntimeError) << "kernkit emu: invalid block (" << bl.x << ", " << bl.y << ", " << bl.z << ") for "
                                << kernel_name(thunk) << ": 1 to 1024 threads, z at most 64";
  }
  if (nblocks == 0 || g.y > 65535 || g.z > 65535 || g.x > 2147483647u) {
    TVM_FFI_THROW(RuntimeError) << "kernkit emu: invalid grid (" << g.x << ", " << g.y << ", " << g.z << ") for "
                                << kernel_name(thunk);
  }
  if (cfg.smem > 232448) {
    TVM_FFI_THROW(RuntimeError) << "kernkit emu: " << cfg.smem << " bytes of dynamic shared memory for "
                                << kernel_name(thunk) << " exceed the virtual device's 232448 (227 KiB) per block";
  }
  std::lock_guard<std::mutex> guard(launch_mutex());
  LaunchState L;
  L.thunk = thunk;
  L.grid = g;
  L.block = bl;
  L.smem = cfg.smem;
  L.nthreads = static_cast<uint32_t>(nthreads);
  L.nblocks = nblocks;
  const int64_t seed = cfg.seed >= 0 ? cfg.seed : tl_seed_override >= 0 ? tl_seed_override
                                                                          : static_cast<int64_t>(env_u64("KERNKIT_EMU_SEED", 0));
#if defined(KERNKIT_EMU_ASAN)
  const uint64_t default_stack_kb = 512;
#else
  const uint64_t default_stack_kb = 64;
#endif
  L.seed = static_cast<uint64_t>(seed);
  L.stack_size = ((env_u64("KERNKIT_EMU_STACK_KB", default_stack_kb) * 1024) + 4095) & ~size_t{4095};
  unsigned hw = std::thread::hardware_concurrency();
  if (hw == 0) hw = 1;
  uint64_t nt = env_u64("KERNKIT_EMU_THREADS", std::min(hw, 16u));
  if (nt == 0) nt = 1;
  nt = std::min<uint64_t>(nt, nblocks);
  const std::function<void()> body = [&L] {
    Worker& w = this_worker();
    Worker* const prev = tl_worker;
    tl_worker = &w;
    if (w.dyn_smem_storage.size() < L.smem) w.dyn_smem_storage.assign(L.smem, 0);
#if defined(KERNKIT_EMU_ASAN)
    // Exact-size heap buffer so that AddressSanitizer reports overruns of dynamic shared memory.
    std::unique_ptr<unsigned char[]> exact(L.smem ? new unsigned char[L.smem] : nullptr);
    w.dyn_smem = exact.get();
#else
    w.dyn_smem = w.dyn_smem_storage.data();
#endif
    while (!L.failed.load(std::memory_order_relaxed)) {
      const uint64_t b = L.next_block.fetch_add(1, std::memory_order_relaxed);
      if (b >= L.nblocks) break;
      run_block(w, L, b);
      if (w.failed) {
        std::lock_guard<std::mutex> lk(L.error_mutex);
        if (!L.error) L.error = w.error;
        L.failed.store(true);
      }
    }
    w.dyn_smem = nullptr;
    tl_worker = prev;
  };
  if (nt <= 1) body();
  else host_pool().run(static_cast<unsigned>(nt), body);
  if (L.error) std::rethrow_exception(L.error);
}

}  // namespace detail
}  // namespace emu
}  // namespace kernkit
