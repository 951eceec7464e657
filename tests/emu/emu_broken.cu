// Deliberately broken kernels the emulator must catch. `emu_broken <case>` prints the kernel's
// result ("RESULT <hash>") or "ERROR: <message>" when the launch throws.
#include <kernkit/smem.cuh>
#include <kernkit/utils.cuh>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

__global__ void divergent_shfl(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x % 32 < 16) { v = __shfl_xor_sync(0xffffffffu, v, 1); }  // MARK:divergent_shfl lanes 16..31 never arrive
  out[threadIdx.x] = v;
}

__global__ void divergent_sites(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x % 32 < 8) v = __shfl_down_sync(0xffffffffu, v, 1);  // MARK:site_a
  else v = __shfl_down_sync(0xffffffffu, v, 2);  // MARK:site_b
  out[threadIdx.x] = v;
}

__global__ void divergent_syncthreads(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = 1;
  if (threadIdx.x >= 40) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = s[63 - threadIdx.x];
}

__global__ void syncwarp_vs_syncthreads(int* out) {
  if (threadIdx.x < 16) __syncwarp();
  else __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void partial_warp_full_mask(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

// The classic missing barrier: every thread publishes a value in shared memory and reads its
// neighbour's without __syncthreads in between.
template <bool kSync>
__global__ void neighbour_sum(const int* __restrict__ in, int* out) {
  __shared__ int s[256];
  const unsigned t = threadIdx.x, n = blockDim.x;
  const int base = static_cast<int>(blockIdx.x * n);
  s[t] = in[base + static_cast<int>(t)];
  if (kSync) __syncthreads();
  out[base + static_cast<int>(t)] = s[(t + n - 1) % n] + 3 * s[(t + 1) % n];
}

// Writes one element past its buffer (an out-of-bounds global write for AddressSanitizer).
__global__ void oob_global(int* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i <= n) out[i] = i;  // should be i < n
}

// Writes one element past the dynamic shared memory it was given.
__global__ void oob_dynamic_smem(int* out) {
  KERNKIT_DYNAMIC_SMEM(int, d);
  d[threadIdx.x + 1] = 1;  // the block has blockDim.x ints
  __syncthreads();
  out[threadIdx.x] = d[threadIdx.x];
}

__global__ void trap_kernel(int* out) {
  if (threadIdx.x == 7 && blockIdx.x == 1) __trap();
  out[threadIdx.x] = 0;
}

namespace {

uint64_t fnv(const std::vector<int>& v) {
  uint64_t h = 1469598103934665603ull;
  for (int x : v) {
    h ^= static_cast<uint32_t>(x);
    h *= 1099511628211ull;
  }
  return h;
}

template <class... P, class... A>
void run(dim3 grid, dim3 block, size_t smem, void (*k)(P...), A... args) {
  kernkit::host::LaunchKernel(grid, block, DLDevice{kDLCPU, 0}, smem)(k, args...);
}

template <bool kSync>
void neighbour(std::vector<int>& out) {
  const int nb = 8, nt = 256;
  std::vector<int> in(nb * nt);
  for (int i = 0; i < nb * nt; ++i) in[i] = i * 7 + 1;
  out.assign(nb * nt, 0);
  run(dim3(nb), dim3(nt), 0, neighbour_sum<kSync>, static_cast<const int*>(in.data()), out.data());
  int wrong = 0;
  for (int b = 0; b < nb; ++b)
    for (int t = 0; t < nt; ++t)
      wrong += out[b * nt + t] != in[b * nt + (t + nt - 1) % nt] + 3 * in[b * nt + (t + 1) % nt];
  std::printf("WRONG %d\n", wrong);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> out(256, 0);
  const std::map<std::string, std::function<void()>> cases = {
      {"divergent_shfl", [&] { run(dim3(2), dim3(64), 0, divergent_shfl, out.data()); }},
      {"divergent_sites", [&] { run(dim3(1), dim3(32), 0, divergent_sites, out.data()); }},
      {"divergent_syncthreads", [&] { run(dim3(1), dim3(64), 0, divergent_syncthreads, out.data()); }},
      {"syncwarp_vs_syncthreads", [&] { run(dim3(1), dim3(32), 0, syncwarp_vs_syncthreads, out.data()); }},
      {"partial_warp_full_mask", [&] { run(dim3(1), dim3(20), 0, partial_warp_full_mask, out.data()); }},
      {"missing_sync", [&] { neighbour<false>(out); }},
      {"with_sync", [&] { neighbour<true>(out); }},
      {"oob_global", [&] {
         std::vector<int> buf(100);
         run(dim3(4), dim3(32), 0, oob_global, buf.data(), 100);
         out.assign(buf.begin(), buf.end());
       }},
      {"oob_dynamic_smem", [&] { run(dim3(1), dim3(32), 32 * sizeof(int), oob_dynamic_smem, out.data()); }},
      {"trap", [&] { run(dim3(2), dim3(32), 0, trap_kernel, out.data()); }},
  };
  if (argc < 2 || cases.count(argv[1]) == 0) {
    std::printf("usage: emu_broken <case>\n");
    return 2;
  }
  try {
    cases.at(argv[1])();
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    return 3;
  }
  std::printf("RESULT %016llx\n", static_cast<unsigned long long>(fnv(out)));
  return 0;
}
