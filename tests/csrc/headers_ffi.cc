// Host-only test functions for kernkit/ffi.h: tensors made in C++ and returned to Python.
#pragma once

#include <kernkit/ffi.h>
#include <kernkit/tensor.h>
#include <kernkit/utils.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace kernkit {
namespace headers_ffi_test {

/// Number of buffers released through a from_blob deleter so far.
inline std::atomic<int64_t>& freed() {
  static std::atomic<int64_t> count{0};
  return count;
}

struct Ffi {
  /// ffi::empty: a [rows, cols] float16 tensor on the device of `like`.
  static tvm::ffi::Tensor empty(int64_t rows, int64_t cols, tvm::ffi::TensorView like) {
    return host::ffi::empty({rows, cols}, DLDataType{kDLFloat, 16, 1}, like.device());
  }

  /// ffi::empty<T> on the CPU, called with no tensor argument at all.
  static tvm::ffi::Tensor empty_no_tensor_args(int64_t n) {
    return host::ffi::empty<int32_t>({n}, DLDevice{kDLCPU, 0});
  }

  /// ffi::empty_like.
  static tvm::ffi::Tensor empty_like(tvm::ffi::TensorView like) { return host::ffi::empty_like(like); }

  /// alloc_workspace_tensor.
  static tvm::ffi::Tensor workspace(int64_t nbytes, tvm::ffi::TensorView like) {
    return host::alloc_workspace_tensor(nbytes, like.device());
  }

  /// from_blob without ownership: a flat view of `t` (the caller keeps `t` alive).
  static tvm::ffi::Tensor flat_view(tvm::ffi::TensorView t) {
    return host::ffi::from_blob(t.data_ptr(), {t.numel()}, t.dtype(), t.device());
  }

  /// from_blob with strides and a byte offset: the transpose of the 2-D `t` without its first
  /// column, i.e. t[:, 1:].T.
  static tvm::ffi::Tensor transposed_tail(tvm::ffi::TensorView t) {
    CHECK_HOST(t.ndim() == 2 && t.IsContiguous()) << "transposed_tail takes a contiguous 2-D tensor";
    const int64_t rows = t.size(0), cols = t.size(1);
    const uint64_t offset = static_cast<uint64_t>(t.dtype().bits / 8);
    return host::ffi::from_blob(t.data_ptr(), {cols - 1, rows}, t.dtype(), t.device(), {}, {1, cols}, offset);
  }

  /// from_blob_like: another view with the layout of `t`.
  static tvm::ffi::Tensor view_like(tvm::ffi::TensorView t) { return host::ffi::from_blob_like(t.data_ptr(), t); }

  /// from_blob with ownership: n int64 values 0, 1, ... in malloc'd memory freed by a deleter.
  static tvm::ffi::Tensor owned_iota(int64_t n) {
    auto* data = static_cast<int64_t*>(std::malloc(static_cast<size_t>(n > 0 ? n : 1) * sizeof(int64_t)));
    for (int64_t i = 0; i < n; ++i) data[i] = i;
    return host::ffi::from_blob(data, {n}, DLDataType{kDLInt, 64, 1}, DLDevice{kDLCPU, 0}, [](void* p) {
      std::free(p);
      freed().fetch_add(1);
    });
  }

  /// How many owned buffers were freed.
  static int64_t freed_count() { return freed().load(); }

  /// ffi::empty rejects negative extents with a PanicError.
  static tvm::ffi::Tensor negative() { return host::ffi::empty({-1}, DLDataType{kDLFloat, 32, 1}, DLDevice{kDLCPU, 0}); }
};

}  // namespace headers_ffi_test
}  // namespace kernkit
