"""Which CUDA architecture to build for, and what it supports."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .config import ARCH_VAR


class ArchError(RuntimeError):
    """No CUDA architecture could be chosen."""


@dataclass(frozen=True, order=True)
class CudaArch:
    """A compute capability, e.g. ``CudaArch(9, 0)`` for Hopper."""

    major: int
    minor: int

    @property
    def arch_specific(self) -> bool:
        """Whether kernkit builds the arch-specific target (``sm_90a``, ``sm_100a``...).

        Hopper and later gate their newest instructions (wgmma, setmaxnreg, the tensor memory
        accelerator paths) behind the ``a`` targets; code built for them runs only on that exact
        compute capability, which is what a JIT build wants anyway.
        """
        return self.major >= 9

    @property
    def sm(self) -> str:
        """The target name without prefix: ``90a``, ``89``..."""
        return f"{self.major}{self.minor}{'a' if self.arch_specific else ''}"

    @property
    def nvcc_flags(self) -> tuple[str, ...]:
        """The ``-gencode`` flag for exactly this architecture (one target keeps builds fast)."""
        return (f"-gencode=arch=compute_{self.sm},code=sm_{self.sm}",)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @classmethod
    def parse(cls, text: str) -> CudaArch:
        """Parse ``9.0``, ``9.0a``, ``90``, ``sm_90a``."""
        # Plain string tests rather than a regular expression: this runs on every load (from
        # $KERNKIT_CUDA_ARCH), whose key computation is kept to string work.
        t = text.strip().lower().removeprefix("sm_").removeprefix("compute_").rstrip("a")
        major, dot, minor = t.partition(".")
        if not dot and len(t) >= 2:
            major, minor = t[:-1], t[-1:]
        if not (major.isascii() and major.isdigit() and minor.isascii() and minor.isdigit()):
            raise ArchError(f"cannot parse CUDA architecture {text!r}; expected e.g. '9.0' or 'sm_90'")
        return cls(int(major), int(minor))


def target_arch() -> CudaArch:
    """The architecture to build for: the current CUDA device's when one is visible, otherwise
    ``$KERNKIT_CUDA_ARCH``, otherwise an ``ArchError`` that says how to set it."""
    if torch.cuda.is_available():
        return CudaArch(*torch.cuda.get_device_capability())
    text = os.environ.get(ARCH_VAR)
    if text:
        return CudaArch.parse(text)
    raise ArchError(
        "no CUDA device is visible, so kernkit cannot tell which GPU to build for; set "
        f"{ARCH_VAR} to the target's compute capability (e.g. {ARCH_VAR}=9.0 for H100/H200). CPU tensors "
        "need no GPU build: kernkit's ops run them on its CPU emulator, and a kernel of your own does with "
        "backend=\"emu\""
    )


def is_arch_support_pdl() -> bool:
    """Whether the target supports Programmatic Dependent Launch (sm_90 and newer)."""
    return target_arch().major >= 9
