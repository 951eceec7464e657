/// \file export.h
/// \brief `KERNKIT_EXPORT(name, function)`: a host function as the tvm-ffi symbol
/// `__tvm_ffi_<name>` that `tvm_ffi.load_module` finds, as `TVM_FFI_DLL_EXPORT_TYPED_FUNC`
/// makes it, with the same argument conversions (tvm-ffi's `TypeTraits`: a tensor from a DLTensor
/// pointer or a `tvm::ffi::Tensor`, a float from an int, ...).
///
/// Every spec's generated unit exports its wrappers with it. What tvm-ffi's macro instantiates
/// for each function (the exception boundary, the argument count check, a signature string for
/// its messages) is one shared host helper here (`KERNKIT_HOST_HELPER`), so a specialization's
/// host compile emits only the conversions and the call: about a third of the host half of an
/// nvrtc build (docs/performance.md). A mismatched argument raises tvm-ffi's `TypeError`
/// naming the function, the argument's index and both types, without the signature.
#pragma once

#include <kernkit/host_helper.h>

#include <tvm/ffi/any.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/type_traits.h>
#if defined(KERNKIT_HOST_PREBUILT)
#include <tvm/ffi/container/tensor.h>  // TensorView: its conversion is in the helper object
#endif

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

namespace kernkit {
namespace host {
namespace exported {

/// \brief A function's call with its arguments unpacked: `body(args, result)`.
using Body = void (*)(const TVMFFIAny* args, TVMFFIAny* result);

/// \brief Run `body` as a tvm-ffi safe call: check that `num_args` is `want`, then call it,
/// turning an exception into the raised error (`tvm::ffi::Error` as it is, any other
/// `std::exception` as an `InternalError`). Returns 0, or -1 with the error raised.
KERNKIT_HOST_HELPER int call(Body body, const TVMFFIAny* args, int32_t num_args, int32_t want, TVMFFIAny* result,
                             const char* name) noexcept;
#if KERNKIT_HOST_DEFINE_HELPERS
KERNKIT_HOST_HELPER int call(Body body, const TVMFFIAny* args, int32_t num_args, int32_t want, TVMFFIAny* result,
                             const char* name) noexcept {
  try {
    if (num_args != want) {
      TVM_FFI_THROW(TypeError) << "Mismatched number of arguments when calling: `" << name << "`. Expected " << want
                               << " but got " << num_args << " arguments";
    }
    body(args, result);
    return 0;
  } catch (const ::tvm::ffi::Error& err) {
    ::tvm::ffi::detail::SetSafeCallRaised(err);
  } catch (const std::exception& ex) {
    ::tvm::ffi::detail::SetSafeCallRaised(::tvm::ffi::Error("InternalError", ex.what(), ""));
  }
  return -1;
}
#endif

/// \brief Throw tvm-ffi's `TypeError` for argument `index` of `name`, expected of type
/// `expected`, given `got`.
[[noreturn]] KERNKIT_HOST_HELPER void mismatch(const char* name, int32_t index, const std::string& expected,
                                               const TVMFFIAny& got);
#if KERNKIT_HOST_DEFINE_HELPERS
[[noreturn]] KERNKIT_HOST_HELPER void mismatch(const char* name, int32_t index, const std::string& expected,
                                               const TVMFFIAny& got) {
  TVM_FFI_THROW(TypeError) << "Mismatched type on argument #" << index << " when calling: `" << name
                           << "`. Expected `" << expected << "` but got `"
                           << ::tvm::ffi::TypeIndexToTypeKey(got.type_index) << "`";
  TVM_FFI_UNREACHABLE();
}
#endif

/// \brief Argument `index` of `args` as a `T`, converted as tvm-ffi's own export converts it
/// (`AnyView` and `Any` as they are, any other type by `AnyView::try_cast`); `mismatch` where
/// there is no conversion. The launchers' usual parameter types are instantiated once, in the
/// prebuilt helper object (below): tvm-ffi's conversions build their own
/// errors, code a unit would otherwise compile again.
template <typename T>
T arg(const TVMFFIAny* args, int32_t index, const char* name) {
  const ::tvm::ffi::AnyView& view = reinterpret_cast<const ::tvm::ffi::AnyView*>(args)[index];
  if constexpr (std::is_same_v<T, ::tvm::ffi::AnyView>) {
    return view;
  } else if constexpr (std::is_same_v<T, ::tvm::ffi::Any>) {
    return ::tvm::ffi::Any(view);
  } else {
    if (auto value = view.template try_cast<T>()) return *std::move(value);
    mismatch(name, index, ::tvm::ffi::TypeTraits<T>::TypeStr(), args[index]);
  }
}

// The parameter types whose `arg` the prebuilt helper object holds (instantiated there,
// declared in the units that link it).
#if defined(KERNKIT_HOST_PREBUILT_IMPL)
#define KERNKIT_EXPORT_ARG(T) template T arg<T>(const TVMFFIAny*, int32_t, const char*);
#elif defined(KERNKIT_HOST_PREBUILT)
#define KERNKIT_EXPORT_ARG(T) extern template T arg<T>(const TVMFFIAny*, int32_t, const char*);
#else
#define KERNKIT_EXPORT_ARG(T)
#endif
KERNKIT_EXPORT_ARG(::tvm::ffi::TensorView)
KERNKIT_EXPORT_ARG(float)
KERNKIT_EXPORT_ARG(double)
KERNKIT_EXPORT_ARG(int64_t)
KERNKIT_EXPORT_ARG(bool)
#undef KERNKIT_EXPORT_ARG

/// \brief Call `f` with `args` converted to its parameter types; a result goes into `result`
/// as a `tvm::ffi::Any`.
template <typename R, typename... Params, size_t... I>
inline void invoke(R (*f)(Params...), const TVMFFIAny* args, TVMFFIAny* result, const char* name,
                   std::index_sequence<I...>) {
  if constexpr (std::is_void_v<R>) {
    f(arg<std::decay_t<Params>>(args, static_cast<int32_t>(I), name)...);
  } else {
    *reinterpret_cast<::tvm::ffi::Any*>(result) = R(f(arg<std::decay_t<Params>>(args, static_cast<int32_t>(I), name)...));
  }
}

/// \brief The number of parameters of a function.
template <typename R, typename... Params>
constexpr int32_t arity(R (*)(Params...)) {
  return static_cast<int32_t>(sizeof...(Params));
}

}  // namespace exported
}  // namespace host
}  // namespace kernkit

/// \brief Export `Function` (a function, written in parentheses where its template arguments
/// hold commas) as `__tvm_ffi_<Name>`.
#define KERNKIT_EXPORT(Name, Function)                                                                         \
  extern "C" TVM_FFI_DLL_EXPORT int __tvm_ffi_##Name(void*, const TVMFFIAny* args, int32_t num_args,           \
                                                     TVMFFIAny* result) {                                      \
    return ::kernkit::host::exported::call(                                                                    \
        [](const TVMFFIAny* a, TVMFFIAny* r) {                                                                 \
          ::kernkit::host::exported::invoke(                                                                   \
              &Function, a, r, #Name, std::make_index_sequence<::kernkit::host::exported::arity(&Function)>{}); \
        },                                                                                                     \
        args, num_args, ::kernkit::host::exported::arity(&Function), result, #Name);                           \
  }
