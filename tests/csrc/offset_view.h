// Host-only helper for tests/test_byte_offset.py: a view of a tensor that starts `skip` rows in
// through DLPack's byte_offset, its data pointer left at row 0. torch always exports a byte
// offset of 0, so this is how a launcher gets to see a nonzero one.
#pragma once

#include <kernkit/ffi.h>
#include <kernkit/utils.h>

#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <vector>

namespace kernkit {

/// `t[skip:]`, expressed as `t`'s data pointer plus a byte offset.
inline tvm::ffi::Tensor offset_view(tvm::ffi::TensorView t, int64_t skip) {
  CHECK_HOST(t.ndim() >= 1 && skip >= 0 && skip <= t.size(0)) << "skip " << skip << " rows of " << t.size(0);
  std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
  shape[0] -= skip;
  const uint64_t offset = t.byte_offset() + static_cast<uint64_t>(skip * t.stride(0) * (t.dtype().bits / 8));
  return host::ffi::from_blob(t.data_ptr(), tvm::ffi::ShapeView(shape.data(), shape.size()), t.dtype(), t.device(),
                              {}, t.strides(), offset);
}

}  // namespace kernkit
