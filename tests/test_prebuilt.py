"""The shared helper object (``kernkit/jit/prebuilt.py``): a build that finds none compiles it
beside its unit and publishes it once done; the later builds of the same compiler setup link a
copy, with hidden symbols; a copy whose bytes do not match its record is not used."""

from __future__ import annotations

import ctypes

import filelock
import pytest
import torch

from kernkit.jit import maker, prebuilt
from kernkit.ops.scale import scale_spec

#: ``kernkit::host::TensorMatcher::verify(tvm::ffi::TensorView const&, char const*) const``
VERIFY = b"_ZNK7kernkit4host13TensorMatcher6verifyERKN3tvm3ffi10TensorViewEPKc"


def _check_scale(module, dtype):
    src = torch.arange(8, dtype=torch.float32).to(dtype)
    out = torch.empty_like(src)
    module.scale(out, src, 2.0)
    assert torch.equal(out, src * 2)


def _compiled_its_own(lib) -> bool:
    """Whether a build compiled the helper object (else it linked a copy); either way its unit
    starts with ``prebuilt.USE`` and its directory holds the object it linked."""
    unit = (lib.parent / "kernel_emu.cc").read_text()
    assert unit.startswith(prebuilt.USE) and (lib.parent / prebuilt.OBJECT).is_file()
    return (lib.parent / prebuilt.UNIT).is_file()


@pytest.fixture
def made(empty_cache):
    """A cache whose first build (scale fp32, emu) is done: it compiled the object and published it."""
    first = scale_spec(torch.float32, "emu")
    lib = first.build()
    assert _compiled_its_own(lib)
    _check_scale(first.build_and_load(), torch.float32)
    (folder,) = (empty_cache / "v2" / "helpers").iterdir()
    assert maker.verified(folder, prebuilt.OBJECT)  # published when the build was done
    assert (folder / prebuilt.OBJECT).read_bytes() == (lib.parent / prebuilt.OBJECT).read_bytes()
    return folder


def test_later_builds_link_a_copy_of_the_object(made):
    spec = scale_spec(torch.float16, "emu")
    lib = spec.build()
    assert not _compiled_its_own(lib)
    assert (lib.parent / prebuilt.OBJECT).read_bytes() == (made / prebuilt.OBJECT).read_bytes()
    _check_scale(spec.build_and_load(), torch.float16)


def test_the_library_keeps_its_helpers_to_itself(made):
    """Linked with hidden visibility: in the library, but not exported, so another library (an
    older kernkit's, say) never binds to this one's copy, nor this one to another's."""
    lib = scale_spec(torch.float16, "emu").build()
    assert VERIFY in (made / prebuilt.OBJECT).read_bytes() and VERIFY in lib.read_bytes()
    assert not hasattr(ctypes.CDLL(str(lib)), VERIFY.decode())


def test_an_object_that_does_not_match_its_record_is_not_used(made):
    """The build compiles its own, and publishes it in place of the damaged one."""
    good = (made / prebuilt.OBJECT).read_bytes()
    (made / prebuilt.OBJECT).write_bytes(good[:-64] + b"\0" * 64)  # not what its record names
    spec = scale_spec(torch.bfloat16, "emu")
    lib = spec.build()
    assert _compiled_its_own(lib)
    _check_scale(spec.build_and_load(), torch.bfloat16)
    assert maker.verified(made, prebuilt.OBJECT) and (made / prebuilt.OBJECT).read_bytes() == good


def test_a_build_leaves_the_publishing_to_the_holder_of_the_lock(made):
    """While another process holds the object's lock, a build publishes nothing (and waits for
    nothing): the holder is publishing the same object."""
    (made / prebuilt.OBJECT).unlink()
    with filelock.FileLock(str(maker.lock_of(made))):
        lib = scale_spec(torch.bfloat16, "emu").build()
        assert _compiled_its_own(lib) and not (made / prebuilt.OBJECT).exists()


def test_the_key_leaves_out_forced_includes():
    """A unit compiled with the precompiled prelude and one compiled without it get the same
    object; any other flag gives another."""
    base = ["c++", "-std=c++17", "-O2", "-Ihost"]
    with_pch = ["c++", "-std=c++17", "-O2", "-include", "/cache/v2/pch/k/prelude.h", "-Ihost"]
    assert prebuilt.key(base, ["id"]) == prebuilt.key(with_pch, ["id"])
    assert prebuilt.key(base, ["id"]) != prebuilt.key([*base, "-DX"], ["id"])
    assert prebuilt.key(base, ["id"]) != prebuilt.key(base, ["other compiler"])
