"""``cache import`` treats an archive as input: it is checked whole before anything is written,
each build is bound to the key its record requests, records are type-checked, and the cache
tools pass over a damaged entry by name. CPU builds, through the CPU emulator."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import torch

from kernkit.cli import cache as tool
from kernkit.cli import cli
from kernkit.jit import JitDisabledError, JitSpec, cache
from kernkit.jit.paths import KERNELS_DIR
from kernkit.ops.act_and_mul import act_and_mul_spec
from kernkit.ops.scale import scale_spec

REPO = Path(__file__).resolve().parent.parent


def _members(archive: Path) -> tuple[list[dict], dict[str, bytes]]:
    """The index entries and the other members of an archive."""
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    return json.loads(files.pop("index.json"))["builds"], files


def _write(out: Path, index: object, files: dict[str, bytes], extra: tuple[tarfile.TarInfo, ...] = ()) -> Path:
    """A .tar.gz with ``index`` as its index.json's ``builds``, then ``files``, then ``extra``."""
    with tarfile.open(out, "w:gz") as tar:
        for name, data in [("index.json", json.dumps({"format": 1, "builds": index}).encode()), *files.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return out


def _moved(archive: Path, out: Path, new_dir: str, edit=None) -> Path:
    """``archive``'s one build moved to ``new_dir`` (index and members); ``edit(record)`` changes
    its record in place."""
    (entry,), files = _members(archive)
    old = entry["dir"]
    moved = {name.replace(old, new_dir, 1): data for name, data in files.items()}
    if edit is not None:
        meta = json.loads(moved[f"{new_dir}/meta.json"])
        edit(meta)
        moved[f"{new_dir}/meta.json"] = json.dumps(meta).encode()
    return _write(out, [{**entry, "dir": new_dir}], moved)


def _exported(top: Path, dtypes: tuple[torch.dtype, ...]) -> tuple[Path, list[str]]:
    """Build scale (emu) for each of ``dtypes`` in the cache ``top / "cache"``, starting no
    detached maker for it, and export them to ``top / "x.tar.gz"``. Returns the archive and
    the builds' directories relative to the cache's v2: what a module's tests share."""
    from kernkit.jit import maker

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNKIT_CACHE_DIR", str(top / "cache"))
        mp.setattr(maker, "_asked", set())
        mp.setattr(maker, "_queued", [])
        mp.setattr(maker, "start", lambda: None)
        builds = [scale_spec(dtype, "emu").build().parent for dtype in dtypes]
        assert tool.export_builds(top / "x.tar.gz") == len(dtypes)
    return top / "x.tar.gz", [b.relative_to(top / "cache" / "v2").as_posix() for b in builds]


@pytest.fixture(scope="module")
def shipped_archive(tmp_path_factory) -> tuple[Path, str]:
    """An archive of ``scale<fp32_t, false>`` (emu), made once for this module, and the build's
    directory relative to the cache's v2."""
    archive, builds = _exported(tmp_path_factory.mktemp("shipped"), (torch.float32,))
    return archive, builds[0]


@pytest.fixture
def shipped(shipped_archive, into_b) -> tuple[Path, str]:
    """``shipped_archive``, for a test that runs in the empty cache ``b``. Yields (archive, the
    build's directory relative to the cache's v2)."""
    return shipped_archive


def _import(*args: str, capsys) -> tuple[int, str, str]:
    rc = cli.main(["cache", "import", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def _published(top: Path) -> list[str]:
    return sorted(p.parent.relative_to(top).as_posix() for p in top.glob("v2/**/meta.json"))


# 1 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["name/./.", "././.", "trailing slash"])
def test_an_index_dir_that_is_not_a_build_directory_is_refused_and_deletes_nothing(tmp_path, shipped, capsys, shape):
    """``scale/./.`` resolved to the kernel's directory, ``././.`` to the cache root, and a
    trailing slash to the key directory: publishing onto them discarded every build there."""
    archive, build = shipped
    assert _import(archive, capsys=capsys)[0] == 0  # the genuine build, already in cache b
    before = _published(tmp_path / "b")
    assert before == [f"v2/{build}"]
    new_dir = {"name/./.": "scale/./.", "././.": "././.", "trailing slash": build.rsplit("/", 1)[0] + "/"}[shape]
    rc, _, err = _import(_moved(archive, tmp_path / "bad.tar.gz", new_dir), capsys=capsys)
    assert rc == 2 and "is not a kernkit cache archive: entry 1's dir" in err, err
    assert _published(tmp_path / "b") == before
    assert cache.read_build(tmp_path / "b" / "v2" / build) is not None


# 2 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("digest", ["../../../y/", "../../y/"])
def test_an_index_sha256_that_is_a_path_creates_nothing_outside_the_cache(tmp_path, shipped, capsys, digest):
    archive, _ = shipped
    (entry,), files = _members(archive)
    bad = _write(tmp_path / "bad.tar.gz", [{**entry, "sha256": digest}], files)
    rc, _, err = _import(bad, capsys=capsys)
    assert rc == 2 and "entry 1's sha256" in err and "is not 64 hex digits" in err, err
    assert not (tmp_path / "y").exists() and not (tmp_path / "b" / "y").exists()
    assert not (tmp_path / "b").exists(), "nothing at all is written for an archive refused whole"


# 3 -------------------------------------------------------------------------------------------

CONSTRUCTOR = textwrap.dedent("""\
    #include <cstdio>
    __attribute__((constructor)) static void kernkit_test_runs_at_load() {
      if (FILE* f = std::fopen("MARK", "w")) std::fclose(f);
    }
    """)


@pytest.mark.parametrize("record", ["as built", "key rewritten"])
def test_a_library_placed_under_a_shipped_ops_key_is_refused_and_never_runs(tmp_path, monkeypatch, capsys, record):
    """A genuine build of another ``scale<fp32_t, false>`` (a user header whose library runs code
    when loaded) placed under the shipped op's key: refused, so ``ops.scale`` never loads it.
    With its record's key rewritten to the shipped one, the key recomputed from the record's
    build request still differs."""
    mark = tmp_path / "ran"
    header = tmp_path / "user" / "scale.cuh"
    header.parent.mkdir()
    header.write_text((KERNELS_DIR / "elementwise" / "scale.cuh").read_text() + CONSTRUCTOR.replace("MARK", str(mark)))
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "a"))
    evil = JitSpec.make("scale", "fp32_t", "false", cuda_files=[str(header)],
                        cuda_wrappers=[("scale", "scale<fp32_t, false>")], backend="emu")
    build = evil.build().parent
    evil.build_and_load()  # the constructor works: it runs when the library is loaded
    assert mark.exists()
    mark.unlink()
    tool.export_builds(tmp_path / "x.tar.gz")
    shipped = scale_spec(torch.float32, "emu")
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    target = f"{shipped.key_dir.relative_to(cache.root()).as_posix()}/{build.name}"
    edit = None if record == "as built" else (lambda meta: meta.update(key=shipped.key))
    rc, out, _ = _import(_moved(tmp_path / "x.tar.gz", tmp_path / "bad.tar.gz", target, edit), capsys=capsys)
    assert rc == 1 and "REFUSED" in out and "refused 1" in out, out
    assert ("whose builds go in" if record == "as built" else "is not of the build it requests") in out
    assert not list((tmp_path / "b").glob("v2/scale/*/*/lib.so"))
    r = subprocess.run([sys.executable, "-c", "import torch\nfrom kernkit import ops\nops.scale(torch.ones(4), 2.0)"],
                       capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "KERNKIT_CACHE_DIR": str(tmp_path / "b"), "KERNKIT_JIT": "off"})
    assert "JitDisabledError" in r.stderr, r.stderr
    assert not mark.exists(), "the library's constructor ran"


def test_expect_sha256_imports_only_the_archive_export_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "a"))
    scale_spec(torch.float32, "emu").build()
    archive = tmp_path / "x.tar.gz"
    assert cli.main(["cache", "export", str(archive)]) == 0
    printed = capsys.readouterr().out.split("SHA-256 ")[1].split()[0]
    assert printed == cache.sha256(archive)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    other = "0" * 64
    rc, _, err = _import(archive, "--expect-sha256", other, capsys=capsys)
    assert rc == 2 and f"not the expected {other}: nothing imported" in err, err
    assert not (tmp_path / "b").exists()
    rc, _, err = _import(archive, "--expect-sha256", "../x", capsys=capsys)
    assert rc == 2 and "--expect-sha256 takes 64 hex digits" in err
    rc, out, _ = _import(archive, "--expect-sha256", printed, capsys=capsys)
    assert rc == 0 and "imported 1 build" in out


# 4 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("record", ["as built", "key and title rewritten"])
def test_a_genuine_build_placed_under_another_ops_key_is_refused(tmp_path, monkeypatch, capsys, record):
    """``silu_and_mul<fp32>`` in ``gelu_and_mul<fp32>``'s directory made ``gelu_and_mul`` return
    SiLU."""
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "a"))
    silu = act_and_mul_spec("silu", torch.float32, "emu")
    build = silu.build().parent
    tool.export_builds(tmp_path / "x.tar.gz")
    gelu = act_and_mul_spec("gelu", torch.float32, "emu")
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    target = f"{gelu.key_dir.relative_to(cache.root()).as_posix()}/{build.name}"
    edit = None if record == "as built" else (lambda meta: meta.update(key=gelu.key, title=gelu.title))
    rc, out, _ = _import(_moved(tmp_path / "x.tar.gz", tmp_path / "bad.tar.gz", target, edit), capsys=capsys)
    assert rc == 1 and "refused 1" in out and "silu_and_mul<fp32_t, 0, false> (emu)" in out, out
    monkeypatch.setenv("KERNKIT_JIT", "off")
    with pytest.raises(JitDisabledError, match=r"gelu_and_mul<fp32_t, 1, false>"):
        gelu.build()


# 8 -------------------------------------------------------------------------------------------

def test_an_entry_without_a_title_is_refused_before_anything_is_published(tmp_path, shipped, capsys):
    archive, _ = shipped
    (entry,), files = _members(archive)
    del entry["title"]
    rc, _, err = _import(_write(tmp_path / "bad.tar.gz", [entry], files), capsys=capsys)
    assert rc == 2 and "entry 1 of its index is not an object of strings" in err, err
    assert _published(tmp_path / "b") == []


# 9 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, expect", [
    ("built_at", "2026-12-01", "'built_at' is not a number"),
    ("deps", [["a.h", "1", 2, 3, 4, "x"]], "'deps' is not a list of [path, size"),
    ("key", "../../x", "'key' is not 64 hex digits"),
])
def test_a_record_of_the_wrong_types_is_refused_at_import(tmp_path, shipped, capsys, field, value, expect):
    archive, build = shipped
    rc, out, _ = _import(_moved(archive, tmp_path / "bad.tar.gz", build, lambda meta: meta.update({field: value})),
                         capsys=capsys)
    assert rc == 1 and "refused 1" in out and expect in out, out
    assert _published(tmp_path / "b") == []


def test_a_load_and_the_cache_tools_pass_over_a_record_they_cannot_read(tmp_path, monkeypatch, capsys):
    """Next to a genuine build of the same key, a record with ``"built_at": "2026-12-01"`` made
    every load of the op fail (``'<' not supported between 'str' and 'float'``), and ``cache
    list`` and ``prune`` crash."""
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "c"))
    spec = scale_spec(torch.float32, "emu")
    lib = spec.build()
    bad = lib.parent.with_name("0" * 12)
    shutil.copytree(lib.parent, bad)
    meta = json.loads((bad / "meta.json").read_text())
    (bad / "meta.json").write_text(json.dumps({**meta, "built_at": "2026-12-01"}))
    for args in (["cache", "list"], ["cache", "prune", "--keep", "5"]):
        assert cli.main(args) == 0
        out, err = capsys.readouterr()
        assert f"skipped a damaged build: unreadable build record in {bad}: its record's 'built_at'" in err, err
        assert ("scale<fp32_t, false>" if args[1] == "list" else "removed 0 builds") in out, out
    with pytest.warns(RuntimeWarning, match="discarding a damaged cache entry"):
        assert spec.build() == lib
    assert not bad.exists()


# 10 ------------------------------------------------------------------------------------------

def test_an_index_dir_in_the_locks_cannot_block_builds(tmp_path, shipped, capsys):
    archive, _ = shipped
    spec = scale_spec(torch.float32, "emu")
    rc, _, err = _import(_moved(archive, tmp_path / "bad.tar.gz", f".locks/{spec.key[:16]}.lock/x"), capsys=capsys)
    assert rc == 2 and "is not a build directory" in err, err
    assert not (tmp_path / "b" / "v2" / ".locks" / f"{spec.key[:16]}.lock").is_dir()
    assert spec.build().is_file()  # a cold build of that key takes its lock


# 13 ------------------------------------------------------------------------------------------

def test_the_cache_tools_name_a_damaged_entry_and_pass_it_over(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "c"))
    good = scale_spec(torch.float32, "emu").build().parent
    no_record = scale_spec(torch.float16, "emu").build().parent
    no_lib = scale_spec(torch.bfloat16, "emu").build().parent
    (no_record / "meta.json").write_text("[1, 2]")
    (no_lib / cache.LIB_NAME).unlink()
    archive = tmp_path / "x.tar.gz"
    for args in (["cache", "list"], ["cache", "prune", "--keep", "5"], ["cache", "export", str(archive)]):
        assert cli.main(args) == 0, args
        out, err = capsys.readouterr()
        assert f"unreadable build record in {no_record}: its record is a JSON list" in err, err
        assert f"{no_lib / cache.LIB_NAME} is missing" in err, err
    assert "wrote 1 build to" in out
    assert [e["dir"] for e in _members(archive)[0]] == [good.relative_to(tmp_path / "c" / "v2").as_posix()]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert cli.main(["cache", "export", str(tmp_path / "missing" / "x.tar.gz")]) == 2
    assert "error: cannot write the archive" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


# 14 ------------------------------------------------------------------------------------------

def _device(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info


def _link(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


def _dirmember(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


@pytest.mark.parametrize("kind", ["truncated", "not gzip", "builds: 5", "a string entry", "a number for dir",
                                  "directory member", "device member", "symlink member", "no index",
                                  "a member in no entry"])
def test_a_malformed_archive_is_refused_whole_with_exit_2(tmp_path, shipped, capsys, kind):
    archive, build = shipped
    (entry,), files = _members(archive)
    bad = tmp_path / "bad.tar.gz"
    if kind == "truncated":
        bad.write_bytes(archive.read_bytes()[: archive.stat().st_size * 3 // 4])
    elif kind == "not gzip":
        bad.write_bytes(b"\x1f\x8b" + os.urandom(200))
    elif kind == "no index":
        with tarfile.open(bad, "w:gz"):
            pass
    else:
        index: object = {"builds: 5": 5, "a string entry": ["scale"], "a number for dir": [{**entry, "dir": 5}]}.get(
            kind, [entry])
        member = f"{build}/{cache.LIB_NAME}"
        if kind in ("directory member", "device member", "symlink member"):
            files.pop(member)
            extra = ({"directory member": _dirmember, "device member": _device, "symlink member": _link}[kind](member),)
        else:
            extra = ()
            if kind == "a member in no entry":
                files["scale/other"] = b"x"
        _write(bad, index, files, extra)
    rc, _, err = _import(bad, capsys=capsys)
    assert rc == 2 and err.startswith(f"error: {bad} is not a kernkit cache archive: "), err
    assert "Traceback" not in err
    assert not (tmp_path / "b").exists()


# Round four ------------------------------------------------------------------------------------
# An archive's sizes, a record's nesting, and the names it carries.

@pytest.fixture(scope="module")
def three_archive(tmp_path_factory) -> Path:
    """An archive of scale's fp32, fp16 and bf16 builds (emu), made once for this module."""
    return _exported(tmp_path_factory.mktemp("three"), (torch.float32, torch.float16, torch.bfloat16))[0]


@pytest.fixture
def three(three_archive, into_b) -> Path:
    """``three_archive``, for a test that imports into the empty cache ``b``."""
    return three_archive


def _block(name: str, data: bytes) -> bytes:
    """One plain member of a tar stream: its header, then its data padded to whole blocks."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(tarfile.GNU_FORMAT) + data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


def _sparse(name: str, size: int, data: bytes = b"{}") -> bytes:
    """A GNU sparse member of ``size`` bytes that holds only ``data``, at its end: the rest is a
    hole, which tarfile reads as zeros. Its header says so in fields ``TarInfo`` cannot write (the
    map of the data at offset 386, the real size at 483), so they are set here."""
    info = tarfile.TarInfo(name)
    info.type, info.size = tarfile.GNUTYPE_SPARSE, len(data)
    head = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    head[386:398] = tarfile.itn(size - len(data), 12, tarfile.GNU_FORMAT)
    head[398:410] = tarfile.itn(len(data), 12, tarfile.GNU_FORMAT)
    head[483:495] = tarfile.itn(size, 12, tarfile.GNU_FORMAT)
    head[148:156] = b" " * 8
    head[148:155] = b"%06o\0" % sum(head[:tarfile.BLOCKSIZE])
    return bytes(head) + data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


def _stream(out: Path, *members: bytes) -> Path:
    """A .tar.gz of the members ``_block`` and ``_sparse`` made, in that order."""
    import gzip

    out.write_bytes(gzip.compress(b"".join(members) + b"\0" * 2 * tarfile.BLOCKSIZE))
    return out


@pytest.fixture
def no_big_files():
    """Files of this process stop at 64 MiB (``RLIMIT_FSIZE``; a write past it fails with
    ``EFBIG``): a test of a member that claims a terabyte never fills the disk, whatever the
    code under test does."""
    import resource
    import signal

    old, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, old[1]))
    yield
    resource.setrlimit(resource.RLIMIT_FSIZE, old)
    signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize("size", [1 << 40, 256 << 20])
def test_a_sparse_library_member_is_refused_before_a_byte_is_written(tmp_path, three, capsys, no_big_files, size):
    """A 2 KB archive whose ``lib.so`` is a GNU sparse member claiming a terabyte (its record
    claiming the same): tarfile reads the hole as zeros, and the import wrote them until the
    disk was full."""
    index, files = _members(three)
    name = f"{index[0]['dir']}/{cache.LIB_NAME}"
    meta = json.loads(files[f"{index[0]['dir']}/meta.json"])
    meta["lib"]["size"] = size
    files[f"{index[0]['dir']}/meta.json"] = json.dumps(meta).encode()
    members = [_block("index.json", json.dumps({"format": 1, "builds": index[:1]}).encode())]
    members += [_sparse(n, size) if n == name else _block(n, files[n]) for n in files if n.startswith(index[0]["dir"])]
    bad = _stream(tmp_path / "sparse.tar.gz", *members)
    assert bad.stat().st_size < 4096
    rc, _, err = _import(bad, capsys=capsys)
    assert rc == 2 and f"is not a kernkit cache archive: its member {name!r} is a sparse file" in err, err
    assert not (tmp_path / "b").exists()


def test_a_library_larger_than_a_build_can_be_is_refused_whole(tmp_path, three, capsys, monkeypatch):
    """A gzip of zeros: a ``lib.so`` of 2 MiB of zeros, with ``MAX_LIB_BYTES`` lowered to 1 MiB
    for the test, is refused from its header, before its data is read."""
    monkeypatch.setattr(tool, "MAX_LIB_BYTES", 1 << 20, raising=False)
    index, files = _members(three)
    name = f"{index[0]['dir']}/{cache.LIB_NAME}"
    files = {n: bytes(2 << 20) if n == name else d for n, d in files.items() if n.startswith(index[0]["dir"])}
    bad = _write(tmp_path / "zeros.tar.gz", index[:1], files)
    assert bad.stat().st_size < 64 << 10
    rc, _, err = _import(bad, capsys=capsys)
    assert rc == 2 and f"its member {name!r} holds {2 << 20} bytes, more than the 1.0 MiB it can be" in err, err
    assert not (tmp_path / "b").exists()


def test_a_library_larger_than_its_record_claims_is_refused_before_it_is_written(tmp_path, three, capsys):
    """The record claims half the library's bytes: refused before anything is extracted (the
    import wrote the library whole, found its hash right, and published it with a record it
    rewrote)."""
    index, files = _members(three)
    first = index[0]["dir"]
    meta = json.loads(files[f"{first}/meta.json"])
    size, meta["lib"]["size"] = meta["lib"]["size"], meta["lib"]["size"] // 2
    files[f"{first}/meta.json"] = json.dumps(meta).encode()
    rc, out, _ = _import(_write(tmp_path / "claim.tar.gz", index[:1], {n: d for n, d in files.items()
                                                                      if n.startswith(first)}), capsys=capsys)
    assert rc == 1 and f"its lib.so holds {size} bytes, and its record says {size // 2}" in out, out
    assert not (tmp_path / "b").exists(), "nothing is written for a build refused by its record"


def test_extracting_a_library_stops_at_the_size_its_record_claims(tmp_path):
    """Whatever a member reads as (tarfile expands a sparse one), no byte beyond the record's
    claim reaches the disk."""
    data = os.urandom(3000)
    archive = _write(tmp_path / "x.tar.gz", [], {"lib.so": data})
    with tarfile.open(archive) as tar:
        with pytest.raises(ValueError, match="its lib.so holds more than the 1000 bytes its record says"):
            tool._extract(tar, tar.getmember("lib.so"), tmp_path / "out", 1000)
        assert (tmp_path / "out").stat().st_size <= 1000
        tool._extract(tar, tar.getmember("lib.so"), tmp_path / "whole", 3000)
    assert (tmp_path / "whole").read_bytes() == data


@pytest.mark.parametrize("kind", ["sparse, 1 TiB", "sparse, 256 MiB", "17 MiB of spaces", "a pax header of 1 TiB",
                                  "a long name of 1 TiB"])
def test_an_index_claiming_a_huge_size_is_not_an_archive(tmp_path, into_b, capsys, kind):
    """An index claiming 1 TiB raised ``MemoryError`` (exit 1); one of 256 MiB was read into
    memory whole. A member's extended header (a long name, pax records) is read whole by
    tarfile before the member: it is bounded too."""
    bad = tmp_path / "big.tar.gz"
    if kind.startswith("sparse"):
        _stream(bad, _sparse("index.json", 1 << 40 if "TiB" in kind else 256 << 20))
        expect = "its member 'index.json' is a sparse file"
    elif kind == "17 MiB of spaces":
        _stream(bad, _block("index.json", b" " * (17 << 20) + b"{}"))
        expect = f"its member 'index.json' holds {(17 << 20) + 2} bytes, more than the 16.0 MiB it can be"
    else:
        header = tarfile.TarInfo("././@LongLink")
        header.type = tarfile.XHDTYPE if "pax" in kind else tarfile.GNUTYPE_LONGNAME
        header.size = 1 << 40
        _stream(bad, header.tobuf(tarfile.GNU_FORMAT) + b"x" * tarfile.BLOCKSIZE)
        expect = f"a header of its claims {1 << 40} bytes, more than the 1.0 MiB one can be"
    assert bad.stat().st_size < 64 << 10
    rc, _, err = _import(bad, capsys=capsys)
    assert rc == 2 and err.startswith(f"error: {bad} is not a kernkit cache archive: {expect}"), err
    assert "Traceback" not in err and not (tmp_path / "b").exists()


def _deep(n: int = 100_000) -> bytes:
    return b"[" * n + b"]" * n


def test_an_index_nested_100000_deep_is_not_an_archive(tmp_path, into_b, capsys):
    rc, _, err = _import(_stream(tmp_path / "deep.tar.gz", _block("index.json", _deep())), capsys=capsys)
    assert rc == 2 and "its index.json cannot be read (it nests arrays and objects more than 64 deep)" in err, err
    assert not (tmp_path / "b").exists()


def test_a_record_nested_100000_deep_is_refused_and_every_other_build_is_imported(tmp_path, three, capsys):
    """The second of three builds has a ``meta.json`` nested 100,000 deep: ``RecursionError``
    escaped after the first was published, the third was never tried, and no summary was
    printed. Every record is read before any build is written: the second is refused by name,
    the other two imported."""
    index, files = _members(three)
    files[f"{index[1]['dir']}/meta.json"] = _deep()
    rc, out, err = _import(_write(tmp_path / "deep.tar.gz", index, files), capsys=capsys)
    assert rc == 1, out + err
    assert f"REFUSED {index[1]['dir']} ({index[1]['title']}): its meta.json cannot be read (it nests arrays and " \
           "objects more than 64 deep)" in out, out
    assert out.splitlines()[-1] == f"imported 2 builds into {tmp_path / 'b' / 'v2'}, refused 1"
    assert _published(tmp_path / "b") == sorted(f"v2/{e['dir']}" for e in (index[0], index[2]))


def test_a_name_with_terminal_escapes_is_listed_escaped_and_refused_at_import(tmp_path, monkeypatch, capsys):
    """A build whose template argument holds ``ESC ] 0 ; ... BEL`` (set the terminal's title)
    and ``ESC [2J`` (clear it), made by hand as ``load_jit`` no longer makes it: ``cache list``
    printed it raw; ``cache import`` published it."""
    import dataclasses

    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "a"))
    evil = "fp32_t\x1b]0;pwned\x07\x1b[2J"
    spec = dataclasses.replace(scale_spec(torch.float32, "emu"), template_args=(evil, "false"))
    spec.build()
    capsys.readouterr()  # the compile's own line names the spec as this test made it
    assert cli.main(["cache", "list"]) == 0
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert r"scale<fp32_t\x1b]0;pwned\x07\x1b[2J, false>" in out, out
    tool.export_builds(tmp_path / "x.tar.gz")
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    rc, out, err = _import(tmp_path / "x.tar.gz", capsys=capsys)
    assert rc == 1 and "refused 1" in out, out + err
    assert "\x1b" not in out + err and r"holds a control character" in out, out
    assert _published(tmp_path / "b") == []
    with pytest.raises(ValueError, match=r"load_jit: marker 'fp32_t\\x1b\]0;pwned\\x07\\x1b\[2J' holds a control"):
        JitSpec.make("scale", evil, "false", cuda_files=["elementwise/scale.cuh"],
                     cuda_wrappers=[("scale", "scale<fp32_t, false>")], backend="emu")


@pytest.fixture
def deadline():
    """The test fails, rather than hangs, if it takes more than a minute (a read that blocks on a
    FIFO is interrupted)."""
    import signal

    def late(*_):  # pytest.fail's exception is no OSError, which the code under test might catch
        pytest.fail("the test took more than 60 s: something blocks")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _unusable(build: Path, kind: str) -> Path:
    """A copy of the genuine ``build`` beside it, recorded as built later (a load would take it
    first), whose record cannot be used as ``kind`` says."""
    bad = build.with_name("0" * 12)
    shutil.copytree(build, bad)
    meta = json.loads((bad / "meta.json").read_text())
    meta["built_at"] += 1
    text = json.dumps(meta).encode()
    if kind == "nested 100,000 deep":
        text = _deep()
    elif kind == "a field nested 100,000 deep":
        text = text[:-1] + b', "notes": ' + _deep() + b"}"
    elif kind == "a header path with a NUL":
        meta["deps"][0][0] += "\0.h"
        text = json.dumps(meta).encode()
    (bad / "meta.json").unlink()
    if kind == "a FIFO":
        os.mkfifo(bad / "meta.json")
    else:
        (bad / "meta.json").write_bytes(text)
    return bad


@pytest.mark.parametrize("kind", ["nested 100,000 deep", "a field nested 100,000 deep", "a header path with a NUL",
                                  "a FIFO"])
@pytest.mark.parametrize("where", ["local", "shared"])
def test_a_record_that_cannot_be_used_beside_a_genuine_build_never_breaks_a_load(
        three_archive, tmp_path, monkeypatch, capsys, deadline, where, kind):
    """Such a record broke every load of the op (``RecursionError``, or a load that blocked on
    the FIFO for good), in a local and a read-only shared cache alike, and ``cache list``. Now
    the load skips it with one warning and takes the genuine build; ``cache list`` names it and
    passes over it; a load that misses still says so (reading the kernel's records for the
    nearest build)."""
    import warnings

    top = tmp_path / "c"
    shutil.copytree(three_archive.parent / "cache", top)
    fp32, bf16 = scale_spec(torch.float32, "emu"), scale_spec(torch.bfloat16, "emu")
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(top))
    genuine = next((top / "v2").glob(f"scale/{fp32.key_dir.name}/*/lib.so"))
    shutil.rmtree(next((top / "v2").glob(f"scale/{bf16.key_dir.name}")))  # so that its load misses
    bad = _unusable(genuine.parent, kind)
    if where == "shared":
        monkeypatch.setenv("KERNKIT_CACHE_SHARED", str(top))
        monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "local"))
        monkeypatch.setattr(cache, "_warned", set())
    monkeypatch.setenv("KERNKIT_JIT", "off")
    assert cli.main(["cache", "list"]) == 0
    out, err = capsys.readouterr()
    assert "scale<fp32_t, false>" in out
    assert f"kernkit: skipped a damaged build: unreadable build record in {bad}" in err, err
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(JitDisabledError, match=r"scale<bf16_t, false> \(emu\) key .* is not in"):
            bf16.build()
        assert fp32.build() == genuine
        assert fp32.build() == genuine
    damaged = [str(w.message) for w in seen if "damaged" in str(w.message)]
    assert len(damaged) == 1 and str(bad) in damaged[0], damaged
    assert os.path.lexists(bad / "meta.json") == (where == "shared")  # a shared cache is left as it is


def test_a_miss_describes_a_nearest_build_whose_record_names_no_backend(three_archive, tmp_path, monkeypatch):
    """``check_record`` takes a missing ``backend`` or ``arch`` for null; the message of a load
    that missed read them as present (``KeyError: 'backend'`` instead of ``JitDisabledError``),
    and so did ``cache import``'s check of the key."""
    top = tmp_path / "c"
    shutil.copytree(three_archive.parent / "cache", top)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(top))
    spec = scale_spec(torch.float32, "emu")
    (build,) = (top / "v2").glob(f"scale/{spec.key_dir.name}/*")
    elsewhere = top / "v2" / "scale" / f"fp32_t_false-{'0' * 16}" / build.name  # another key's build of it
    elsewhere.parent.mkdir()
    build.rename(elsewhere)
    meta = json.loads((elsewhere / "meta.json").read_text())
    del meta["backend"], meta["arch"]
    (elsewhere / "meta.json").write_text(json.dumps(meta))
    monkeypatch.setenv("KERNKIT_JIT", "off")
    with pytest.raises(JitDisabledError, match=rf"The nearest build of scale<fp32_t, false>, {elsewhere}, differs "
                                               r"in: backend None there, emu here"):
        spec.build()


def test_cache_list_passes_over_a_request_it_cannot_read(three_archive, tmp_path, monkeypatch, capsys):
    """A record whose build request holds ``"extra_cflags": 5`` made ``cache list`` raise
    ``TypeError: 'int' object is not iterable``."""
    top = tmp_path / "c"
    shutil.copytree(three_archive.parent / "cache", top)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(top))
    record = next((top / "v2").glob("scale/*/*/meta.json"))
    meta = json.loads(record.read_text())
    meta["request"]["extra_cflags"] = 5
    record.write_text(json.dumps(meta))
    assert cli.main(["cache", "list"]) == 0
    assert "3 builds" in capsys.readouterr().out
