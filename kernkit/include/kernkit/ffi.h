/// \file ffi.h
/// \brief `host::ffi::`: making new `tvm::ffi::Tensor` values in a launcher -- allocating them
/// (`empty`, `empty_like`, `alloc_workspace_tensor`) or wrapping memory that already exists
/// (`from_blob`, `from_blob_like`). The counterpart of tensor.h, which checks the tensors that
/// come in.
///
/// Allocation goes through tvm-ffi's environment allocator (`TVMFFIEnvTensorAlloc`). When a
/// function is called from Python with at least one torch tensor argument, tvm-ffi installs
/// torch's allocator for the duration of the call, so the memory comes from torch's caching
/// allocator (no `cudaMalloc`), and a tensor the function returns arrives in Python as a
/// `torch.Tensor`. A call without torch tensor arguments has no allocator (`empty` then throws)
/// and returns tensors as `tvm_ffi.Tensor` (convert with `torch.from_dlpack`).
///
/// Plain C++17 with no CUDA dependency, so CPU-only modules can use it too.
#pragma once

#include <kernkit/tensor.h>
#include <kernkit/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>

namespace kernkit {
namespace host {
namespace ffi {

/// \brief A tensor shape or stride list: a braced list of `int64_t` (`{rows, cols}`), or a
/// `tvm::ffi::ShapeView` of an existing tensor. Non-owning: the values must outlive the call.
using ShapeView = tvm::ffi::ShapeView;

/// \brief Deleter for `from_blob`: called with the data pointer when the last reference to the
/// tensor goes away. An empty function means the caller keeps ownership.
using Deleter = std::function<void(void*)>;

/// \brief Allocate an uninitialized contiguous tensor through the environment allocator.
/// \param shape The shape, e.g. `{rows, static_cast<int64_t>(sizeof(Plan))}`.
/// \param dtype The element type.
/// \param device The device to allocate on.
/// \return The new tensor (it owns its memory).
inline tvm::ffi::Tensor empty(ShapeView shape, DLDataType dtype, DLDevice device) {
  for (size_t i = 0; i < shape.size(); ++i) {
    CHECK_HOST(shape[i] >= 0) << "ffi::empty: negative extent " << shape[i] << " in dimension " << i;
  }
  CHECK_HOST(TVMFFIEnvGetDLPackManagedTensorAllocator() != nullptr)
      << "ffi::empty: no environment allocator is installed. tvm-ffi installs torch's for the "
         "duration of a call that receives a torch tensor; pass one (e.g. the tensor whose device "
         "the new tensor should live on)";
  return tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, shape, dtype, device);
}

/// \brief Allocate an uninitialized contiguous tensor of C++ element type `T`.
/// \tparam T The element type (anything `host::DLDTypeOf` maps, e.g. fp16_t, int32_t).
/// \param shape The shape.
/// \param device The device to allocate on.
/// \return The new tensor (it owns its memory).
template <typename T>
inline tvm::ffi::Tensor empty(ShapeView shape, DLDevice device) {
  return empty(shape, DLDTypeOf<T>::value, device);
}

/// \brief Allocate an uninitialized contiguous tensor with the shape, dtype and device of
/// `like` (its strides are not copied: the result is always contiguous).
/// \param like An existing tensor.
/// \return The new tensor.
inline tvm::ffi::Tensor empty_like(const tvm::ffi::TensorView& like) {
  return empty(like.shape(), like.dtype(), like.device());
}

namespace detail {

/// \brief The tvm-ffi "allocator" behind `from_blob`: it hands out an existing pointer and
/// calls the deleter (if any) when the tensor dies.
struct BlobAlloc {
  /// \brief The memory to wrap.
  void* data;
  /// \brief Offset in bytes from `data` to the first element.
  uint64_t byte_offset;
  /// \brief Called with `data` on release; may be empty.
  Deleter deleter;

  /// \brief Point the tensor at the blob.
  /// \param tensor The tensor being built.
  void AllocData(DLTensor* tensor) {
    tensor->data = data;
    tensor->byte_offset = byte_offset;
  }

  /// \brief Release the blob through the deleter, if there is one.
  /// \param tensor The tensor being destroyed.
  void FreeData(DLTensor* tensor) {
    if (deleter) deleter(tensor->data);
  }
};

}  // namespace detail

/// \brief View memory that already exists as a tensor, without copying.
///
/// By default the tensor does not own the memory: keep it alive for as long as the tensor (and
/// any copy handed to Python) lives. Pass a `deleter` to transfer ownership; it then runs when
/// the last reference goes away, so the module that defines it must still be loaded then.
/// \param data The first byte of the memory (before `byte_offset`).
/// \param shape The shape.
/// \param dtype The element type.
/// \param device The device that holds the memory.
/// \param deleter Called with `data` on release; empty (the default) keeps ownership with the
///   caller.
/// \param strides Strides in elements, one per dimension; empty (the default) means contiguous.
/// \param byte_offset Offset in bytes from `data` to the first element.
/// \return The tensor view.
inline tvm::ffi::Tensor from_blob(void* data, ShapeView shape, DLDataType dtype, DLDevice device,
                                  Deleter deleter = {}, ShapeView strides = {}, uint64_t byte_offset = 0) {
  detail::BlobAlloc alloc{data, byte_offset, std::move(deleter)};
  if (strides.size() == 0 || shape.size() == 0) {
    return tvm::ffi::Tensor::FromNDAlloc(std::move(alloc), shape, dtype, device);
  }
  CHECK_HOST(strides.size() == shape.size())
      << "ffi::from_blob: " << strides.size() << " strides for " << shape.size() << " dimensions";
  return tvm::ffi::Tensor::FromNDAllocStrided(std::move(alloc), shape, strides, dtype, device);
}

/// \brief `from_blob` with the shape, dtype, device and strides of `like`.
/// \param data The first byte of the memory (before `byte_offset`).
/// \param like A tensor whose layout the view takes.
/// \param deleter Called with `data` on release; empty keeps ownership with the caller.
/// \param byte_offset Offset in bytes from `data` to the first element.
/// \return The tensor view.
inline tvm::ffi::Tensor from_blob_like(void* data, const tvm::ffi::TensorView& like, Deleter deleter = {},
                                       uint64_t byte_offset = 0) {
  const ShapeView strides = like.ndim() == 0 ? ShapeView() : like.strides();
  return from_blob(data, like.shape(), like.dtype(), like.device(), std::move(deleter), strides, byte_offset);
}

}  // namespace ffi

/// \brief Scratch memory for a launch: a 1-D uint8 tensor of `nbytes` bytes from the
/// environment allocator (torch's caching allocator when called from torch), or an empty
/// tensor when `nbytes == 0`. Keep the returned tensor in a local across every launch that
/// uses it: the memory is released when it is destroyed.
/// \param nbytes Size in bytes.
/// \param device The device to allocate on.
/// \return The workspace tensor.
inline tvm::ffi::Tensor alloc_workspace_tensor(int64_t nbytes, DLDevice device) {
  CHECK_HOST(nbytes >= 0) << "alloc_workspace_tensor: negative size " << nbytes;
  return ffi::empty({nbytes}, DLDataType{kDLUInt, 8, 1}, device);
}

}  // namespace host
}  // namespace kernkit
