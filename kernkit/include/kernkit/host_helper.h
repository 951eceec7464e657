/// \file host_helper.h
/// \brief `KERNKIT_HOST_HELPER`: how the shared host helpers (`TensorMatcher`'s checks,
/// `check_no_overlap`, the row checks of rows.cuh, the device queries of runtime.cuh, the call
/// boundary of export.h, the nvrtc backend's launch of utils.cuh: code that is the same in every
/// specialization) are compiled.
///
/// By default they are inline functions of the headers, compiled again by every unit that uses
/// them. A unit that links kernkit's shared helper object (the nvrtc and emu backends':
/// kernkit/jit/prebuilt.py) defines `KERNKIT_HOST_PREBUILT` before its first include of a
/// kernkit header: the headers then declare them without defining them, and the object, a unit
/// of its own built once per cache that also defines `KERNKIT_HOST_PREBUILT_IMPL`, defines
/// them. Hidden visibility: each library binds its own copy, never another's. The emulator's
/// runtime, which an emu unit's precompiled header holds, includes no header that includes this
/// one: the macros are set after the unit's first line.
#pragma once

#if defined(KERNKIT_HOST_PREBUILT)
#define KERNKIT_HOST_HELPER __attribute__((visibility("hidden")))
#else
#define KERNKIT_HOST_HELPER inline
#endif
/// \brief 1 where this unit defines the shared host helpers (see `KERNKIT_HOST_HELPER`).
#if !defined(KERNKIT_HOST_PREBUILT) || defined(KERNKIT_HOST_PREBUILT_IMPL)
#define KERNKIT_HOST_DEFINE_HELPERS 1
#else
#define KERNKIT_HOST_DEFINE_HELPERS 0
#endif

// The emulator's runtime functions (`KERNKIT_EMU_RUNTIME` in emu/sched.h) are shared code of the
// same kind: defined where the helpers are (emu builds have the emulator's root, kernkit/emu/include).
#if defined(KERNKIT_EMU) && KERNKIT_HOST_DEFINE_HELPERS
#include <kernkit/emu/sched_impl.h>
#endif
