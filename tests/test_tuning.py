"""Tuning tables (``kernkit.jit.tuning``) and ``python -m kernkit.jit tune``, on the CPU emulator:
a table's entry picks its candidate for its key only and gives the default's bits; a table for
another device or kernkit version is passed over; a hostile table is refused whole;
``KERNKIT_TUNING=off`` reads none; ``tune`` writes a table the op then reads; a candidate whose
outputs differ is never chosen; ``cache export`` and ``import`` carry the tables, and an import
refuses a table it cannot trust. The same for the rope ops' grid (``kernkit/ops/_rope.py``)."""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile

import pytest
import torch

from kernkit import ops
from kernkit._version import __version__
from kernkit.cli import cache as cache_tool
from kernkit.cli import tune as tune_cli
from kernkit.cli.cli import main
from kernkit.jit import tuning
from kernkit.ops import _rope
from kernkit.ops.scale import scale_spec
from kernkit.testing.ops import rotary_embedding as rope

rmsnorm_module = importlib.import_module("kernkit.ops.rmsnorm")  # the package's attribute is the op
ROPE_OPS = ("rotary_embedding", "rotary_embedding_store")
rope_modules = {op: importlib.import_module(f"kernkit.ops.{op}") for op in ROPE_OPS}

HIDDEN = 256


@pytest.fixture
def tables(empty_cache, monkeypatch, tmp_path):
    """A cache whose rmsnorm tables the test writes (the package's are not read); the module and
    table memos start empty, and the schedule masks of each build the norm factory asks for are
    recorded."""
    monkeypatch.setattr(tuning, "SHIPPED_DIR", tmp_path / "shipped")
    asked = []
    real = rmsnorm_module.rmsnorm_spec

    def spy(dtype, hidden, backend=None, cast=False, schedules=None):
        asked.append(schedules)
        return real(dtype, hidden, backend, cast, schedules)

    monkeypatch.setattr(rmsnorm_module, "rmsnorm_spec", spy)
    rmsnorm_module._module.cache_clear()
    tuning._entries.cache_clear()
    yield asked
    rmsnorm_module._module.cache_clear()
    tuning._entries.cache_clear()


def _table(entries, device=tuning.EMULATOR, version=__version__, op="rmsnorm") -> dict:
    return {"format": 1, "op": op, "kernkit": version, "device": device[0], "capability": device[1],
            "entries": entries}


def _write(table: object, name: str = "t.json", op: str = "rmsnorm"):
    folder = tuning.root() / "tuning" / op
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(table if isinstance(table, str) else json.dumps(table))
    tuning._entries.cache_clear()  # tables are read once per process


def _entry(elements: int, **args) -> dict:
    return {"key": {"dtype": "float32", "hidden": HIDDEN, "elements": elements}, "args": args}


def _x(rows: int) -> torch.Tensor:
    return torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))


UNTUNED = {"rmsnorm": (0, 0), "fused_add_rmsnorm": (0, 0)}


def _calls(w):
    """rmsnorm of 1 and 2 rows, fused_add_rmsnorm of 1 row: their outputs."""
    x, r = _x(1), _x(1) + 1
    ops.fused_add_rmsnorm(x, r, w)
    return [ops.rmsnorm(_x(1), w), ops.rmsnorm(_x(2), w), x, r]


def test_an_entry_picks_its_candidate_for_its_size_only_with_the_defaults_bits(tables):
    w = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(1))
    want = _calls(w)  # before the table: the defaults
    rmsnorm_module._module.cache_clear()
    _write(_table([_entry(HIDDEN, late_weight=True, late_trigger=True)]))  # one row of 256 elements: bit 9
    got = _calls(w)
    assert all(torch.equal(g, e) for g, e in zip(got, want, strict=True))
    assert tables == [UNTUNED, {"rmsnorm": (1 << 9, 1 << 9), "fused_add_rmsnorm": (0, 0)}]  # one build each
    spec = rmsnorm_module.rmsnorm_spec(torch.float32, HIDDEN, "emu", False, {"rmsnorm": (512, 0)})
    assert spec.title == "rmsnorm<fp32_t, 256, false, false, 512>"
    assert rmsnorm_module.rmsnorm_spec(torch.float32, HIDDEN, "emu", False, UNTUNED).title == \
        "rmsnorm<fp32_t, 256, false>"


@pytest.mark.parametrize("device, version", [(("NVIDIA H200", "9.0"), __version__), (tuning.EMULATOR, "0.0.1")])
def test_a_table_for_another_device_or_version_is_passed_over_with_one_log_line(tables, caplog, device, version):
    _write(_table([_entry(HIDDEN, late_weight=True)], device, version))
    with caplog.at_level(logging.INFO, logger="kernkit.jit"):
        ops.rmsnorm(_x(1), torch.ones(HIDDEN))
        ops.rmsnorm(_x(3), torch.ones(HIDDEN))
    lines = [r.getMessage() for r in caplog.records if "tuning table" in r.getMessage()]
    assert len(lines) == 1 and "passed over" in lines[0] and device[0] in lines[0], lines
    assert tables == [UNTUNED]


HOSTILE = {
    "an int for a bool candidate": [_entry(HIDDEN, late_weight=1)],
    "an argument the op lacks": [_entry(HIDDEN, extra_cflags="-o /tmp/x")],
    "a flag for a template argument": [_entry(HIDDEN, late_weight="true, false> ; system(\"id\")")],
    "a key name missing": [{"key": {"dtype": "float32", "hidden": HIDDEN}, "args": {}}],
    "a key of a list": [{"key": {"dtype": ["float32"], "hidden": HIDDEN, "elements": 1}, "args": {}}],
    "a negative time": [{**_entry(HIDDEN), "default_us": -1}],
    "a field of its own": [{**_entry(HIDDEN), "run": "rm -rf /"}],
}


@pytest.mark.parametrize("kind", [*HOSTILE, "not JSON", "nested 100,000 deep", "17 MiB", "another op's table",
                                  "a control character in the device", "format 2"])
def test_a_hostile_table_is_refused_whole_with_one_warning(tables, caplog, kind):
    good = _entry(2 * HIDDEN, late_trigger=True)  # an entry that alone would be used
    if kind in HOSTILE:
        table: object = _table([good, *HOSTILE[kind]])
    elif kind == "not JSON":
        table = "{not json"
    elif kind == "nested 100,000 deep":
        table = json.dumps(_table([good]))[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    elif kind == "17 MiB":
        table = json.dumps(_table([good])) + " " * (17 << 20)
    elif kind == "another op's table":
        table = _table([good], op="fused_add_rmsnorm")
    elif kind == "a control character in the device":
        table = _table([good], device=("kernkit CPU emulator\x1b[2J", "emu"))
    else:
        table = {**_table([good]), "format": 2}
    _write(table)
    with caplog.at_level(logging.WARNING, logger="kernkit.jit"):
        ops.rmsnorm(_x(2), torch.ones(HIDDEN))
        ops.rmsnorm(_x(1), torch.ones(HIDDEN))
    refused = [r.getMessage() for r in caplog.records if "is refused" in r.getMessage()]
    assert len(refused) == 1 and "none of it is used" in refused[0], refused
    assert tables == [UNTUNED]


def test_kernkit_tuning_off_reads_no_table(tables, monkeypatch):
    _write(_table([_entry(HIDDEN, late_weight=True)]))
    monkeypatch.setenv("KERNKIT_TUNING", "off")
    assert tuning.tables("rmsnorm") == []
    ops.rmsnorm(_x(1), torch.ones(HIDDEN))
    assert tables == [UNTUNED]
    monkeypatch.setenv("KERNKIT_TUNING", "of")
    with pytest.raises(ValueError, match="KERNKIT_TUNING"):
        tuning.tables("rmsnorm")


def test_tune_on_the_emulator_writes_a_table_the_op_then_reads(tables, tmp_path, capsys):
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps([{"dtype": "float32", "hidden": HIDDEN, "rows": r} for r in (1, 2, 3)]))
    assert main(["tune", "rmsnorm", "--device", "cpu", "--shapes", str(shapes), "--repeats", "3", "-q"]) == 0
    path = tune_cli.table_path(rmsnorm_module.TUNED["rmsnorm"], tuning.EMULATOR)
    assert "rmsnorm: 2 keys" in capsys.readouterr().out  # rows 2 and 3 share the bucket of 512 elements
    table = tuning.check_table(json.loads(path.read_text()), rmsnorm_module.TUNED["rmsnorm"])
    assert [e["key"]["elements"] for e in table["entries"]] == [256, 512]
    assert all(e["tuned_us"] <= e["default_us"] for e in table["entries"])
    shapes.write_text(json.dumps([{"dtype": "float32", "hidden": HIDDEN, "rows": 1}]))
    assert main(["tune", "rmsnorm", "--device", "cpu", "--shapes", str(shapes), "--repeats", "3", "-q"]) == 0
    again = json.loads(path.read_text())["entries"]
    assert [e["key"]["elements"] for e in again] == [512, 256]  # the key not measured again stays
    assert again[0] == table["entries"][1]
    rmsnorm_module._module.cache_clear()
    tables.clear()
    ops.rmsnorm(_x(1), torch.ones(HIDDEN))
    weight = sum(e["args"].get("late_weight", False) << (e["key"]["elements"].bit_length()) for e in again)
    trigger = sum(e["args"].get("late_trigger", False) << (e["key"]["elements"].bit_length()) for e in again)
    assert tables == [{"rmsnorm": (weight, trigger), "fused_add_rmsnorm": (0, 0)}]


def test_a_candidate_whose_outputs_differ_is_never_chosen(empty_cache):
    """However fast it is: the second candidate's outputs differ from the default's here."""
    spec = scale_spec(torch.float32, "emu")
    runs = []

    def outputs(module):
        runs.append(module)
        return [torch.tensor([0.0 if len(runs) != 3 else 1.0])]  # calls: want, the default, the candidate

    bench = tuning.Bench(key={"n": 1}, spec=lambda args: spec, calls=lambda module: [lambda: None],
                         outputs=outputs)
    tunable = tuning.Tunable("kernkit_test.differs", {"fast": (False, True)}, ("n",),
                             bench=lambda shape, device: bench)
    try:
        entries, notes = tune_cli.tune(tunable, [{}], "cpu", repeats=3, progress=False)
    finally:
        del tuning._declared[tunable.name]
    assert entries[0]["args"] == {} and len(runs) == 3
    assert notes == ["kernkit_test.differs {}: {'fast': True} gives other outputs than the default; not chosen"]


@pytest.mark.parametrize("name, candidates, key, match", [
    ("rms norm", {"a": (1, 2)}, ("n",), "not a dotted identifier"),
    ("kernkit_test.t", {"a": ()}, ("n",), "needs distinct"),
    ("kernkit_test.t", {"a": (True, True)}, ("n",), "needs distinct"),
    ("kernkit_test.t", {"a": (1.5,)}, ("n",), "needs distinct"),
    ("kernkit_test.t", {"a": (1,)}, ("n", "n"), "not a tuple of distinct names"),
    ("rmsnorm", {"a": (1,)}, ("n",), "declared already"),
])
def test_a_declaration_that_cannot_be_tuned_is_refused(name, candidates, key, match):
    with pytest.raises(ValueError, match=match):
        tuning.Tunable(name, candidates, key)
    assert "kernkit_test.t" not in tuning._declared


# --------------------------------------------------------------------------------------------
# The deploy path: an archive carries the tables, and an import checks them

TUNED_BUILD = {"rmsnorm": (1 << 9, 0), "fused_add_rmsnorm": (0, 0)}  # late_weight at 256 elements

#: A frozen server's first call: rmsnorm of one row, with no compiler to be found.
SERVE = "import torch\nfrom kernkit import ops\nops.rmsnorm(torch.randn(1, 256), torch.ones(256))\n"


def _export_tuned(archive):
    """Write a table that tunes rmsnorm at one row into the current cache, build the tuned
    build it picks, and export both to ``archive``; returns ``archive``."""
    _write(_table([_entry(HIDDEN, late_weight=True)]))
    ops.rmsnorm(_x(1), torch.ones(HIDDEN))
    assert cache_tool.export_builds(archive) == 1
    return archive


@pytest.fixture
def shipped_table(tables, tmp_path, monkeypatch):
    """A table that tunes rmsnorm at one row, the tuned build it picks, both exported from the
    cache the test started in; the test then runs in the empty cache ``b``. Yields the archive."""
    archive = _export_tuned(tmp_path / "x.tar.gz")
    assert tables == [TUNED_BUILD]
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    return archive


@pytest.fixture(scope="module")
def tuned_archive(tmp_path_factory):
    """``shipped_table``'s archive, made once for the tests that only read it."""
    top = tmp_path_factory.mktemp("tuned")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNKIT_CACHE_DIR", str(top / "cache"))
        mp.setattr(tuning, "SHIPPED_DIR", top / "shipped")
        rmsnorm_module._module.cache_clear()
        archive = _export_tuned(top / "x.tar.gz")
    rmsnorm_module._module.cache_clear()  # later tests load the untuned build
    tuning._entries.cache_clear()
    return archive


def _serve(cache_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SERVE], capture_output=True, text=True,
                          env={**os.environ, "KERNKIT_CACHE_DIR": str(cache_dir), "KERNKIT_FREEZE": "error",
                               "PATH": "/nonexistent"})


def test_an_archive_carries_its_tables_and_a_frozen_server_picks_the_tuned_build(shipped_table, tmp_path):
    done, refused, written = cache_tool.import_builds(shipped_table)
    assert refused == [] and written == ["rmsnorm/t.json"] and done == ["rmsnorm<fp32_t, 256, false, false, 512>"]
    table = tmp_path / "b" / "v2" / "tuning" / "rmsnorm" / "t.json"
    assert table.read_bytes() == (tmp_path / "cache" / "v2" / "tuning" / "rmsnorm" / "t.json").read_bytes()
    assert main(["cache", "clear"]) == 0 and table.is_file()  # a measurement, not a build
    served = _serve(tmp_path / "b")  # the cleared build, imported again: the table picks it
    assert served.returncode != 0 and "FrozenCompileError" in served.stderr
    cache_tool.import_builds(shipped_table)
    served = _serve(tmp_path / "b")
    assert served.returncode == 0, served.stderr
    table.unlink()  # without it the server asks for the untuned build, which the archive lacks
    served = _serve(tmp_path / "b")
    assert served.returncode != 0 and "rmsnorm<fp32_t, 256, false>" in served.stderr


def _retabled(archive, out, data: bytes, sha256: str | None = None, path: str = "tuning/rmsnorm/t.json"):
    """``archive`` with its one table's bytes replaced by ``data``, listed at ``path`` with
    ``sha256`` (default: the hash of ``data``)."""
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    head = json.loads(files.pop("index.json"))
    files.pop(head["tables"][0]["path"])
    head["tables"] = [{"path": path, "sha256": sha256 or hashlib.sha256(data).hexdigest()}]
    with tarfile.open(out, "w:gz") as tar:
        for name, body in {"index.json": json.dumps(head).encode(), path: data, **files}.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out


@pytest.mark.parametrize("kind", ["an int for a bool candidate", "an argument the op lacks", "another op's table",
                                  "not JSON", "nested 100,000 deep", "altered after export"])
def test_a_table_an_import_cannot_trust_is_refused_by_name_and_not_written(tuned_archive, into_b, tmp_path, kind):
    good = json.dumps(_table([_entry(HIDDEN, late_weight=True)])).encode()
    sha256 = None
    if kind in HOSTILE:
        data = json.dumps(_table(HOSTILE[kind])).encode()
    elif kind == "another op's table":
        data = json.dumps(_table([], op="fused_add_rmsnorm")).encode()
    elif kind == "not JSON":
        data = b"{not json"
    elif kind == "nested 100,000 deep":
        data = good[:-1] + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    else:
        data, sha256 = good.replace(b"true", b"false"), hashlib.sha256(good).hexdigest()
    mine = tmp_path / "b" / "v2" / "tuning" / "rmsnorm" / "t.json"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"the local table")
    done, refused, written = cache_tool.import_builds(_retabled(tuned_archive, tmp_path / "y.tar.gz", data, sha256))
    assert len(done) == 1 and written == [] and len(refused) == 1 and refused[0].startswith("tuning/rmsnorm/t.json: ")
    assert mine.read_bytes() == b"the local table"


@pytest.mark.parametrize("path", ["tuning/../../x.json", "tuning/rmsnorm/../t.json", "/tmp/t.json",
                                  "tuning/rmsnorm/sub/t.json", "tuning/rmsnorm/t.sh", "tuning/a b/t.json"])
def test_an_index_naming_a_table_outside_the_tables_folder_is_refused_whole(tuned_archive, into_b, tmp_path, path):
    data = json.dumps(_table([_entry(HIDDEN, late_weight=True)])).encode()
    with pytest.raises(cache_tool.ArchiveError, match="not a kernkit cache archive"):
        cache_tool.import_builds(_retabled(tuned_archive, tmp_path / "y.tar.gz", data, path=path))
    assert not (tmp_path / "b").exists()


@pytest.fixture
def rope_tables(fresh_cache, monkeypatch, tmp_path):
    """A cache whose rope tables the test writes (the package's are not read); the rope modules
    and the table memos start empty, and the grid mask of each build a rope factory asks for is
    recorded, by op."""
    monkeypatch.setattr(tuning, "SHIPPED_DIR", tmp_path / "shipped")
    asked: dict[str, list[int]] = {op: [] for op in ROPE_OPS}
    for op, module in rope_modules.items():
        real = getattr(module, f"{op}_spec")

        def spy(dtype, rot_dim, is_neox, backend=None, fewer_blocks=0, op=op, real=real):
            asked[op].append(fewer_blocks)
            return real(dtype, rot_dim, is_neox, backend, fewer_blocks)

        monkeypatch.setattr(module, f"{op}_spec", spy)
        module._module.cache_clear()
    tuning._entries.cache_clear()
    yield asked
    for module in rope_modules.values():
        module._module.cache_clear()
    tuning._entries.cache_clear()


def _rope_call(op: str, tokens: int) -> list[torch.Tensor]:
    """``op`` on ``tokens`` tokens of 32 q and 8 k heads of 128 bfloat16 (neox): q and k (and the
    caches). At 40 tokens and more, the grid of 16 CTAs an SM of the emulated GPU (4 SMs) is
    taller than that of 14, and the CTAs loop over the tokens."""
    q, k, v = (rope.rand((tokens, h, 128), torch.bfloat16, 3 * tokens + i) for i, h in enumerate((32, 8, 8)))
    gen = torch.Generator().manual_seed(tokens)
    positions = torch.randint(rope.MAX_POS, (tokens,), generator=gen)
    cache = rope.make_cache(128)
    if op == "rotary_embedding":
        ops.rotary_embedding(positions, q, k, cache)
        return [q, k]
    kc, vc = (torch.zeros(2 * tokens, 8 * 128, dtype=torch.bfloat16) for _ in range(2))
    ops.rotary_embedding_store(positions, q, k, v, cache, kc, vc, torch.randperm(2 * tokens, generator=gen)[:tokens])
    return [q, k, kc, vc]


def _rope_entry(tokens: int, **args) -> dict:
    return {"key": {"dtype": "bfloat16", "rot_dim": 128, "is_neox": True, "tokens": tokens}, "args": args}


@pytest.mark.parametrize("op", ROPE_OPS)
def test_a_rope_entry_picks_its_grid_for_its_tokens_only_with_the_defaults_bits(rope_tables, op):
    want = [t for n in (40, 100) for t in _rope_call(op, n)]  # before the table: the defaults
    rope_modules[op]._module.cache_clear()
    _write(_table([_rope_entry(32, fewer_blocks=True)], op=op), op=op)  # 32 to 63 tokens: bit 6
    got = [t for n in (40, 100) for t in _rope_call(op, n)]
    assert all(torch.equal(g, e) for g, e in zip(got, want, strict=True))
    assert rope_tables == {o: [0, 1 << 6] if o == op else [] for o in ROPE_OPS}  # one build each
    assert _rope.rope_spec(op, torch.bfloat16, 128, True, "emu", 1 << 6).title == f"{op}<bf16_t, 128, true, false, 64>"
    assert _rope.rope_spec(op, torch.bfloat16, 128, True, "emu").title == f"{op}<bf16_t, 128, true, false>"
    assert [s.title for s in rope_modules[op]._specializations([torch.bfloat16], 128, backend="emu")] == [
        f"{op}<bf16_t, 128, true, false, 64>"]  # warmup builds what the op loads


def test_tune_rope_store_on_the_emulator_writes_a_table_the_op_then_reads(rope_tables, tmp_path, capsys):
    op = "rotary_embedding_store"
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps([{"dtype": "bfloat16", "q_heads": 2, "k_heads": 1, "head_dim": 128, "rot_dim": 128,
                                   "is_neox": True, "tokens": n} for n in (1, 40, 50)]))
    argv = ["tune", op, "--device", "cpu", "--shapes", str(shapes), "--repeats", "3", "-q"]
    assert main(argv) == 0
    path = tune_cli.table_path(_rope.TUNED[op], tuning.EMULATOR)
    assert f"{op}: 2 keys" in capsys.readouterr().out  # 40 and 50 tokens share the bucket of 32
    table = tuning.check_table(json.loads(path.read_text()), _rope.TUNED[op])
    assert [e["key"] for e in table["entries"]] == [
        {"dtype": "bfloat16", "rot_dim": 128, "is_neox": True, "tokens": n} for n in (1, 32)]
    assert all(e["tuned_us"] <= e["default_us"] for e in table["entries"])
    rope_modules[op]._module.cache_clear()
    rope_tables[op].clear()
    _rope_call(op, 3)
    mask = sum(e["args"].get("fewer_blocks", False) << e["key"]["tokens"].bit_length() for e in table["entries"])
    assert rope_tables[op] == [mask]


@pytest.mark.parametrize("op", ROPE_OPS)
def test_the_rope_serving_grid_has_one_layout_per_key_and_benches_on_the_emulator(op):
    """The build knows no heads, so two layouts of one key would overwrite each other's entry."""
    grid = _rope.TUNED[op].grids["serving"]
    keys = [(s["dtype"], s["rot_dim"], s["is_neox"], s["tokens"]) for s in grid]
    assert len(set(keys)) == len(keys) and len(grid) <= 150
    bench = _rope.TUNED[op].bench({**grid[0], "tokens": 3}, "cpu")
    assert bench.key == {"dtype": "bfloat16", "rot_dim": 128, "is_neox": True, "tokens": 2}
    assert len(bench.calls(None)) == 200


def test_every_shipped_table_is_a_whole_table_of_its_op_and_this_version():
    """What ``kernkit/tuning/`` ships is read like any other table: a table that fails its op's
    check, names another version or sits under another name is refused or never found."""
    shipped = sorted(tuning.SHIPPED_DIR.glob("*/*.json"))
    assert shipped
    declared = {t.name: t for t in tuning.declared()}
    for path in shipped:
        table = tuning.check_table(json.loads(path.read_text()), declared[path.parent.name])
        assert (table["op"], table["kernkit"]) == (path.parent.name, __version__)
        assert tune_cli.table_path(declared[table["op"]], (table["device"], table["capability"])).name == path.name
        assert all(e["tuned_us"] <= e["default_us"] for e in table["entries"])


qk_norm_module = importlib.import_module("kernkit.ops.qk_norm")


def test_tune_qk_norm_on_the_emulator_writes_a_table_the_op_reads_with_the_defaults_bits(fresh_cache, monkeypatch,
                                                                                          tmp_path, capsys, request):
    monkeypatch.setattr(tuning, "SHIPPED_DIR", tmp_path / "shipped")
    for memo in (qk_norm_module._module, tuning._entries):  # later tests load the untuned build
        request.addfinalizer(memo.cache_clear)
    asked = []
    real = qk_norm_module.qk_norm_spec

    def spy(dtype, head_dim, backend=None, cast=False, schedules=(0, 0)):
        asked.append(schedules)
        return real(dtype, head_dim, backend, cast, schedules)

    monkeypatch.setattr(qk_norm_module, "qk_norm_spec", spy)
    qk_norm_module._module.cache_clear()
    tuning._entries.cache_clear()
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(3, 2, 64, generator=gen), torch.randn(3, 1, 64, generator=gen)
    wq, wk = torch.randn(64, generator=gen), torch.randn(64, generator=gen)

    def call() -> list[torch.Tensor]:
        qc, kc = q.clone(), k.clone()
        ops.qk_norm(qc, kc, wq, wk)
        return [qc, kc]

    want = call()  # before the table: the defaults
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps([{"dtype": "float32", "q_heads": 2, "k_heads": 1, "head_dim": 64, "tokens": n}
                                  for n in (1, 3)]))
    assert main(["tune", "qk_norm", "--device", "cpu", "--shapes", str(shapes), "--repeats", "3", "-q"]) == 0
    out = capsys.readouterr().out
    assert "qk_norm: 2 keys" in out and "other outputs" not in out  # 192 and 576 elements
    late = real(torch.float32, 64, "emu", False, (tuning.EVERY_SIZE, tuning.EVERY_SIZE)).build_and_load()
    qc, kc = q.clone(), k.clone()
    late.qk_norm(qc, kc, wq, wk, 1e-6)  # the build tune timed: both late variants at every size
    assert torch.equal(qc, want[0]) and torch.equal(kc, want[1])
    path = tune_cli.table_path(qk_norm_module.TUNED, tuning.EMULATOR)
    table = tuning.check_table(json.loads(path.read_text()), qk_norm_module.TUNED)
    assert [e["key"]["elements"] for e in table["entries"]] == [128, 512]
    table["entries"][1]["args"] = {"late_trigger": True}  # the emulator's clock chose at random
    path.write_text(json.dumps(table))
    masks = tuple(sum(e["args"].get(a, False) << e["key"]["elements"].bit_length() for e in table["entries"])
                  for a in ("late_weight", "late_trigger"))
    qk_norm_module._module.cache_clear()
    tuning._entries.cache_clear()  # read once per process: the first call above found no table
    asked.clear()
    assert all(torch.equal(g, w) for g, w in zip(call(), want, strict=True))
    assert asked == [masks] and masks[1] & (1 << 10)
    assert real(torch.float32, 64, "emu", False, (0, 1 << 9)).title == "qk_norm<fp32_t, 64, false, false, 0, 512>"
    assert [s.title for s in qk_norm_module._specializations([torch.float32], 64, backend="emu")] == [
        real(torch.float32, 64, "emu", False, masks).title]  # warmup builds what the op loads


def test_the_qk_norm_serving_grid_has_one_shape_per_key():
    """The key knows no heads: two shapes of one key would overwrite each other's entry."""
    grid = qk_norm_module.TUNED.grids["serving"]
    keys = [(s["dtype"], s["head_dim"], tuning.size_bucket(s["tokens"] * (s["q_heads"] + s["k_heads"]) * s["head_dim"]))
            for s in grid]
    assert len(set(keys)) == len(keys) and len(grid) <= 150
    assert tuple(qk_norm_module.TUNED.bench(grid[2], "cpu").key.values()) == keys[2]


group_quant_module = importlib.import_module("kernkit.ops.per_token_group_quant_fp8")


def test_tune_group_quant_on_the_emulator_writes_a_table_the_op_reads_with_the_defaults_bits(fresh_cache, monkeypatch,
                                                                                              tmp_path, capsys,
                                                                                              request):
    monkeypatch.setattr(tuning, "SHIPPED_DIR", tmp_path / "shipped")
    for memo in (group_quant_module._module, tuning._entries):  # later tests load the untuned build
        request.addfinalizer(memo.cache_clear)
    asked = []
    real = group_quant_module.per_token_group_quant_fp8_spec

    def spy(dtype, group_size, column_major, ue8m0, backend=None, one_vector=0):
        asked.append(one_vector)
        return real(dtype, group_size, column_major, ue8m0, backend, one_vector)

    monkeypatch.setattr(group_quant_module, "per_token_group_quant_fp8_spec", spy)
    group_quant_module._module.cache_clear()
    tuning._entries.cache_clear()
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(5)).bfloat16()

    def call() -> list[torch.Tensor]:
        q, scales = ops.per_token_group_quant_fp8(x[:1], 128, column_major_scales=True)  # 256 elements: bit 9
        q1, scales1 = ops.per_token_group_quant_fp8(x, 128, column_major_scales=True)  # 768: bit 10
        return [q.view(torch.uint8), scales, q1.view(torch.uint8), scales1]

    want = call()  # before the table: the defaults
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps([{"dtype": "bfloat16", "group_size": 128, "column_major_scales": True,
                                   "scale_ue8m0": False, "hidden": 256, "tokens": n} for n in (2, 3)]))
    argv = ["tune", "per_token_group_quant_fp8", "--device", "cpu", "--shapes", str(shapes), "--repeats", "3", "-q"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "per_token_group_quant_fp8: 1 keys" in out and "other outputs" not in out  # both in the bucket of 512
    path = tune_cli.table_path(group_quant_module.TUNED, tuning.EMULATOR)
    table = tuning.check_table(json.loads(path.read_text()), group_quant_module.TUNED)
    assert [e["key"] for e in table["entries"]] == [{"dtype": "bfloat16", "group_size": 128,
                                                    "column_major_scales": True, "scale_ue8m0": False,
                                                    "elements": 512}]
    table["entries"][0]["args"] = {"one_vector": True}  # the emulator's clock chose at random
    path.write_text(json.dumps(table))
    group_quant_module._module.cache_clear()
    tuning._entries.cache_clear()  # read once per process: the first call above found no table
    asked.clear()
    got = call()
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert asked == [1 << 10]  # one build: 512 to 1023 elements (the 3 tokens) take one vector a thread
    assert real(torch.bfloat16, 128, True, False, "emu", 1 << 10).title == (
        "per_token_group_quant_fp8<bf16_t, 128, true, false, false, 1024>")
    assert [s.title for s in group_quant_module._specializations([torch.bfloat16], 128, True, backend="emu")] == [
        real(torch.bfloat16, 128, True, False, "emu", 1 << 10).title]  # warmup builds what the op loads


def test_the_group_quant_serving_grid_has_one_shape_per_key():
    """The build knows no hidden size: two shapes of one key would overwrite each other's entry."""
    grid = group_quant_module.TUNED.grids["serving"]
    keys = [(s["dtype"], s["group_size"], s["column_major_scales"], s["scale_ue8m0"],
             tuning.size_bucket(s["tokens"] * s["hidden"])) for s in grid]
    assert len(set(keys)) == len(keys) and len(grid) <= 150
    bench = group_quant_module.TUNED.bench(grid[2], "cpu")
    assert tuple(bench.key.values()) == keys[2] and len(bench.calls(None)) == 200


def test_tune_compares_outputs_of_every_layout_the_scales_take_bit_for_bit():
    """The column-major scales of one token are a view of stride 4 (packed UE8M0) or a column
    of stride 8: ``tune`` compares their bytes all the same, and a one-bit change tells."""
    words = torch.arange(14, dtype=torch.int32)
    for scales in (torch.empty(14, 4, dtype=torch.int32).t()[:1], torch.empty(1, 8).t()[:, :1]):
        scales.copy_(words[:scales.numel()].view(scales.shape).to(scales.dtype))
        same = scales.clone()
        assert tune_cli._same(group_quant_module.TUNED, [scales], [same])
        same.view(torch.int32).view(-1)[-1] ^= 1
        assert not tune_cli._same(group_quant_module.TUNED, [scales], [same])
