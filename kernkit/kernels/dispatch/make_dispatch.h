/// \file make_dispatch.h
/// \brief `make_dispatch`: the host module behind the ops' C++ dispatch
/// (`kernkit/ops/dispatch.py`). Plain C++, no CUDA needed.
#pragma once

#include <kernkit/dispatch.h>
#include <kernkit/utils.h>

#include <tvm/ffi/container/tuple.h>
#include <tvm/ffi/function.h>

#include <cstdint>

namespace kernkit {

/// \brief The most arguments an op's dispatch may look past to find its key tensor.
inline constexpr int64_t kMaxDispatchArgIndex = 63;

/// \brief A new, empty dispatch table keyed on argument `arg_index`, as its `(call, add)`
/// functions (see `host::make_dispatch_functions`). Each op makes its own table.
/// \param arg_index The position of the key tensor among the op's arguments.
/// \return `(call, add)`.
inline tvm::ffi::Tuple<tvm::ffi::Function, tvm::ffi::Function> make_dispatch(int64_t arg_index) {
  KERNKIT_CHECK(arg_index >= 0 && arg_index <= kMaxDispatchArgIndex, ValueError)
      << "make_dispatch: arg_index must be in [0, " << kMaxDispatchArgIndex << "], got " << arg_index;
  return host::make_dispatch_functions(static_cast<int32_t>(arg_index));
}

}  // namespace kernkit
