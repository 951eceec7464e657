"""The prebuilt helper object (``kernkit/jit/prebuilt.py``): never on a build's path (a build
that finds none compiles the helpers inline and a detached process makes the object after it);
copied into the later builds of the same compiler setup and linked with hidden symbols; not used
when its bytes do not match its record; a failed maker publishes nothing and is not retried."""

from __future__ import annotations

import ctypes
import sys
import time

import pytest
import torch

from kernkit.jit import maker, prebuilt
from kernkit.ops.elementwise import scale_spec

#: ``kernkit::host::TensorMatcher::verify(tvm::ffi::TensorView const&, char const*) const``
VERIFY = b"_ZNK7kernkit4host13TensorMatcher6verifyERKN3tvm3ffi10TensorViewEPKc"


def _folders(cache):
    return list((cache / "v2" / "helpers").glob("*"))


def _wait_for_object(cache, limit: float = 300.0):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        folders = _folders(cache)
        if folders and all(maker.verified(f, prebuilt.OBJECT) for f in folders):
            return folders
        time.sleep(0.1)
    raise AssertionError(f"no helper object after {limit} s")


def _check_scale(module, dtype):
    src = torch.arange(8, dtype=torch.float32).to(dtype)
    out = torch.empty_like(src)
    module.scale(out, src, 2.0)
    assert torch.equal(out, src * 2)


def _linked(lib) -> bool:
    """Whether a build linked the prebuilt object (its unit starts with ``prebuilt.USE``)."""
    unit = (lib.parent / "kernel_emu.cc").read_text()
    assert unit.startswith(prebuilt.USE) == (lib.parent / prebuilt.OBJECT).is_file()
    return unit.startswith(prebuilt.USE)


@pytest.fixture
def made(fresh_cache, monkeypatch):
    """A cache whose first build (scale fp32, emu) is done and whose helper object is made."""
    monkeypatch.setattr(maker, "_asked", set())  # as in a new process
    first = scale_spec(torch.float32, "emu")
    lib = first.build()
    assert not _linked(lib)  # the helpers inline: nothing waited for the object
    _check_scale(first.build_and_load(), torch.float32)
    (folder,) = _wait_for_object(fresh_cache)
    return folder


def test_later_builds_link_a_copy_of_the_object(made):
    spec = scale_spec(torch.float16, "emu")
    lib = spec.build()
    assert _linked(lib)
    assert (lib.parent / prebuilt.OBJECT).read_bytes() == (made / prebuilt.OBJECT).read_bytes()
    _check_scale(spec.build_and_load(), torch.float16)


def test_the_library_keeps_its_helpers_to_itself(made):
    """Linked with hidden visibility: in the library, but not exported, so another library (an
    older kernkit's, say) never binds to this one's copy, nor this one to another's."""
    lib = scale_spec(torch.float16, "emu").build()
    assert _linked(lib)
    assert VERIFY in (made / prebuilt.OBJECT).read_bytes() and VERIFY in lib.read_bytes()
    assert not hasattr(ctypes.CDLL(str(lib)), VERIFY.decode())


def test_an_object_that_does_not_match_its_record_is_not_used(made, fresh_cache, monkeypatch):
    good = (made / prebuilt.OBJECT).read_bytes()
    (made / prebuilt.OBJECT).write_bytes(good[:-64] + b"\0" * 64)  # not what its record names
    monkeypatch.setattr(maker, "_asked", set())
    spec = scale_spec(torch.bfloat16, "emu")
    lib = spec.build()
    assert not _linked(lib)  # inline, and the object is made again
    _check_scale(spec.build_and_load(), torch.bfloat16)
    _wait_for_object(fresh_cache)
    assert (made / prebuilt.OBJECT).read_bytes() == good


def test_a_failed_maker_publishes_nothing_and_is_not_retried(fresh_cache, monkeypatch):
    """A compile that fails leaves failed.log and no object; later builds keep the helpers
    inline and ask for no maker again."""
    monkeypatch.setattr(maker, "_asked", set())
    monkeypatch.setattr(maker, "_queued", [])  # the maker runs here, not detached
    build_dir = fresh_cache / "v2" / ".staging" / "b"
    build_dir.mkdir(parents=True)
    fail = [sys.executable, "-c", "import sys; sys.exit(3)"]
    assert not prebuilt.stage(build_dir, "k" * 16, fail)
    args = maker._queued.pop()
    assert args[0] == str(fresh_cache / "v2" / ".locks" / f"helpers-{'k' * 16}.lock")
    assert maker.make(args[0], args[1], args[2], args[3:]) == 1
    folder = fresh_cache / "v2" / "helpers" / ("k" * 16)
    assert (folder / "failed.log").is_file() and not (folder / prebuilt.OBJECT).exists()
    maker._asked.clear()  # a new process
    assert not prebuilt.stage(build_dir, "k" * 16, fail) and not maker._queued


def test_the_key_leaves_out_forced_includes():
    """A unit compiled with the precompiled prelude and one compiled without it get the same
    object; any other flag gives another."""
    base = ["c++", "-std=c++17", "-O2", "-Ihost"]
    with_pch = ["c++", "-std=c++17", "-O2", "-include", "/cache/v2/pch/k/prelude.h", "-Ihost"]
    assert prebuilt.key(base, ["id"]) == prebuilt.key(with_pch, ["id"])
    assert prebuilt.key(base, ["id"]) != prebuilt.key([*base, "-DX"], ["id"])
    assert prebuilt.key(base, ["id"]) != prebuilt.key(base, ["other compiler"])
