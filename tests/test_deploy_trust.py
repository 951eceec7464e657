"""What comes from elsewhere is input, not trusted code: a manifest replayed by ``warmup``, a
read-only shared cache (``KERNKIT_CACHE_SHARED``), the environment (``KERNKIT_FREEZE``,
``KERNKIT_RECORD``), another host's builds in progress, and a cache the tools cannot write.
CPU tensors, through the CPU emulator."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernkit import ops
from kernkit.cli import replay
from kernkit.jit import maker, manifest
from kernkit.ops.scale import _module as scale_module
from kernkit.ops.scale import scale_spec

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernkit.jit", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env})


@pytest.fixture
def scale_cold(monkeypatch, fresh_cache):
    """scale's module factory with nothing loaded, in a fresh cache; emptied again after."""
    scale_module.cache_clear()
    yield fresh_cache
    scale_module.cache_clear()


# --------------------------------------------------------------------------------------------
# KERNKIT_FREEZE


@pytest.mark.parametrize("value", ["1", "true", "on", "yes", "errors", "Error!"])
def test_an_unknown_freeze_value_raises_at_the_first_load_and_never_means_off(scale_cold, monkeypatch, value):
    from kernkit.cli import doctor

    monkeypatch.setenv("KERNKIT_FREEZE", value)
    with pytest.raises(ValueError, match=rf"KERNKIT_FREEZE must be one of 'error', 'warn', 'off' \(or unset\), "
                                         rf"got '{value}'"):
        ops.scale(torch.ones(4), 2.0)
    assert not list(scale_cold.glob("v2/scale/*/*/lib.so"))  # nothing compiled
    label, problem = next((v, p) for name, v, p in doctor.report() if name == "JIT")
    assert problem and f"got '{value}'" in label
    monkeypatch.setenv("KERNKIT_FREEZE", "off")
    scale_spec(torch.float32, "emu").build()
    monkeypatch.setenv("KERNKIT_FREEZE", value)  # built now: a load still raises, it does not load unfrozen
    with pytest.raises(ValueError, match="KERNKIT_FREEZE must be one of"):
        ops.scale(torch.ones(4), 2.0)


# --------------------------------------------------------------------------------------------
# KERNKIT_JIT and the other on/off variables


@pytest.mark.parametrize("value", ["disabled", "never", "none", "of", "0ff", "offf", "2"])
def test_an_unknown_jit_value_raises_at_every_load_and_never_means_on(scale_cold, monkeypatch, value):
    """A misspelt ``KERNKIT_JIT=off`` never means on: every load raises, naming the variable and
    its spellings, whether or not the build is cached, and ``doctor`` marks it."""
    from kernkit.cli import doctor
    from kernkit.jit.config import ConfigError

    message = (f"KERNKIT_JIT must be one of 'on', '1', 'true', 'yes', 'off', '0', 'false', 'no' (or unset), "
               f"got '{value}'")
    monkeypatch.setenv("KERNKIT_JIT", value)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        ops.scale(torch.ones(4), 2.0)
    assert not list(scale_cold.glob("v2/scale/*/*/lib.so"))  # nothing compiled
    label, problem = next((v, p) for name, v, p in doctor.report() if name == "JIT")
    assert problem and label == f"every load raises: {message}"
    monkeypatch.setenv("KERNKIT_JIT", "on")
    scale_spec(torch.float32, "emu").build()
    monkeypatch.setenv("KERNKIT_JIT", value)  # built now: a load still raises
    with pytest.raises(ConfigError, match="KERNKIT_JIT must be one of"):
        ops.scale(torch.ones(4), 2.0)


def test_every_on_off_variable_takes_the_same_spellings(monkeypatch):
    from kernkit.jit import config

    for value, on in [("on", True), ("1", True), (" TRUE ", True), ("Yes", True), ("", True),
                      ("OFF", False), ("0", False), ("false", False), (" no", False)]:
        monkeypatch.setenv("KERNKIT_JIT", value)
        monkeypatch.setenv("KERNKIT_EMU_SANITIZE", value)
        assert config.jit_enabled() is on, value
        assert config.emu_sanitizers() == (("address", "undefined") if on and value else ()), value
    monkeypatch.setenv("KERNKIT_EMU_SANITIZE", "undefined,address")  # a list of sanitizers is not a spelling
    assert config.emu_sanitizers() == ("address", "undefined")
    for value in ("address -o /tmp/x", "address;id", ",", "$(id)"):  # never more than a sanitizer's name
        monkeypatch.setenv("KERNKIT_EMU_SANITIZE", value)
        with pytest.raises(config.ConfigError, match="^KERNKIT_EMU_SANITIZE must be on/off .* got "):
            config.emu_sanitizers()
    for var, reader in [("KERNKIT_FREEZE", config.frozen), ("KERNKIT_EMU_CHECK", config.emu_check)]:
        monkeypatch.setenv(var, "disabled")  # the variables of named values refuse the same way
        with pytest.raises(config.ConfigError, match=rf"^{var} must be one of .*\(or unset\), got 'disabled'$"):
            reader()


# --------------------------------------------------------------------------------------------
# A manifest from elsewhere: warmup --manifest


def _manifest(path: Path, **change) -> Path:
    """A manifest of scale<fp32_t, false> (emu) with the request's fields ``change``d."""
    req = {**manifest.request(scale_spec(torch.float32, "emu")), **change}
    path.write_text(json.dumps({"format": 1, "kernkit": "x", "requests": [req]}))
    return path


@pytest.mark.parametrize("field, value", [
    ("extra_ldflags", ["-lm\nrule pwn\n  command = touch pwned\nbuild pwned: pwn\ndefault pwned\n"]),
    ("extra_cflags", ["-O2\r"]),
    ("extra_include_paths", ["include\nbuild y: phony"]),
    ("marker", ["scale", "fp32_t\x1b[2J", "false"]),
    ("cuda_wrappers", [["scale", "scale<fp32_t, false>\x07"]]),
    ("arch", "9.0\n"),
])
def test_a_manifest_string_with_a_control_character_is_refused_before_anything_builds(
        tmp_path, fresh_cache, field, value):
    """A newline in a flag would end the line of build.ninja and start a statement of its own
    (the ``$`` escaping does not cover it); any control character is refused, in any field."""
    record = _manifest(tmp_path / "m.json", **{field: value})
    with pytest.raises(manifest.ManifestError, match=rf"request 1 .*is refused: '{field}' holds a control character"):
        replay.specs(record)
    r = cli("warmup", "--manifest", str(record), "-q", env={"KERNKIT_CACHE_DIR": str(fresh_cache)})
    assert r.returncode == 2 and "holds a control character" in r.stderr, r.stdout + r.stderr
    assert not list(fresh_cache.glob("v2/scale/*/*/lib.so")) and not list(REPO.glob("**/pwned"))


def test_a_flag_with_a_control_character_never_reaches_build_ninja(fresh_cache):
    """``load_jit`` refuses such a flag; one from where it cannot look (``CXX``, ``CUDA_HOME``),
    made here by replacing a spec's flags, is refused by the writer of ``build.ninja``."""
    import dataclasses

    from kernkit.jit import JitSpec

    options = {"cuda_files": ["elementwise/scale.cuh"], "cuda_wrappers": [("scale", "scale<fp32_t, false>")],
               "backend": "emu"}
    with pytest.raises(ValueError, match=r"load_jit: extra_cflags '-O2\\nbuild pwned: phony' holds a control"):
        JitSpec.make("scale", "fp32_t", "false", extra_cflags=["-O2\nbuild pwned: phony"], **options)
    spec = dataclasses.replace(JitSpec.make("scale", "fp32_t", "false", **options),
                               extra_cflags=("-O2\nbuild pwned: phony",))
    with pytest.raises(ValueError, match=r"a build command cannot hold a control character: '-O2\\nbuild pwned"):
        spec.build()
    assert not list(fresh_cache.glob("v2/.staging/*/build.ninja")) and not list(fresh_cache.glob("v2/scale/*/*"))


@pytest.mark.parametrize("field, value, expect", [
    ("marker", "scale", "'marker' must be a list of strings, got 'scale'"),
    ("marker", [], "'marker' must name the kernel"),
    ("extra_cflags", "-O2", "'extra_cflags' must be a list of strings, got '-O2'"),
    ("cuda_wrappers", [["scale"]], "'cuda_wrappers' must be a list of [name, symbol] pairs"),
    ("backend", 5, "'backend' must be a string or null, got 5"),
])
def test_a_malformed_request_is_refused_naming_its_field(tmp_path, field, value, expect):
    """A marker given as a string was split into characters (a kernel ``s<c, a, l, e>``)."""
    with pytest.raises(manifest.ManifestError, match="request 1.* is refused: " + expect.replace("[", r"\[")):
        replay.specs(_manifest(tmp_path / "m.json", **{field: value}))


def test_no_extra_flags_refuses_a_manifest_that_carries_flags_before_building(tmp_path, fresh_cache):
    """``-wrapper /bin/sh,-c,...`` makes the compiler driver run a shell: with
    ``--no-extra-flags`` the whole manifest is refused, nothing is built or run."""
    marker = tmp_path / "ran"
    evil = _manifest(tmp_path / "evil.json", extra_cflags=["-wrapper", f"/bin/sh,-c,touch {marker}"])
    r = cli("warmup", "--manifest", str(evil), "--no-extra-flags", "-q", env={"KERNKIT_CACHE_DIR": str(fresh_cache)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "request 1 (scale<fp32_t, false>) is refused: it carries compiler flags ['-wrapper'" in r.stderr
    assert "--no-extra-flags refuses them" in r.stderr
    assert not marker.exists() and not list(fresh_cache.glob("v2/scale/*/*/lib.so"))
    plain = _manifest(tmp_path / "plain.json")
    r = cli("warmup", "--manifest", str(plain), "--no-extra-flags", "-q", env={"KERNKIT_CACHE_DIR": str(fresh_cache)})
    assert r.returncode == 0 and "1 built" in r.stdout, r.stdout + r.stderr
    r = cli("warmup", "scale", "--no-extra-flags", "--list", env={"KERNKIT_CACHE_DIR": str(fresh_cache)})
    assert r.returncode == 2 and "--no-extra-flags goes with --manifest" in r.stderr


# --------------------------------------------------------------------------------------------
# A read-only shared cache: KERNKIT_CACHE_SHARED


def _tree(path: Path) -> dict:
    """Each file's SHA-256 and each folder, but the precompiled headers and the helper object
    (and their locks), which a detached maker started by the build that filled the cache may still
    be writing, or a later build republish."""
    def made_later(rel: Path) -> bool:
        return bool({"pch", "helpers"} & set(rel.parts[:2])) or rel.name.startswith(("helpers-", "pch-"))

    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(path.rglob("*")) if not made_later(p.relative_to(path))}


def test_a_damaged_build_of_a_shared_cache_is_skipped_with_one_warning_and_left_alone(tmp_path, monkeypatch):
    from kernkit.jit import FrozenCompileError, cache

    shared, local = tmp_path / "shared", tmp_path / "local"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(shared))
    lib = scale_spec(torch.float32, "emu").build()
    with open(lib, "ab") as f:
        f.write(b"\0")  # damaged: its size no longer matches its record
    before = _tree(shared)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(local))
    monkeypatch.setenv("KERNKIT_CACHE_SHARED", str(shared))
    monkeypatch.setattr(cache, "_warned", set())
    monkeypatch.setenv("KERNKIT_FREEZE", "error")  # no local build yet: raise, naming both caches
    with pytest.warns(RuntimeWarning, match=r"skipping a damaged build of a read-only cache \(left as it is\)"):
        with pytest.raises(FrozenCompileError, match=rf"is not in the caches {shared / 'v2'}, {local / 'v2'}"):
            scale_spec(torch.float32, "emu").build()
    monkeypatch.setenv("KERNKIT_FREEZE", "off")  # compiled locally
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        built = scale_spec(torch.float32, "emu").build()
        assert scale_spec(torch.float32, "emu").build() == built
    assert not [w for w in seen if "damaged" in str(w.message)]  # warned once, in the first load
    assert local in built.parents
    assert _tree(shared) == before  # not one byte of the shared cache changed


def test_a_shared_cache_that_is_not_a_directory_is_warned_about_once(tmp_path, monkeypatch, fresh_cache):
    from kernkit.jit import JitDisabledError, config

    afile, missing = tmp_path / "a-file", tmp_path / "not-mounted"
    afile.write_text("")
    monkeypatch.setattr(config, "_not_shared", set())
    for empty in ("", os.pathsep, " "):  # no entry: nothing searched (not the working directory)
        monkeypatch.setenv("KERNKIT_CACHE_SHARED", empty)
        assert config.shared_dirs() == []
    monkeypatch.setenv("KERNKIT_CACHE_SHARED", f"{afile}{os.pathsep}{missing}")
    monkeypatch.setenv("KERNKIT_JIT", "off")
    with pytest.warns(RuntimeWarning) as seen:
        with pytest.raises(JitDisabledError, match=rf"is not in the cache {fresh_cache / 'v2'};"):
            scale_spec(torch.float16, "emu").build()
    messages = sorted(str(w.message) for w in seen if "KERNKIT_CACHE_SHARED" in str(w.message))
    assert messages == [f"kernkit: KERNKIT_CACHE_SHARED names {str(afile)!r}, which is not a directory; it is not "
                        "searched", f"kernkit: KERNKIT_CACHE_SHARED names {str(missing)!r}, which is missing; it is "
                        "not searched"]
    import warnings

    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        with pytest.raises(JitDisabledError):
            scale_spec(torch.float16, "emu").build()
    assert not [w for w in again if "KERNKIT_CACHE_SHARED" in str(w.message)]
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("KERNKIT_CACHE_SHARED", str(shared))
    with pytest.raises(JitDisabledError, match=rf"is not in the caches {shared / 'v2'}, {fresh_cache / 'v2'};"):
        scale_spec(torch.float16, "emu").build()


# --------------------------------------------------------------------------------------------
# Builds in progress on a shared cache: staging


def _sweep(env_cache: Path) -> subprocess.CompletedProcess:
    """``remove_stale_staging`` in another process, as another host's publish runs it."""
    return subprocess.run([sys.executable, "-c", "from kernkit.jit import cache; cache.remove_stale_staging()"],
                          capture_output=True, text=True, env={**os.environ, "KERNKIT_CACHE_DIR": str(env_cache)})


def test_a_live_build_in_progress_is_not_removed_however_old_it_looks(fresh_cache):
    """Another host whose clock is 6 hours ahead sees this host's staging directory as 6 hours
    old: its builder still holds the lock, so it stays; once released, the sweep may take it."""
    from kernkit.jit import cache

    staging = cache.staging_dir("ab" * 32)
    (staging / "kernel_emu.cc").write_text("// being compiled")
    old = os.stat(staging).st_mtime - cache.STALE_STAGING_SECONDS - 60
    os.utime(staging, (old, old))
    try:
        assert _sweep(fresh_cache).returncode == 0
        cache.remove_stale_staging()  # this process's own other builds are spared too
        assert (staging / "kernel_emu.cc").is_file()
    finally:
        cache.discard(staging)
    assert not staging.exists() and not list(fresh_cache.glob("v2/.locks/*.staging"))


def test_the_build_in_progress_of_a_killed_process_is_removed_once_old(fresh_cache):
    from kernkit.jit import cache

    code = ("import os\nfrom kernkit.jit import cache\nd = cache.staging_dir('cd' * 32)\n"
            "(d / 'lib.so').write_bytes(b'half')\nprint(d)\nos._exit(0)  # killed: nothing released by hand\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "KERNKIT_CACHE_DIR": str(fresh_cache)})
    staging = Path(r.stdout.strip())
    assert r.returncode == 0 and staging.is_dir(), r.stderr
    cache.remove_stale_staging()
    assert staging.is_dir()  # recent: its age alone keeps it
    old = os.stat(staging).st_mtime - cache.STALE_STAGING_SECONDS - 60
    os.utime(staging, (old, old))
    assert _sweep(fresh_cache).returncode == 0
    assert not staging.exists() and not list(fresh_cache.glob("v2/.locks/*.staging"))
    assert not list(fresh_cache.glob("v2/.staging/*"))


# --------------------------------------------------------------------------------------------
# cache prune / clear on a cache they cannot write


@pytest.fixture(scope="module")
def three_builds(tmp_path_factory) -> Path:
    """A cache root holding scale's fp32, fp16 and bf16 builds, made once for this module. No
    detached maker is started for it: one still writing its precompiled header there would race
    the tests' copies of the root."""
    top = tmp_path_factory.mktemp("three") / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNKIT_CACHE_DIR", str(top))
        mp.setattr(maker, "_asked", set())
        mp.setattr(maker, "_queued", [])
        mp.setattr(maker, "start", lambda: None)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            scale_spec(dtype, "emu").build()
    return top


@pytest.mark.parametrize("command", [["prune", "--keep", "0"], ["clear"], ["clear", "--kernel", "scale"]])
def test_removal_from_a_read_only_cache_says_what_was_not_removed_and_fails(three_builds, empty_cache, monkeypatch,
                                                                            capsys, command):
    """A read-only mount (EROFS on every rename in the cache; chmod would not stop root)."""
    import errno
    import shutil

    from kernkit.cli import cli

    shutil.copytree(three_builds, empty_cache)
    builds = sorted(p.parent for p in empty_cache.glob("v2/scale/*/*/lib.so"))
    real = os.rename

    def read_only(src, dst, *args, **kwargs):
        if str(empty_cache) in str(src):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(src))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", read_only)
    assert cli.main(["cache", *command]) == 1
    out = capsys.readouterr().out
    assert sorted(line.removeprefix("NOT REMOVED ") for line in out.splitlines()
                  if line.startswith("NOT REMOVED")) == [str(b) for b in builds]
    assert out.splitlines()[-1].startswith("removed 0 builds") and "3 could not be removed" in out
    assert all((b / "lib.so").is_file() for b in builds)
    monkeypatch.setattr(os, "rename", real)
    assert cli.main(["cache", *command]) == 0
    assert "removed 3 builds" in capsys.readouterr().out and not list(empty_cache.glob("v2/scale/*/*/lib.so"))


@pytest.mark.parametrize("days", ["nan", "inf", "-3"])
def test_prune_refuses_a_number_of_days_that_is_not_one(fresh_cache, capsys, days):
    from kernkit.cli import cache as tool
    from kernkit.cli import cli

    with pytest.raises(tool.ArchiveError, match=rf"a number of days >= 0, got '{days}'"):
        tool.parse_date(days)
    assert cli.main(["cache", "prune", "--older-than", days]) == 2
    assert "--older-than takes a date" in capsys.readouterr().err


def test_an_archive_entrys_escape_codes_are_printed_escaped(three_builds, tmp_path, monkeypatch, capsys):
    """A title that would clear the terminal (``ESC [2J``) and rewrite the line before it."""
    import io
    import tarfile

    from kernkit.cli import cache as tool
    from kernkit.cli import cli

    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(three_builds))
    tool.export_builds(tmp_path / "x.tar.gz")
    with tarfile.open(tmp_path / "x.tar.gz") as src, tarfile.open(tmp_path / "y.tar.gz", "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name == "index.json":
                index = json.loads(data)
                index["builds"][0].update(title="\x1b[2J\rscale ok", sha256="0" * 64)
                data = json.dumps(index).encode()
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    assert cli.main(["cache", "import", str(tmp_path / "y.tar.gz")]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    assert "REFUSED" in out and r"\x1b[2J\rscale ok" in out


# --------------------------------------------------------------------------------------------
# Messages that name the variable


def test_a_record_file_that_is_not_a_manifest_names_kernkit_record(scale_cold, tmp_path, monkeypatch):
    notes = tmp_path / "notes.txt"
    notes.write_text("not json\n")
    monkeypatch.setenv("KERNKIT_RECORD", str(notes))
    with pytest.warns(RuntimeWarning, match=rf"^kernkit: KERNKIT_RECORD={notes} names a file that is not a manifest "
                                            rf"to record into: cannot read the manifest {notes}"):
        assert ops.scale(torch.ones(4), 2.0).tolist() == [2.0] * 4  # recording never fails the op
    assert notes.read_text() == "not json\n"


#: Loads scale's cached build with KERNKIT_RECORD set, then records another request; prints the
#: result and the warnings.
RECORD_ONE = """
import json, warnings
import torch
from kernkit import ops
from kernkit.jit import manifest
from kernkit.ops.scale import scale_spec
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    y = ops.scale(torch.ones(4), 2.0)
    manifest.record(scale_spec(torch.float16, "emu"))
print(json.dumps({"y": y.tolist(), "warnings": [str(w.message) for w in seen]}))
"""


@contextlib.contextmanager
def _record_target(kind: str, tmp_path: Path):
    """A ``KERNKIT_RECORD`` path that cannot be written, and the reason and file it fails on."""
    if kind == "under a file":
        (tmp_path / "a-file").write_text("")
        yield tmp_path / "a-file" / "kernels.json", "Not a directory", tmp_path / "a-file"
    elif kind == "/proc":  # no file can be made there: a polling lock waited for ever
        yield Path("/proc/kernels.json"), "No such file or directory", Path("/proc/kernels.json.lock")
    else:  # a read-only mount (root writes through chmod)
        mnt = tmp_path / "ro"
        mnt.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mnt)],
                          capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here (needs root and mount rights)")
        try:
            yield mnt / "kernels.json", "Read-only file system", mnt / "kernels.json.lock"
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


@pytest.mark.parametrize("kind", ["under a file", "read-only", "/proc"])
def test_a_record_file_that_cannot_be_written_warns_once_and_the_op_runs(scale_cold, tmp_path, kind):
    scale_spec(torch.float32, "emu").build()
    with _record_target(kind, tmp_path) as (target, reason, at):
        proc = subprocess.run([sys.executable, "-c", RECORD_ONE], capture_output=True, text=True, cwd=REPO,
                              env={**os.environ, "KERNKIT_RECORD": str(target), "KERNKIT_JIT": "off"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["y"] == [2.0] * 4
    assert out["warnings"] == [f"kernkit: KERNKIT_RECORD={target} cannot be recorded into: {reason} ({at}); point "
                               "KERNKIT_RECORD at a file in a writable directory, or unset it. Nothing more is "
                               "recorded there by this process."]
    assert not os.path.lexists(target)


def test_a_cache_path_whose_home_is_unknown_names_its_variable(scale_cold, monkeypatch, capsys):
    from kernkit.cli import cli, doctor
    from kernkit.jit.config import ConfigError

    for var in ("KERNKIT_CACHE_DIR", "KERNKIT_CACHE_SHARED"):
        with monkeypatch.context() as m:
            m.setenv(var, "~nosuchuser-kk/x")
            why = (f"{var}='~nosuchuser-kk/x': '~nosuchuser-kk' names no home directory known here (no such user, "
                   f"or HOME unset); give {var} an absolute path")
            with pytest.raises(ConfigError, match=f"^{re.escape(why)}$"):
                ops.scale(torch.ones(4), 2.0)
            assert cli.main(["cache", "list"]) == 2
            assert capsys.readouterr().err == f"error: {why}\n"
            assert ("cache dir", f"every load raises: {why}", True) in doctor.report()
    monkeypatch.delenv("KERNKIT_CACHE_DIR")  # the default, below a home directory no one knows
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", no_home)
    with pytest.raises(ConfigError, match=r"HOME is unset .*: set KERNKIT_CACHE_DIR to a directory$"):
        ops.scale(torch.ones(4), 2.0)


def test_a_frozen_compile_that_cannot_be_counted_is_a_cache_dir_error(scale_cold, monkeypatch):
    from kernkit.jit import CacheDirError

    (scale_cold / "v2" / "frozen-compiles.jsonl").mkdir(parents=True)  # cannot be appended to
    monkeypatch.setenv("KERNKIT_FREEZE", "warn")
    with pytest.raises(CacheDirError, match=r"cannot count a frozen compile in frozen-compiles.jsonl in its cache "
                                            r"directory .*point KERNKIT_CACHE_DIR at a writable directory"):
        ops.scale(torch.ones(4), 2.0)


# --------------------------------------------------------------------------------------------
# Round four: JSON from elsewhere is read within limits; names hold no control character


def test_json_from_elsewhere_is_read_within_a_size_and_a_nesting_limit(tmp_path):
    """The one reader of records, archive indexes and manifests (``kernkit.jit.untrusted``)."""
    from kernkit.jit.untrusted import MAX_JSON_BYTES, parse_json, read_json

    assert parse_json(b"[" * 64 + b"]" * 64) == json.loads(b"[" * 64 + b"]" * 64)
    for deep in (b"[" * 65 + b"]" * 65, b'{"a": ' * 65 + b"1" + b"}" * 65, b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(ValueError, match="^it nests arrays and objects more than 64 deep$"):
            parse_json(deep)
    assert parse_json(json.dumps({"a": "[{" * 1000}).encode()) == {"a": "[{" * 1000}  # brackets in a string
    assert len(parse_json(json.dumps([[i] for i in range(10_000)]).encode())) == 10_000  # wide is not deep
    with pytest.raises(json.JSONDecodeError):
        parse_json(b"{")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * MAX_JSON_BYTES + b"{}")
    with pytest.raises(ValueError, match=rf"^it holds {MAX_JSON_BYTES + 2} bytes, more than the 16 MiB"):
        read_json(big)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="^it is not a regular file$"):  # refused at once: no writer is waited for
        read_json(fifo, regular=True)
    r, w = os.pipe()
    os.write(w, b'{"a": 1}')
    os.close(w)
    try:
        assert read_json(f"/proc/self/fd/{r}") == {"a": 1}  # warmup --manifest <(...)
    finally:
        os.close(r)


@pytest.mark.parametrize("kind", ["nested 100,000 deep", "17 MiB"])
def test_a_manifest_too_deep_or_too_big_is_refused_naming_it(tmp_path, fresh_cache, monkeypatch, capsys, kind):
    """``warmup --manifest`` of a manifest nested 100,000 deep raised ``RecursionError``."""
    from kernkit.cli.cli import main

    path = tmp_path / "m.json"
    if kind == "17 MiB":
        path.write_bytes(b'{"format": 1, "requests": []}' + b" " * (17 << 20))
        expect = f"it holds {(17 << 20) + 29} bytes, more than the 16 MiB a kernkit JSON file may hold"
    else:
        path.write_bytes(b'{"format": 1, "requests": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}")
        expect = "it nests arrays and objects more than 64 deep"
    assert main(["warmup", "--manifest", str(path), "-q"]) == 2
    assert f"error: cannot read the manifest {path}: {expect}" in capsys.readouterr().err
    monkeypatch.setenv("KERNKIT_RECORD", str(path))
    before = path.stat()
    with pytest.warns(RuntimeWarning, match=rf"^kernkit: KERNKIT_RECORD={path} names a file that is not a manifest "
                                            rf"to record into: cannot read the manifest {path}: {expect}"):
        manifest.record(scale_spec(torch.float32, "emu"))
    assert path.stat().st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("option, value, expect", [
    ("marker", "fp32_t\x1b]0;pwned\x07", r"load_jit: marker 'fp32_t\\x1b\]0;pwned\\x07' holds a control character"),
    ("extra_cflags", ["-DTAG=a\tb"], r"load_jit: extra_cflags '-DTAG=a\\tb' holds a control character"),
    ("extra_include_paths", ["/tmp/x\x1b[2J"], r"load_jit: extra_include_paths '/tmp/x\\x1b\[2J' holds a control"),
    ("cuda_files", ["elementwise/scale.cuh\r"], r"load_jit: cuda_files 'elementwise/scale.cuh\\r' holds a control"),
    ("cuda_wrappers", [("scale", "scale<fp32_t, false>\x9b2J")],
     r"cuda_wrappers: 'scale<fp32_t, false>\\x9b2J' is not a function"),
])
def test_load_jit_refuses_a_control_character_so_no_manifest_warmup_refuses_is_recorded(
        tmp_path, fresh_cache, monkeypatch, option, value, expect):
    """``load_jit`` took a marker holding escape sequences (which ``cache list`` printed raw) and
    a flag with a tab, and ``KERNKIT_RECORD`` wrote them into a manifest that ``warmup
    --manifest`` then refused. Now nothing with a control character makes a spec."""
    from kernkit.jit import load_jit

    record = tmp_path / "m.json"
    monkeypatch.setenv("KERNKIT_RECORD", str(record))
    marker = ["scale", "fp32_t", "false"]
    options: dict = {"cuda_files": ["elementwise/scale.cuh"], "cuda_wrappers": [("scale", "scale<fp32_t, false>")],
                     "backend": "emu"}
    if option == "marker":
        marker[1] = value
    else:
        options[option] = value
    with pytest.raises(ValueError, match=expect):
        load_jit(*marker, **options)
    assert not record.exists() and not list(fresh_cache.glob("v2/scale/*/*/lib.so"))
    scale_spec(torch.float32, "emu").build()  # a spec without one: recorded, and replayed
    assert len(replay.specs(record)) == 1
