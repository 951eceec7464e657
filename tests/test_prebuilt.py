"""The prebuilt helper object (``kernkit/jit/prebuilt.py``): compiled by the first build that
needs it, beside its unit; copied into every later build of the same compiler setup; not used
when its bytes do not match its record; linked into each library with hidden symbols, so that a
library carries its own copy."""

from __future__ import annotations

import ctypes
import json

import torch

from kernkit.jit import prebuilt
from kernkit.ops.elementwise import scale_spec

#: ``kernkit::host::TensorMatcher::verify(tvm::ffi::TensorView const&, char const*) const``
VERIFY = b"_ZNK7kernkit4host13TensorMatcher6verifyERKN3tvm3ffi10TensorViewEPKc"


def _objects(cache):
    return list((cache / "v2" / "helpers").glob("*/" + prebuilt.OBJECT))


def _check_scale(module, dtype):
    src = torch.arange(8, dtype=torch.float32).to(dtype)
    out = torch.empty_like(src)
    module.scale(out, src, 2.0)
    assert torch.equal(out, src * 2)


def test_the_first_build_makes_the_object_and_later_ones_copy_it(fresh_cache):
    first = scale_spec(torch.float32, "emu")
    lib = first.build()
    _check_scale(first.build_and_load(), torch.float32)
    (cached,) = _objects(fresh_cache)
    assert (lib.parent / "helpers.cc").is_file()  # compiled in that build
    assert json.loads((cached.parent / "helpers.json").read_text())["sha256"]
    assert VERIFY in cached.read_bytes()

    later = scale_spec(torch.float16, "emu")
    lib2 = later.build()
    _check_scale(later.build_and_load(), torch.float16)
    assert not (lib2.parent / "helpers.cc").exists()  # copied, not compiled
    assert (lib2.parent / prebuilt.OBJECT).read_bytes() == cached.read_bytes()
    assert "rule helpers" not in (lib2.parent / "build.ninja").read_text()
    assert _objects(fresh_cache) == [cached]


def test_an_object_that_does_not_match_its_record_is_not_used(fresh_cache):
    scale_spec(torch.float32, "emu").build()
    (cached,) = _objects(fresh_cache)
    good = cached.read_bytes()
    cached.write_bytes(good[:-64] + b"\0" * 64)  # not what its record names
    spec = scale_spec(torch.bfloat16, "emu")
    lib = spec.build()
    assert (lib.parent / "helpers.cc").is_file()  # built its own
    _check_scale(spec.build_and_load(), torch.bfloat16)
    assert cached.read_bytes() == good  # and published it again


def test_the_library_keeps_its_helpers_to_itself(fresh_cache):
    """The helpers are linked in with hidden visibility: not exported, so another library (an
    older kernkit's, say) never binds to this one's copy, nor this one to another's."""
    lib = scale_spec(torch.float32, "emu").build()
    assert VERIFY in lib.read_bytes()  # in the library (a local symbol of its symbol table)
    handle = ctypes.CDLL(str(lib))
    assert not hasattr(handle, VERIFY.decode())


def test_the_key_leaves_out_forced_includes():
    """A unit compiled with the precompiled prelude and one compiled without it get the same
    object; any other flag gives another."""
    base = ["c++", "-std=c++17", "-O2", "-Ihost"]
    with_pch = ["c++", "-std=c++17", "-O2", "-include", "/cache/v2/pch/k/prelude.h", "-Ihost"]
    assert prebuilt.key(base, ["id"]) == prebuilt.key(with_pch, ["id"])
    assert prebuilt.key(base, ["id"]) != prebuilt.key([*base, "-DX"], ["id"])
    assert prebuilt.key(base, ["id"]) != prebuilt.key(base, ["other compiler"])
