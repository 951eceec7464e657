/// \file dispatch.h
/// \brief `DispatchTable`: an op's specializations keyed on one tensor argument, so that an
/// eager call finds its specialization in C++ instead of in Python.
///
/// An op's specialization depends on one tensor only (the KV cache, the embedding table): its
/// dtype, its device type and its row shape (the shape without the first dimension, which is a
/// pool or vocabulary size and does not change the kernel). `DispatchKey` is exactly that, read
/// from the `DLTensor` that tvm-ffi already made for the call. `make_dispatch_functions` wraps a
/// table in two packed functions:
///
/// - `call(*args)`: when `args[arg_index]` is a tensor whose key is in the table, forwards all
///   arguments unchanged (no re-boxing, no second DLPack conversion) to the stored function and
///   returns true; otherwise calls nothing and returns false, and the op takes its slow path.
/// - `add(tensor, fn)`: stores `fn` under the key of `tensor`; returns whether it was stored.
///
/// A table holds a handful of keys (one per dtype and row shape an op meets), so lookup is a
/// linear scan. Entries are never changed or removed once published, which lets `call` read
/// without a lock: `add` fills the next free slot under a mutex and then publishes it by
/// incrementing the size with a release store; `call` reads the size with an acquire load and
/// scans only the slots below it.
///
/// \code
///   auto [call, add] = make_dispatch_functions(0);  // key on the first argument
///   add(k_cache, store_cache_fn);                   // after a call through the slow path
///   bool hit = call(k_cache, v_cache, indices, k, v).cast<bool>();
/// \endcode
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/container/tuple.h>
#include <tvm/ffi/function.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

namespace kernkit {
namespace host {

/// \brief What a dispatch table keys on: one tensor's dtype, device type, rank and shape after
/// the first dimension. Two tensors with equal keys select the same specialization.
struct DispatchKey {
  /// \brief The largest rank that is cached; a tensor of more dimensions (or of none) never
  /// gets a key, so every call with it misses.
  static constexpr int32_t kMaxRank = 6;

  /// \brief `DLDataType` code, bits and lanes packed as `code | bits << 8 | lanes << 16`.
  uint32_t dtype = 0;
  /// \brief `DLDeviceType` of the tensor (the device id is not part of the key).
  int32_t device_type = 0;
  /// \brief Number of dimensions, 1 to `kMaxRank`.
  int32_t ndim = 0;
  /// \brief `shape[1 .. ndim)`; entries past `ndim - 1` stay zero.
  int64_t row_shape[kMaxRank - 1] = {};

  /// \brief The key of `tensor`, or `std::nullopt` when it is 0-d or has more than `kMaxRank`
  /// dimensions.
  /// \param tensor The tensor to describe.
  /// \return The key, or `std::nullopt`.
  static std::optional<DispatchKey> of(const DLTensor& tensor) noexcept {
    if (tensor.ndim < 1 || tensor.ndim > kMaxRank) return std::nullopt;
    DispatchKey key;
    key.dtype = static_cast<uint32_t>(tensor.dtype.code) | static_cast<uint32_t>(tensor.dtype.bits) << 8 |
                static_cast<uint32_t>(tensor.dtype.lanes) << 16;
    key.device_type = static_cast<int32_t>(tensor.device.device_type);
    key.ndim = tensor.ndim;
    for (int32_t i = 1; i < tensor.ndim; ++i) key.row_shape[i - 1] = tensor.shape[i];
    return key;
  }

  /// \brief Whether two keys are equal (every field).
  bool operator==(const DispatchKey& other) const noexcept {
    if (dtype != other.dtype || device_type != other.device_type || ndim != other.ndim) return false;
    for (int32_t i = 0; i + 1 < ndim; ++i) {
      if (row_shape[i] != other.row_shape[i]) return false;
    }
    return true;
  }
};

/// \brief A small append-only map from `DispatchKey` to `tvm::ffi::Function`: lock-free
/// lookups, adds serialized by a mutex, at most `kCapacity` entries (later adds are ignored).
class DispatchTable {
 public:
  /// \brief The most keys a table holds. An op meets one per dtype and row shape, so a model
  /// needs a few; past the cap the op keeps working through its slow path.
  static constexpr int32_t kCapacity = 16;

  DispatchTable() = default;
  DispatchTable(const DispatchTable&) = delete;
  DispatchTable& operator=(const DispatchTable&) = delete;

  /// \brief The function stored under the key of `tensor`, or nullptr.
  ///
  /// The pointer stays valid for the life of the table: entries are never changed or removed.
  /// \param tensor The tensor whose key to look up.
  /// \return The stored function, or nullptr when the key is absent or cannot be cached.
  const tvm::ffi::Function* find(const DLTensor& tensor) const noexcept {
    const std::optional<DispatchKey> key = DispatchKey::of(tensor);
    if (!key) return nullptr;
    const int32_t n = size_.load(std::memory_order_acquire);
    for (int32_t i = 0; i < n; ++i) {
      if (entries_[i].key == *key) return &entries_[i].fn;
    }
    return nullptr;
  }

  /// \brief Store `fn` under the key of `tensor`.
  /// \param tensor A tensor whose key selects `fn`.
  /// \param fn The function to call for tensors of that key.
  /// \return True when stored; false when the key is already present (the first function
  ///   stays), cannot be cached, or the table is full.
  bool add(const DLTensor& tensor, tvm::ffi::Function fn) {
    const std::optional<DispatchKey> key = DispatchKey::of(tensor);
    if (!key || fn == nullptr) return false;
    std::lock_guard<std::mutex> lock(add_mutex_);
    const int32_t n = size_.load(std::memory_order_relaxed);
    for (int32_t i = 0; i < n; ++i) {
      if (entries_[i].key == *key) return false;
    }
    if (n >= kCapacity) return false;
    // Slot n is invisible to readers until the release store below publishes it.
    entries_[n].key = *key;
    entries_[n].fn = std::move(fn);
    size_.store(n + 1, std::memory_order_release);
    return true;
  }

  /// \brief The number of stored entries.
  int32_t size() const noexcept { return size_.load(std::memory_order_acquire); }

 private:
  struct Entry {
    DispatchKey key;
    tvm::ffi::Function fn{nullptr};
  };

  Entry entries_[kCapacity];
  std::atomic<int32_t> size_{0};
  std::mutex add_mutex_;
};

/// \brief The `call` and `add` packed functions over one new `DispatchTable` (see the file
/// comment), which both keep alive.
/// \param arg_index The position of the tensor argument that `call` keys on.
/// \return `(call, add)`.
inline tvm::ffi::Tuple<tvm::ffi::Function, tvm::ffi::Function> make_dispatch_functions(int32_t arg_index) {
  using tvm::ffi::Any;
  using tvm::ffi::AnyView;
  using tvm::ffi::Function;
  auto table = std::make_shared<DispatchTable>();
  Function call = Function::FromPacked([table, arg_index](const AnyView* args, int32_t num_args, Any* rv) {
    if (arg_index < num_args) {
      const std::optional<DLTensor*> tensor = args[arg_index].try_cast<DLTensor*>();
      if (tensor && *tensor != nullptr) {
        if (const Function* fn = table->find(**tensor)) {
          fn->CallPacked(args, num_args, rv);
          *rv = true;
          return;
        }
      }
    }
    *rv = false;
  });
  Function add = Function::FromTyped([table](DLTensor* tensor, Function fn) {
    return tensor != nullptr && table->add(*tensor, std::move(fn));
  });
  return tvm::ffi::Tuple<Function, Function>(std::move(call), std::move(add));
}

}  // namespace host
}  // namespace kernkit
