/// \file smem.cuh
/// \brief `KERNKIT_DYNAMIC_SMEM(T, name)`: a `T*` named `name` to the block's dynamic shared
/// memory, for nvcc and for the CPU emulator.
///
/// Plain `extern __shared__ T name[];` cannot be emulated in C++ (an `extern` block-scope
/// variable needs a definition whose size changes with every launch), so kernkit kernels spell
/// dynamic shared memory with this macro. The base is aligned to 16 bytes on the GPU and to 16
/// or more on the emulator.
#pragma once

#if defined(KERNKIT_EMU)
#define KERNKIT_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::kernkit::emu::dynamic_smem())
#else
#define KERNKIT_DYNAMIC_SMEM(T, name)                                 \
  extern __shared__ __align__(16) unsigned char kernkit_dynamic_smem_[]; \
  T* name = reinterpret_cast<T*>(kernkit_dynamic_smem_)
#endif
