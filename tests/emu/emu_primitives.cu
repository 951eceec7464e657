// Emulated CUDA primitives checked against their specification. Built by test_emu_primitives.py
// with the CPU backend's flags; `emu_primitives <case>` prints "PASS" or the first mismatch.
#include <kernkit/smem.cuh>
#include <kernkit/utils.cuh>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

int g_failures = 0;
#define EXPECT_EQ(a, b, ...)                                                                      \
  do {                                                                                            \
    if (!((a) == (b))) {                                                                          \
      if (g_failures++ < 10) {                                                                    \
        std::printf("MISMATCH %s:%d: %s != %s: ", __FILE__, __LINE__, #a, #b);                  \
        std::printf(__VA_ARGS__);                                                                 \
        std::printf("\n");                                                                        \
      }                                                                                           \
    }                                                                                             \
  } while (0)

template <class... P, class... A>
void run(dim3 grid, dim3 block, size_t smem, void (*k)(P...), A... args) {
  kernkit::host::LaunchKernel(grid, block, DLDevice{kDLCPU, 0}, smem)(k, args...);
}

// ---- shuffles ---------------------------------------------------------------------------------

// Reference from the CUDA Programming Guide's description (not from the PTX pseudo-code used by
// the emulator): lanes form groups of `width`; idx reads lane srcLane % width of the own group;
// up reads lane - delta unless that leaves the group (own value); down reads lane + delta unless
// that leaves the group; xor reads lane ^ mask unless that lies in a later group. Offsets of 32
// and more: shfl.sync uses only the low five bits of the lane/offset operand.
int ref_lane(int mode, int lane, int arg, int width) {
  const int base = lane / width * width;
  if (mode == 1 || mode == 2) arg &= 31;
  switch (mode) {
    case 0: return base + (((arg % 32) + 32) % 32) % width;
    case 1: return (lane - arg >= base) ? lane - arg : lane;
    case 2: return (lane + arg < base + width) ? lane + arg : lane;
    default: {
      const int j = lane ^ (arg & 31);
      return (j < base + width) ? j : lane;
    }
  }
}

__global__ void shfl_kernel(int* out, int mode, int arg, int width) {
  const int lane = threadIdx.x % 32;
  const int v = 1000 * (threadIdx.x / 32) + lane;
  int r = 0;
  if (mode == 0) r = __shfl_sync(0xffffffffu, v, arg + (lane % 3) * 32, width);  // srcLane >= 32 wraps
  if (mode == 1) r = __shfl_up_sync(0xffffffffu, v, static_cast<unsigned>(arg), width);
  if (mode == 2) r = __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(arg), width);
  if (mode == 3) r = __shfl_xor_sync(0xffffffffu, v, arg, width);
  out[threadIdx.x] = r;
}

void case_shfl_widths() {
  std::vector<int> out(64);
  for (int width = 1; width <= 32; width *= 2) {
    for (int mode = 0; mode < 4; ++mode) {
      for (int arg = 0; arg < 40; ++arg) {
        run(dim3(1), dim3(64), 0, shfl_kernel, out.data(), mode, arg, width);
        for (int t = 0; t < 64; ++t) {
          const int lane = t % 32;
          const int a = mode == 0 ? arg + (lane % 3) * 32 : arg;
          const int want = 1000 * (t / 32) + ref_lane(mode, lane, a, width);
          EXPECT_EQ(out[t], want, "mode %d width %d arg %d thread %d", mode, width, arg, t);
        }
      }
    }
  }
}

template <class T>
__global__ void shfl_type_kernel(T* out, const T* in) {
  const T v = in[threadIdx.x];
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);
  out[32 + threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 3, 16);
  out[64 + threadIdx.x] = __shfl_sync(0xffffffffu, v, 7, 8);
  out[96 + threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 1);
}

template <class T>
void check_shfl_type(const char* name) {
  std::vector<T> in(32), out(128);
  for (int i = 0; i < 32; ++i) {
    uint64_t bits = 0x0123456789abcdefull * static_cast<uint64_t>(i + 1) ^ (static_cast<uint64_t>(i) << 40);
    std::memcpy(static_cast<void*>(&in[i]), &bits, sizeof(T));
  }
  run(dim3(1), dim3(32), 0, shfl_type_kernel<T>, out.data(), static_cast<const T*>(in.data()));
  for (int l = 0; l < 32; ++l) {
    const int src[4] = {ref_lane(3, l, 5, 32), ref_lane(2, l, 3, 16), ref_lane(0, l, 7, 8), ref_lane(1, l, 1, 32)};
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(std::memcmp(static_cast<const void*>(&out[32 * k + l]), static_cast<const void*>(&in[src[k]]), sizeof(T)), 0,
                "type %s variant %d lane %d", name, k, l);
    }
  }
}

void case_shfl_types() {
  check_shfl_type<int>("int");
  check_shfl_type<unsigned>("unsigned");
  check_shfl_type<long long>("long long");
  check_shfl_type<unsigned long long>("unsigned long long");
  check_shfl_type<float>("float");
  check_shfl_type<double>("double");
  check_shfl_type<__half>("__half");
  check_shfl_type<__half2>("__half2");
  check_shfl_type<__nv_bfloat16>("__nv_bfloat16");
  check_shfl_type<__nv_bfloat162>("__nv_bfloat162");
}

// A partial mask: lanes outside the mask are not required; a source outside the mask returns the
// caller's own value (the emulator's documented choice for this undefined case).
__global__ void shfl_partial_kernel(int* out) {
  const int lane = threadIdx.x;
  if (lane < 8) out[lane] = __shfl_down_sync(0xffu, lane * 10, 4);
  else if (lane >= 16) out[lane] = __shfl_sync(0xffff0000u, lane * 10, 20);
  else out[lane] = -1;
}

void case_shfl_partial_mask() {
  std::vector<int> out(32);
  run(dim3(1), dim3(32), 0, shfl_partial_kernel, out.data());
  for (int l = 0; l < 32; ++l) {
    int want = -1;
    if (l < 8) want = (l + 4 < 8) ? (l + 4) * 10 : l * 10;  // lanes 8..11 are outside the mask
    else if (l >= 16) want = 200;
    EXPECT_EQ(out[l], want, "lane %d", l);
  }
}

// ---- votes ------------------------------------------------------------------------------------

__global__ void vote_kernel(unsigned* out, unsigned pattern, unsigned mask) {
  const unsigned lane = threadIdx.x;
  if (!((mask >> lane) & 1u)) return;
  const int pred = (pattern >> lane) & 1u;
  out[4 * lane + 0] = __ballot_sync(mask, pred);
  out[4 * lane + 1] = static_cast<unsigned>(__any_sync(mask, pred));
  out[4 * lane + 2] = static_cast<unsigned>(__all_sync(mask, pred));
  out[4 * lane + 3] = __match_any_sync(mask, static_cast<int>(lane % 3));
}

void case_votes() {
  std::mt19937 rng(1);
  const unsigned masks[] = {0xffffffffu, 0x0000ffffu, 0xf0f0f0f0u, 0x1u, 0x80000001u};
  for (unsigned mask : masks) {
    for (int rep = 0; rep < 8; ++rep) {
      const unsigned pattern = rep == 0 ? 0u : rep == 1 ? 0xffffffffu : static_cast<unsigned>(rng());
      std::vector<unsigned> out(128, 0xdeadu);
      run(dim3(1), dim3(32), 0, vote_kernel, out.data(), pattern, mask);
      for (unsigned l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1u)) continue;
        EXPECT_EQ(out[4 * l], pattern & mask, "ballot mask %08x lane %u", mask, l);
        EXPECT_EQ(out[4 * l + 1], (pattern & mask) != 0 ? 1u : 0u, "any mask %08x lane %u", mask, l);
        EXPECT_EQ(out[4 * l + 2], (pattern & mask) == mask ? 1u : 0u, "all mask %08x lane %u", mask, l);
        unsigned same = 0;
        for (unsigned j = 0; j < 32; ++j)
          if (((mask >> j) & 1u) && j % 3 == l % 3) same |= 1u << j;
        EXPECT_EQ(out[4 * l + 3], same, "match_any mask %08x lane %u", mask, l);
      }
    }
  }
}

__global__ void activemask_kernel(unsigned* out) {
  if (threadIdx.x % 3 == 0) {
    out[threadIdx.x] = __activemask();
  } else {
    out[threadIdx.x] = __activemask() | 0x80000000u;
  }
}

void case_activemask() {
  std::vector<unsigned> out(32);
  run(dim3(1), dim3(32), 0, activemask_kernel, out.data());
  unsigned a = 0;
  for (int l = 0; l < 32; l += 3) a |= 1u << l;
  for (int l = 0; l < 32; ++l) EXPECT_EQ(out[l], l % 3 == 0 ? a : (~a | 0x80000000u), "lane %d", l);
}

// ---- barriers ---------------------------------------------------------------------------------

// Threads with odd ids exit early; the rest pass several barriers. Exited threads count as
// arrived, so this must neither deadlock nor be an error.
__global__ void early_exit_kernel(int* out, int rounds) {
  __shared__ int s[256];
  const int t = threadIdx.x;
  if (t & 1) return;
  int acc = 0;
  for (int r = 0; r < rounds; ++r) {
    s[t] = t + r;
    __syncthreads();
    acc += s[(t + 2) % blockDim.x];
    __syncthreads();
  }
  const int c = __syncthreads_count(t % 4 == 0);
  out[t] = acc * 1000 + c;
}

void case_barrier_early_exit() {
  const int n = 256, rounds = 5;
  std::vector<int> out(n, -7);
  run(dim3(1), dim3(n), 0, early_exit_kernel, out.data(), rounds);
  for (int t = 0; t < n; ++t) {
    if (t & 1) {
      EXPECT_EQ(out[t], -7, "thread %d", t);
      continue;
    }
    int acc = 0;
    for (int r = 0; r < rounds; ++r) acc += (t + 2) % n + r;
    EXPECT_EQ(out[t], acc * 1000 + n / 4, "thread %d", t);
  }
}

__global__ void barrier_vote_kernel(int* out) {
  const int t = threadIdx.x;
  out[3 * t + 0] = __syncthreads_count(t < 37);
  out[3 * t + 1] = __syncthreads_and(t < 200) != 0;
  out[3 * t + 2] = __syncthreads_or(t == 99) != 0;
}

void case_barrier_votes() {
  std::vector<int> out(3 * 160);
  run(dim3(1), dim3(32, 5), 0, barrier_vote_kernel, out.data());
  // threadIdx.x only spans 32 values here; t is threadIdx.x, so each x appears 5 times.
  for (int i = 0; i < 160; ++i) {
    const int t = i % 32;
    EXPECT_EQ(out[3 * t], 32 * 5 > 0 ? 5 * 32 : 0, "count %d", t);
    EXPECT_EQ(out[3 * t + 1], 1, "and %d", t);
    EXPECT_EQ(out[3 * t + 2], 0, "or %d", t);
  }
}

__global__ void syncwarp_kernel(int* out) {
  __shared__ int s[64];
  const int t = threadIdx.x;
  s[t] = t * 3;
  __syncwarp();
  out[t] = s[t ^ 31];
}

void case_syncwarp() {
  std::vector<int> out(64);
  run(dim3(1), dim3(64), 0, syncwarp_kernel, out.data());
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], (t ^ 31) * 3, "thread %d", t);
}

// ---- shared memory ----------------------------------------------------------------------------

// Every block fills its static and dynamic shared memory with its own id, lets other blocks and
// threads run (barriers, atomics, many blocks over two host threads), then checks the contents.
__global__ void isolation_kernel(int* bad, int* counter) {
  __shared__ int s[128];
  KERNKIT_DYNAMIC_SMEM(int, d);
  const int b = static_cast<int>(blockIdx.x + gridDim.x * blockIdx.y);
  s[threadIdx.x] = b;
  d[threadIdx.x] = -b;
  for (int i = 0; i < 4; ++i) {
    __syncthreads();
    atomicAdd(counter, 1);
  }
  __syncthreads();
  int wrong = 0;
  for (int i = 0; i < 128; ++i) wrong += (s[i] != b) + (d[i] != -b);
  if (wrong) atomicAdd(bad, wrong);
}

void case_smem_isolation() {
  int bad = 0, counter = 0;
  run(dim3(64, 3), dim3(128), 128 * sizeof(int), isolation_kernel, &bad, &counter);
  EXPECT_EQ(bad, 0, "blocks saw another block's shared memory");
  EXPECT_EQ(counter, 64 * 3 * 128 * 4, "atomic counter");
}

// ---- atomics ----------------------------------------------------------------------------------

__global__ void atomics_kernel(int* i, unsigned* u, unsigned long long* ull, float* f, double* d, unsigned* inc,
                               unsigned* dec, int* mn, int* mx, unsigned* cas_wins) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(i, 2);
  atomicSub(i, 1);
  atomicOr(u, 1u << (t % 32));
  atomicAdd(ull, 1ull << 33);
  atomicAdd(f, 0.5f);
  atomicAdd(d, 0.25);
  atomicInc(inc, 9u);
  atomicDec(dec, 6u);
  atomicMin(mn, -t);
  atomicMax(mx, t);
  if (atomicCAS(cas_wins + 1, 0u, static_cast<unsigned>(t) + 1u) == 0u) atomicAdd(cas_wins, 1u);
}

void case_atomics() {
  int i = 0, mn = 0, mx = 0;
  unsigned u = 0, inc = 0, dec = 0, cas[2] = {0, 0};
  unsigned long long ull = 0;
  float f = 0;
  double d = 0;
  const int n = 16 * 96;
  run(dim3(16), dim3(96), 0, atomics_kernel, &i, &u, &ull, &f, &d, &inc, &dec, &mn, &mx, cas);
  EXPECT_EQ(i, n, "add/sub");
  EXPECT_EQ(u, 0xffffffffu, "or");
  EXPECT_EQ(ull, static_cast<unsigned long long>(n) << 33, "ull add");
  EXPECT_EQ(f, 0.5f * n, "float add");
  EXPECT_EQ(d, 0.25 * n, "double add");
  EXPECT_EQ(inc, static_cast<unsigned>(n % 10), "inc wraps at 9 -> 0");
  // dec from 0 with limit 6: 0 -> 6 -> 5 ... -> 0 -> 6: period 7.
  EXPECT_EQ(dec, static_cast<unsigned>((7 - n % 7) % 7), "dec");
  EXPECT_EQ(mn, -(n - 1), "min");
  EXPECT_EQ(mx, n - 1, "max");
  EXPECT_EQ(cas[0], 1u, "exactly one CAS wins");
}

__global__ void half_atomic_kernel(__half* h, __nv_bfloat16* b, float* ftz) {
  atomicAdd(h, __float2half(1.0f));
  atomicAdd(b, __float2bfloat16(1.0f));
  if (threadIdx.x == 0) atomicAdd(ftz, 1e-40f);  // subnormal input is flushed: no change
}

void case_half_atomics() {
  __half h[2] = {__float2half(0.0f), __float2half(5.0f)};
  __nv_bfloat16 b[2] = {__float2bfloat16(0.0f), __float2bfloat16(7.0f)};
  float ftz = 1.0f;
  run(dim3(2), dim3(64), 0, half_atomic_kernel, h, b, &ftz);
  EXPECT_EQ(__half2float(h[0]), 128.0f, "half add");
  EXPECT_EQ(__half2float(h[1]), 5.0f, "neighbour half untouched");
  EXPECT_EQ(__bfloat162float(b[0]), 128.0f, "bf16 add");
  EXPECT_EQ(__bfloat162float(b[1]), 7.0f, "neighbour bf16 untouched");
  EXPECT_EQ(ftz, 1.0f, "float atomicAdd flushes subnormals");
}

// ---- half / bfloat16 fma: print cases for an exact rational check in Python -------------------

__global__ void hfma_kernel(const unsigned short* in, unsigned short* out, int n, int bf) {
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) {
    if (bf) {
      out[i] = __bfloat16_as_ushort(__hfma(__ushort_as_bfloat16(in[3 * i]), __ushort_as_bfloat16(in[3 * i + 1]),
                                           __ushort_as_bfloat16(in[3 * i + 2])));
    } else {
      out[i] = __half_as_ushort(__hfma(__ushort_as_half(in[3 * i]), __ushort_as_half(in[3 * i + 1]),
                                       __ushort_as_half(in[3 * i + 2])));
    }
  }
}

void case_hfma_dump() {
  // Random bit patterns, plus products landing on midpoints with a tiny addend.
  std::mt19937 rng(7);
  for (int bf = 0; bf < 2; ++bf) {
    const int n = 4000;
    std::vector<unsigned short> in(3 * n), out(n);
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < 3; ++k) in[3 * i + k] = static_cast<unsigned short>(rng());
      if (i % 4 == 1) {  // nearby exponents: many ties and near-ties
        in[3 * i + 0] = static_cast<unsigned short>((in[3 * i + 0] & 0x83ffu) | 0x3c00u);
        in[3 * i + 1] = static_cast<unsigned short>((in[3 * i + 1] & 0x83ffu) | 0x3c00u);
        in[3 * i + 2] = static_cast<unsigned short>((in[3 * i + 2] & 0x807fu) | (bf ? 0x3000u : 0x0400u));
      }
    }
    run(dim3(1), dim3(64), 0, hfma_kernel, static_cast<const unsigned short*>(in.data()), out.data(), n, bf);
    for (int i = 0; i < n; ++i) std::printf("%s %04x %04x %04x %04x\n", bf ? "bf16" : "fp16", in[3 * i], in[3 * i + 1], in[3 * i + 2], out[i]);
  }
}

// ---- misc -------------------------------------------------------------------------------------

__global__ void builtins_kernel(int* out) {
  const int t = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int b = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int nt = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  out[b * nt + t] = b * 100000 + t * 10 + (warpSize == 32);
}

void case_builtins() {
  const dim3 g(3, 2, 2), bl(4, 3, 5);
  const int nb = 12, nt = 60;
  std::vector<int> out(nb * nt, -1);
  run(g, bl, 0, builtins_kernel, out.data());
  for (int b = 0; b < nb; ++b)
    for (int t = 0; t < nt; ++t) EXPECT_EQ(out[b * nt + t], b * 100000 + t * 10 + 1, "block %d thread %d", b, t);
  EXPECT_EQ(alignof(uint4), 16u, "uint4 alignment");
  EXPECT_EQ(sizeof(float4), 16u, "float4 size");
}

void case_bad_launch() {
  std::vector<int> out(1);
  bool threw = false;
  try {
    run(dim3(1), dim3(2048), 0, builtins_kernel, out.data());
  } catch (const kernkit::host::PanicError& e) {
    threw = std::strstr(e.what(), "invalid block") != nullptr;
    if (!threw) std::printf("unexpected message: %s\n", e.what());
  }
  EXPECT_EQ(threw, true, "2048 threads per block must be rejected");
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<void()>> cases = {
      {"shfl_widths", case_shfl_widths},   {"shfl_types", case_shfl_types},
      {"shfl_partial_mask", case_shfl_partial_mask}, {"votes", case_votes},
      {"activemask", case_activemask},     {"barrier_early_exit", case_barrier_early_exit},
      {"barrier_votes", case_barrier_votes}, {"syncwarp", case_syncwarp},
      {"smem_isolation", case_smem_isolation}, {"atomics", case_atomics},
      {"half_atomics", case_half_atomics}, {"hfma_dump", case_hfma_dump},
      {"builtins", case_builtins},         {"bad_launch", case_bad_launch},
  };
  if (argc < 2) {
    for (const auto& c : cases) std::printf("%s\n", c.first.c_str());
    return 0;
  }
  const auto it = cases.find(argv[1]);
  if (it == cases.end()) {
    std::printf("unknown case %s\n", argv[1]);
    return 2;
  }
  try {
    it->second();
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    return 3;
  }
  if (g_failures) {
    std::printf("FAIL (%d mismatches)\n", g_failures);
    return 1;
  }
  if (std::string(argv[1]) != "hfma_dump") std::printf("PASS\n");
  return 0;
}
