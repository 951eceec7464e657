/// \file utils.cuh
/// \brief Device-side basics and the host kernel launcher: type aliases, `KERNKIT_DEVICE`,
/// `KERNKIT_UNROLL`, `load_as`/`store_as`, the two halves of Programmatic Dependent Launch, `CHECK_CUDA` and
/// `LaunchKernel`.
///
/// Under the CPU emulation backend (`KERNKIT_EMU` defined, see `kernkit/emu/runtime.h`) the same
/// names exist; `LaunchKernel` then runs the grid on the CPU and the PDL calls are no-ops.
#pragma once

#include <kernkit/utils.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <tuple>
#if defined(KERNKIT_NVRTC)
#include <mutex>
#if KERNKIT_HOST_DEFINE_HELPERS
#include <cuda.h>  // the driver's launch types (launch_cubin_kernel)
#endif
#endif

/// \brief Qualifiers for every kernkit device helper: inlined, device-only.
#define KERNKIT_DEVICE __forceinline__ __device__

/// \brief `KERNKIT_UNROLL` for nvcc; nothing for a host compiler (the CPU emulator), which
/// would warn about the unknown pragma.
#if defined(__CUDACC__) && !defined(KERNKIT_UNROLL)
#define KERNKIT_UNROLL _Pragma("unroll")
#elif !defined(KERNKIT_UNROLL)
#define KERNKIT_UNROLL
#endif

namespace kernkit {

/// \brief 32-bit IEEE float.
using fp32_t = float;
/// \brief IEEE half precision.
using fp16_t = __half;
/// \brief bfloat16.
using bf16_t = __nv_bfloat16;
/// \brief 8-bit float, 4 exponent bits, 3 mantissa bits (OCP E4M3, saturating, no infinity).
using fp8_e4m3_t = __nv_fp8_e4m3;
/// \brief 8-bit float, 5 exponent bits, 2 mantissa bits (OCP E5M2).
using fp8_e5m2_t = __nv_fp8_e5m2;

/// \brief Two packed fp32 values.
using fp32x2_t = float2;
/// \brief Four packed fp32 values.
using fp32x4_t = float4;
/// \brief Two packed fp16 values.
using fp16x2_t = __half2;
/// \brief Two packed bf16 values.
using bf16x2_t = __nv_bfloat162;
/// \brief Two packed fp8 E4M3 values.
using fp8x2_e4m3_t = __nv_fp8x2_e4m3;
/// \brief Two packed fp8 E5M2 values.
using fp8x2_e5m2_t = __nv_fp8x2_e5m2;
/// \brief Four packed fp8 E4M3 values.
using fp8x4_e4m3_t = __nv_fp8x4_e4m3;
/// \brief Four packed fp8 E5M2 values.
using fp8x4_e5m2_t = __nv_fp8x4_e5m2;

namespace device {

/// \brief Threads in a warp.
inline constexpr uint32_t kWarpThreads = 32;

/// \brief Load a `T` from `ptr`, `offset` elements of `T` in.
/// \tparam T The type to read.
/// \param ptr Untyped base pointer, aligned for `T`.
/// \param offset Element offset, in units of `T`.
/// \return The value read.
template <typename T>
KERNKIT_DEVICE T load_as(const void* __restrict__ ptr, int64_t offset = 0) {
  return static_cast<const T*>(ptr)[offset];
}

/// \brief Store `value` to `ptr`, `offset` elements of `T` in.
/// \tparam T The type to write.
/// \param ptr Untyped base pointer, aligned for `T`.
/// \param value The value to write.
/// \param offset Element offset, in units of `T`.
template <typename T>
KERNKIT_DEVICE void store_as(void* __restrict__ ptr, const T& value, int64_t offset = 0) {
  static_cast<T*>(ptr)[offset] = value;
}

/// \brief Wait until the preceding kernel in the stream has finished and its writes are visible
/// (`griddepcontrol.wait`). Every read of data the preceding kernel wrote must come after it.
///
/// A no-op when `kUsePDL` is false, below sm_90, and under the CPU emulator. Not a barrier.
/// \tparam kUsePDL Whether the kernel was launched with PDL.
template <bool kUsePDL>
KERNKIT_DEVICE void PDLWaitPrimary() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if constexpr (kUsePDL) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// \brief Let the next kernel in the stream start early (`griddepcontrol.launch_dependents`).
///
/// Carries no memory ordering and publishes nothing. A no-op when `kUsePDL` is false, below
/// sm_90, and under the CPU emulator. Not a barrier.
/// \tparam kUsePDL Whether the kernel was launched with PDL.
template <bool kUsePDL>
KERNKIT_DEVICE void PDLTriggerSecondary() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if constexpr (kUsePDL) asm volatile("griddepcontrol.launch_dependents;");
#endif
}

}  // namespace device

namespace host {

/// \brief Function-style CUDA check: throws `PanicError` when `err` is not `cudaSuccess`.
/// Prefer `CHECK_CUDA`, which can add context.
/// \param err The status returned by a CUDA runtime call.
inline void RuntimeDeviceCheck(cudaError_t err) {
  if (TVM_FFI_PREDICT_FALSE(err != cudaSuccess)) {
    Panic("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  }
}

#if defined(KERNKIT_NVRTC)
/// \brief Launch a cubin's kernel (the nvrtc backend's `cudaKernel_t`) as `cudaLaunchKernelExC`
/// does, through the driver's `cuLaunchKernelEx`, which the runtime finds once
/// (`cudaGetDriverEntryPoint`: no library links libcuda). That skips the runtime's own work per
/// launch (its host time: docs/performance.md). Where the driver
/// does not launch it (a thread whose first CUDA call this is has no current context for the
/// default stream; an attribute it does not translate; any error), the runtime launches it,
/// which makes the device's primary context current, or returns the error.
/// \param config The launch, as `cudaLaunchKernelExC` takes it.
/// \param kernel The kernel.
/// \param argv Pointers to its arguments.
/// \return `cudaSuccess`, or the runtime's error.
KERNKIT_HOST_HELPER cudaError_t launch_cubin_kernel(const cudaLaunchConfig_t& config, cudaKernel_t kernel,
                                                    void** argv);
#if KERNKIT_HOST_DEFINE_HELPERS
KERNKIT_HOST_HELPER cudaError_t launch_cubin_kernel(const cudaLaunchConfig_t& config, cudaKernel_t kernel,
                                                    void** argv) {
  using Launch = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
  static const Launch driver = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &fn, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuLaunchKernelEx", &fn, cudaEnableDefault, &found);
#endif
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<Launch>(fn) : nullptr;
  }();
  // PDL is the one attribute LaunchKernel sets; a launch with any other goes through the runtime.
  const bool pdl = config.numAttrs == 1 && config.attrs[0].id == cudaLaunchAttributeProgrammaticStreamSerialization;
  if (driver != nullptr && (config.numAttrs == 0 || pdl)) {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed =
        pdl ? config.attrs[0].val.programmaticStreamSerializationAllowed : 0;
    CUlaunchConfig c{};
    c.gridDimX = config.gridDim.x;
    c.gridDimY = config.gridDim.y;
    c.gridDimZ = config.gridDim.z;
    c.blockDimX = config.blockDim.x;
    c.blockDimY = config.blockDim.y;
    c.blockDimZ = config.blockDim.z;
    c.sharedMemBytes = static_cast<unsigned int>(config.dynamicSmemBytes);
    c.hStream = reinterpret_cast<CUstream>(config.stream);
    c.attrs = &attr;
    c.numAttrs = pdl ? 1 : 0;
    // A kernel handle launches in the stream's context, or in the current one for the default
    // stream (cuLaunchKernelEx's documentation).
    if (driver(&c, reinterpret_cast<CUfunction>(kernel), argv, nullptr) == CUDA_SUCCESS) return cudaSuccess;
  }
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), argv);
}
#endif
#endif

/// \brief Launches a kernel on the caller's current stream and checks the launch.
///
/// The stream comes from tvm-ffi's environment: for torch tensors it is the current torch stream
/// of the tensors' device, so launches follow `torch.cuda.stream(...)` and CUDA-graph capture.
/// Usage: `LaunchKernel(grid, block, device).enable_pdl(kUsePDL)(kernel, args...);`
class LaunchKernel {
 public:
  /// \brief Configure a launch on `device`'s current stream.
  /// \param grid Grid dimensions.
  /// \param block Block dimensions.
  /// \param device The device the tensors live on.
  /// \param smem Dynamic shared memory in bytes.
  LaunchKernel(dim3 grid, dim3 block, DLDevice device, size_t smem = 0)
      : grid_(grid), block_(block), smem_(smem), stream_(resolve_stream(device)) {}

  /// \brief Configure a launch on an explicit stream.
  /// \param grid Grid dimensions.
  /// \param block Block dimensions.
  /// \param stream The stream to launch on.
  /// \param smem Dynamic shared memory in bytes.
  LaunchKernel(dim3 grid, dim3 block, cudaStream_t stream, size_t smem = 0)
      : grid_(grid), block_(block), smem_(smem), stream_(stream) {}

  /// \brief Launch with Programmatic Dependent Launch (sm_90+) when `enable` is true.
  /// \param enable Whether to set the programmatic stream serialization attribute.
  /// \return `*this`, for chaining.
  LaunchKernel& enable_pdl(bool enable = true) {
    pdl_ = enable;
    return *this;
  }

  /// \brief Launch `kernel` with `args` and throw `PanicError` if the launch fails.
  /// \param kernel A `__global__` function.
  /// \param args Its arguments, converted to the kernel's parameter types.
  template <typename... Params, typename... Args>
  void operator()(void (*kernel)(Params...), Args&&... args) const {
    static_assert(sizeof...(Params) == sizeof...(Args), "LaunchKernel: wrong number of kernel arguments");
#if defined(KERNKIT_EMU)
    ::kernkit::emu::launch(::kernkit::emu::LaunchConfig{grid_, block_, smem_}, kernel,
                           static_cast<Params>(std::forward<Args>(args))...);
#else
    // What cuda_runtime.h's cudaLaunchKernelEx template does, with the kernel given as a
    // handle, so that an nvrtc build (a cubin's kernel) and an nvcc build share the launch.
    launch(handle(reinterpret_cast<const void*>(kernel)), std::index_sequence_for<Params...>{},
           std::tuple<Params...>(static_cast<Params>(std::forward<Args>(args))...));
#endif
  }

 private:
#if defined(KERNKIT_NVRTC)
  /// What the nvrtc backend links in (its generated `kernels.S`) for each kernel instantiation
  /// a launcher takes the address of: the host "address" of the kernel is this record, whose
  /// symbol is the kernel's own host name. `image` points at the module's cubin.
  struct NvrtcKernel {
    const char* name;    // the cubin's name of the instantiation (NVRTC's lowered name)
    void** image;        // the module's cubin, then (after the first launch) its cudaLibrary_t
    cudaKernel_t handle;  // set by the first launch
  };

  static cudaKernel_t nvrtc_handle(const void* symbol) {
    auto* k = const_cast<NvrtcKernel*>(static_cast<const NvrtcKernel*>(symbol));
    cudaKernel_t handle = __atomic_load_n(&k->handle, __ATOMIC_ACQUIRE);
    if (handle != nullptr) return handle;
    static std::mutex mutex;  // per module: the first launch of each kernel loads it
    std::lock_guard<std::mutex> lock(mutex);
    if (k->handle != nullptr) return k->handle;
    auto* library = reinterpret_cast<cudaLibrary_t*>(k->image + 1);
    cudaError_t err = cudaSuccess;
    if (*library == nullptr) {  // loaded once per module, for the life of the process (as nvcc's images)
      err = cudaLibraryLoadData(library, *k->image, nullptr, nullptr, 0, nullptr, nullptr, 0);
    }
    if (err == cudaSuccess) err = cudaLibraryGetKernel(&handle, *library, k->name);
    if (err != cudaSuccess) {
      Panic("cannot load kernel ", k->name, " from the module's cubin: ", cudaGetErrorName(err), " (",
            cudaGetErrorString(err), ")");
    }
    __atomic_store_n(&k->handle, handle, __ATOMIC_RELEASE);
    return handle;
  }
#endif

#if !defined(KERNKIT_EMU)
  /// What `cudaLaunchKernelExC` launches: the kernel's address under nvcc, its cubin handle
  /// under the nvrtc backend.
  static const void* handle(const void* kernel) {
#if defined(KERNKIT_NVRTC)
    return reinterpret_cast<const void*>(nvrtc_handle(kernel));
#else
    return kernel;
#endif
  }

  template <size_t... I, typename Tuple>
  void launch(const void* func, std::index_sequence<I...>, Tuple values) const {
    void* argv[] = {static_cast<void*>(&std::get<I>(values))..., nullptr};
    cudaLaunchConfig_t config{};
    config.gridDim = grid_;
    config.blockDim = block_;
    config.dynamicSmemBytes = smem_;
    config.stream = stream_;
    cudaLaunchAttribute attr[1];
    if (pdl_) {
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      config.attrs = attr;
      config.numAttrs = 1;
    }
#if defined(KERNKIT_NVRTC)
    const cudaError_t err = launch_cubin_kernel(config, static_cast<cudaKernel_t>(const_cast<void*>(func)), argv);
#else
    const cudaError_t err = cudaLaunchKernelExC(&config, func, argv);
#endif
    if (err != cudaSuccess) {
      Panic("kernel launch failed with grid (", grid_.x, ", ", grid_.y, ", ", grid_.z, "), block (", block_.x, ", ",
            block_.y, ", ", block_.z, "), ", smem_, " bytes of shared memory: ", cudaGetErrorName(err), " (",
            cudaGetErrorString(err), ")");
    }
  }
#endif

  static cudaStream_t resolve_stream(DLDevice device) {
#if defined(KERNKIT_EMU)
    (void)device;
    return nullptr;
#else
    return static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
#endif
  }

  dim3 grid_;
  dim3 block_;
  size_t smem_;
  cudaStream_t stream_;
  bool pdl_ = false;
};

}  // namespace host
}  // namespace kernkit

/// \brief Stream-style CUDA check: `CHECK_CUDA(cudaMemsetAsync(...)) << "while clearing";`
///
/// Evaluates `expr` once; on an error throws `kernkit::host::PanicError` (a Python
/// `RuntimeError`) whose message is `CUDA error <name> (<text>) from <expr> (<file>:<line>): `
/// followed by the streamed context, which is only evaluated on failure.
#define CHECK_CUDA(expr)                                                                                   \
  if (const cudaError_t kernkit_cuda_err_ = (expr); TVM_FFI_PREDICT_TRUE(kernkit_cuda_err_ == cudaSuccess)) { \
  } else                                                                                                   \
    KERNKIT_THROW(RuntimeError) << "CUDA error " << cudaGetErrorName(kernkit_cuda_err_) << " ("             \
                                << cudaGetErrorString(kernkit_cuda_err_) << ") from " #expr " (" __FILE__ ":" \
                                << __LINE__ << "): "
