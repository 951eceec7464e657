"""Each emulated CUDA primitive against its specification (see emu_primitives.cu)."""

from fractions import Fraction

import pytest

import emu_build

CASES = [
    "shfl_widths", "shfl_types", "shfl_partial_mask", "votes", "activemask", "barrier_early_exit",
    "barrier_votes", "syncwarp", "smem_isolation", "atomics", "half_atomics", "builtins", "bad_launch",
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", ["0", "12345"])
def test_primitive(emu_exe, case, seed):
    exe = emu_exe("emu_primitives.cu")
    res = emu_build.run(exe, case, env={"KERNKIT_EMU_SEED": seed, "KERNKIT_EMU_THREADS": "2"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("PASS"), res.stdout


def test_every_case_is_listed(emu_exe):
    listed = emu_build.run(emu_exe("emu_primitives.cu")).stdout.split()
    assert sorted(listed) == sorted(CASES + ["hfma_dump"])


def _decode(bits: int, mbits: int, ebits: int) -> Fraction | None:
    sign = -1 if bits >> (mbits + ebits) else 1
    e = (bits >> mbits) & ((1 << ebits) - 1)
    m = bits & ((1 << mbits) - 1)
    bias = (1 << (ebits - 1)) - 1
    if e == (1 << ebits) - 1:
        return None  # inf/nan: not exercised by the exact check
    if e == 0:
        return sign * Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias)
    return sign * (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (e - bias)


def _round(v: Fraction, mbits: int, ebits: int) -> int:
    """Round-to-nearest-even of an exact rational to the format's bits (independent of the C++)."""
    bias = (1 << (ebits - 1)) - 1
    sign = 1 if v < 0 else 0
    a = abs(v)
    if a == 0:
        return sign << (mbits + ebits)
    x = 1 - bias
    while a >= Fraction(2) ** (x + 1):
        x += 1
    q = Fraction(2) ** (x - mbits)
    n, r = divmod(a, q)
    n = int(n)
    if r / q > Fraction(1, 2) or (r / q == Fraction(1, 2) and n % 2 == 1):
        n += 1
    if n >= 2 << mbits:
        n >>= 1
        x += 1
    if x > bias:
        return (sign << (mbits + ebits)) | (((1 << ebits) - 1) << mbits)
    if n < 1 << mbits:
        return (sign << (mbits + ebits)) | n
    return (sign << (mbits + ebits)) | ((x + bias) << mbits) | (n - (1 << mbits))


def test_hfma_is_correctly_rounded(emu_exe):
    """__hfma (half and bfloat16) equals the exact a*b+c rounded once, checked with rationals."""
    res = emu_build.run(emu_exe("emu_primitives.cu"), "hfma_dump")
    assert res.returncode == 0, res.stdout
    checked = 0
    for line in res.stdout.split("\n"):
        if not line:
            continue
        kind, a, b, c, got = line.split()
        mbits, ebits = (10, 5) if kind == "fp16" else (7, 8)
        va, vb, vc = (_decode(int(x, 16), mbits, ebits) for x in (a, b, c))
        if va is None or vb is None or vc is None:
            continue
        exact = va * vb + vc
        want = _round(exact, mbits, ebits)
        if exact == 0:  # sign of an exact zero follows IEEE rules; compare magnitude only
            assert int(got, 16) & ~(1 << (mbits + ebits)) == 0, line
        else:
            assert int(got, 16) == want, f"{line}: want {want:04x}"
        checked += 1
    assert checked > 6000


@pytest.mark.slow
def test_cost_per_simulated_thread(emu_exe):
    """Runs the emulator benchmark (docs/emulator.md quotes its numbers) on a small grid."""
    res = emu_build.run(emu_exe("emu_bench.cu"), "2048", env={"KERNKIT_EMU_SEED": "0"})
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {line.split()[0]: float(line.split()[3]) for line in res.stdout.strip().split("\n")}
    assert set(rows) == {"trivial", "shuffle_heavy", "barrier_heavy"}
    print("ns per simulated thread:", rows)
    # Generous bound (a 2-core CI machine): catches a switch that regressed to a system call.
    assert rows["trivial"] < 2000, rows
