// Cost of the emulator per simulated thread. `emu_bench [warps]` prints one line per kernel:
// "<name> <threads> <seconds> <ns per thread>".
#include <kernkit/utils.cuh>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

__global__ void trivial(float* __restrict__ out, const float* __restrict__ in) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[i] * 2.0f;
}

// 10 shuffles per thread: a full xor butterfly and a down-sweep.
__global__ void shuffle_heavy(float* __restrict__ out, const float* __restrict__ in) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = in[i];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  for (int o = 1; o < 32; o *= 2) v += __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(o));
  out[i] = v;
}

// 4 block barriers per thread around shared-memory traffic.
__global__ void barrier_heavy(float* __restrict__ out, const float* __restrict__ in) {
  __shared__ float s[256];
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = in[i];
  for (int r = 0; r < 4; ++r) {
    s[threadIdx.x] = v;
    __syncthreads();
    v += s[(threadIdx.x + 1) % blockDim.x];
    __syncthreads();
  }
  out[i] = v;
}

template <class K>
void bench(const char* name, K kernel, unsigned warps) {
  const unsigned block = 256, n = warps * 32;
  std::vector<float> in(n, 1.0f), out(n);
  auto launch = [&] {
    kernkit::host::LaunchKernel(dim3(n / block), dim3(block), DLDevice{kDLCPU, 0})(kernel, out.data(),
                                                                                  static_cast<const float*>(in.data()));
  };
  launch();  // warm up: stacks, host threads
  const auto t0 = std::chrono::steady_clock::now();
  launch();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s %u %.4f %.1f\n", name, n, s, s * 1e9 / n);
}

int main(int argc, char** argv) {
  const unsigned warps = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 8192;
  bench("trivial", trivial, warps);
  bench("shuffle_heavy", shuffle_heavy, warps);
  bench("barrier_heavy", barrier_heavy, warps);
  return 0;
}
