/// \file context.h
/// \brief Stackful fibers for the CPU emulator: stacks with guard pages and a minimal context
/// switch.
///
/// Why not `ucontext`: `swapcontext` saves and restores the signal mask with a `rt_sigprocmask`
/// system call on every switch, and every warp-collective call switches
/// at least twice per simulated thread. Why not boost.context: a system package dependency for a
/// dozen instructions. The hand-written switch below saves only the callee-saved registers of
/// the platform ABI plus the floating-point control registers (benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md). `ucontext` remains
/// as the portable fallback (other architectures, or `-DKERNKIT_EMU_UCONTEXT`).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define KERNKIT_EMU_ASAN 1
#endif

#if !defined(KERNKIT_EMU_UCONTEXT) && !defined(__x86_64__) && !defined(__aarch64__)
#define KERNKIT_EMU_UCONTEXT 1
#endif

#if defined(KERNKIT_EMU_UCONTEXT)
#include <ucontext.h>
#else
extern "C" {
/// \brief Save the callee-saved state on the current stack, store the stack pointer to
/// `*save_sp`, then resume the context whose stack pointer is `new_sp`.
void kernkit_emu_ctx_switch(void** save_sp, void* new_sp);
/// \brief First code a new fiber runs: calls `entry(arg)` (entry and arg come from the initial
/// frame built by `Context::init`); `entry` never returns.
void kernkit_emu_ctx_start();
}

// The symbols live in a COMDAT group so that several translation units that include this header
// link into one object without duplicate-symbol errors; they are hidden so that two emulated
// extension modules in one process never bind to each other's copy.
#if defined(__x86_64__)
// SysV x86-64: rbx, rbp, r12-r15 are callee-saved, plus MXCSR and the x87 control word.
// Frame (low to high): [csr][r15][r14][r13][r12][rbx][rbp][return address].
asm(R"(
  .pushsection .text.kernkit_emu_ctx,"axG",@progbits,kernkit_emu_ctx_switch,comdat
  .globl kernkit_emu_ctx_switch
  .hidden kernkit_emu_ctx_switch
  .type kernkit_emu_ctx_switch,@function
kernkit_emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kernkit_emu_ctx_switch, .-kernkit_emu_ctx_switch
  .globl kernkit_emu_ctx_start
  .hidden kernkit_emu_ctx_start
  .type kernkit_emu_ctx_start,@function
kernkit_emu_ctx_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size kernkit_emu_ctx_start, .-kernkit_emu_ctx_start
  .popsection
)");
#elif defined(__aarch64__)
// AAPCS64: x19-x29, x30 (link register), d8-d15 are callee-saved, plus FPCR.
// Frame: x19..x30 at [sp, 0..95], d8..d15 at [sp, 96..159], fpcr at [sp, 160]; 176 bytes.
asm(R"(
  .pushsection .text.kernkit_emu_ctx,"axG",@progbits,kernkit_emu_ctx_switch,comdat
  .globl kernkit_emu_ctx_switch
  .hidden kernkit_emu_ctx_switch
  .type kernkit_emu_ctx_switch,%function
kernkit_emu_ctx_switch:
  sub sp, sp, #176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mrs x9, fpcr
  str x9, [sp, #160]
  mov x9, sp
  str x9, [x0]
  mov sp, x1
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  ldr x9, [sp, #160]
  msr fpcr, x9
  add sp, sp, #176
  ret
  .size kernkit_emu_ctx_switch, .-kernkit_emu_ctx_switch
  .globl kernkit_emu_ctx_start
  .hidden kernkit_emu_ctx_start
  .type kernkit_emu_ctx_start,%function
kernkit_emu_ctx_start:
  mov x0, x19
  blr x20
  brk #0
  .size kernkit_emu_ctx_start, .-kernkit_emu_ctx_start
  .popsection
)");
#endif
#endif

namespace kernkit {
namespace emu {
namespace detail {

/// \brief Entry point of a fiber; must never return (it switches away for the last time).
using FiberEntry = void (*)(void*);

/// \brief One fiber stack: `size` usable bytes above a guard page (stack overflow faults).
struct Stack {
  char* base = nullptr;  ///< lowest usable address
  size_t size = 0;       ///< usable bytes
  size_t color = 0;      ///< bytes left unused at the top (see `StackPool::acquire`)
};

/// \brief Per-host-thread pool of fiber stacks. Stacks are reused across blocks and launches;
/// their pages are committed lazily by the kernel, so an unused stack costs only address space.
class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool() {
    for (const Stack& s : all_) munmap(s.base - page_size(), s.size + page_size());
  }

  /// \brief Take a stack of `size` bytes (all stacks of one pool have the same size).
  /// \param size Usable bytes, a multiple of the page size.
  /// \return The stack, or one with `base == nullptr` when the mapping failed.
  Stack acquire(size_t size) {
    if (size != size_) {
      for (const Stack& s : all_) munmap(s.base - page_size(), s.size + page_size());
      all_.clear();
      free_.clear();
      size_ = size;
    }
    if (!free_.empty()) {
      Stack s = free_.back();
      free_.pop_back();
      return s;
    }
    const size_t total = size + page_size();
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Stack{};
    mprotect(p, page_size(), PROT_NONE);
    // Stack tops a multiple of the stack size apart would all map to the same cache sets and
    // evict each other on every switch; offset each top by a different multiple of 320 bytes.
    const size_t color = (all_.size() * 320) % 8192;
    Stack s{static_cast<char*>(p) + page_size(), size, size > 4 * 8192 ? color : 0};
    all_.push_back(s);
    return s;
  }

  /// \brief Give a stack back. `dirty` marks a stack abandoned mid-call (its frames never
  /// returned), whose AddressSanitizer shadow must be cleared before reuse.
  void release(const Stack& s, bool dirty) {
#if defined(KERNKIT_EMU_ASAN)
    if (dirty) __asan_unpoison_memory_region(s.base, s.size);
#else
    (void)dirty;
#endif
    free_.push_back(s);
  }

 private:
  static size_t page_size() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
  }
  std::vector<Stack> all_;
  std::vector<Stack> free_;
  size_t size_ = 0;
};

/// \brief A saved execution context (a suspended fiber or the scheduler).
struct Context {
#if defined(KERNKIT_EMU_UCONTEXT)
  ucontext_t uc;
#else
  void* sp = nullptr;
#endif

  /// \brief Prepare this context to run `entry(arg)` on `stack` when first switched to.
  void init(const Stack& stack, FiberEntry entry, void* arg) {
#if defined(KERNKIT_EMU_UCONTEXT)
    getcontext(&uc);
    uc.uc_stack.ss_sp = stack.base;
    uc.uc_stack.ss_size = stack.size - stack.color;
    uc.uc_link = nullptr;
    const uintptr_t e = reinterpret_cast<uintptr_t>(entry);
    const uintptr_t a = reinterpret_cast<uintptr_t>(arg);
    makecontext(&uc, reinterpret_cast<void (*)()>(&trampoline), 4, static_cast<uint32_t>(e >> 32),
                static_cast<uint32_t>(e), static_cast<uint32_t>(a >> 32), static_cast<uint32_t>(a));
#else
    const uintptr_t top = (reinterpret_cast<uintptr_t>(stack.base) + stack.size - stack.color) & ~uintptr_t{15};
#if defined(__x86_64__)
    uint64_t* f = reinterpret_cast<uint64_t*>(top - 80);
    uint32_t mxcsr;
    uint16_t fpcw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    f[0] = static_cast<uint64_t>(mxcsr) | (static_cast<uint64_t>(fpcw) << 32);
    f[1] = 0;                                         // r15
    f[2] = 0;                                         // r14
    f[3] = reinterpret_cast<uint64_t>(entry);         // r13
    f[4] = reinterpret_cast<uint64_t>(arg);           // r12
    f[5] = 0;                                         // rbx
    f[6] = 0;                                         // rbp
    f[7] = reinterpret_cast<uint64_t>(&kernkit_emu_ctx_start);  // return address
    sp = f;
#elif defined(__aarch64__)
    uint64_t* f = reinterpret_cast<uint64_t*>(top - 176);
    std::memset(f, 0, 176);
    uint64_t fpcr;
    asm volatile("mrs %0, fpcr" : "=r"(fpcr));
    f[0] = reinterpret_cast<uint64_t>(arg);                      // x19
    f[1] = reinterpret_cast<uint64_t>(entry);                    // x20
    f[11] = reinterpret_cast<uint64_t>(&kernkit_emu_ctx_start);  // x30
    f[20] = fpcr;
    sp = f;
#endif
#endif
  }

  /// \brief Save the running context into `from` and resume `to`.
  static void swap(Context& from, Context& to) {
#if defined(KERNKIT_EMU_UCONTEXT)
    swapcontext(&from.uc, &to.uc);
#else
    kernkit_emu_ctx_switch(&from.sp, to.sp);
#endif
  }

#if defined(KERNKIT_EMU_UCONTEXT)
 private:
  static void trampoline(uint32_t e_hi, uint32_t e_lo, uint32_t a_hi, uint32_t a_lo) {
    const FiberEntry e = reinterpret_cast<FiberEntry>((static_cast<uintptr_t>(e_hi) << 32) | e_lo);
    e(reinterpret_cast<void*>((static_cast<uintptr_t>(a_hi) << 32) | a_lo));
  }
#endif
};

}  // namespace detail
}  // namespace emu
}  // namespace kernkit
