"""A transformers model's decode and prefill speed, unpatched, under torch.compile, patched with
kernkit and patched with liger-kernel, side by side in one process.

    python benchmark/bench_model.py [--model llama3-8b] [--batches 1 8 64] [--prompt 512] [--new 128]
                                    [--prefill 4096] [--variants eager compile kernkit kernkit+compile liger]
                                    [--out FILE.json] [--plot FILE.png]
    python benchmark/bench_model.py --replot FILE.json --plot FILE.png

The model has the shapes of ``--model`` (``kernkit.testing.models.CONFIGS``) and
random weights, in bfloat16 on the GPU; each variant makes its own copy from one seed. Variants:

- ``eager``: transformers as it is, a dynamic cache, no compile;
- ``compile``: transformers with a static cache, whose decode step ``generate`` compiles with
  ``torch.compile(mode="reduce-overhead")`` (inductor and CUDA graphs);
- ``kernkit``: ``apply_kernkit(model)``, eager, a dynamic cache;
- ``kernkit+compile``: ``apply_kernkit(model)`` then ``compile``'s static cache and compile;
- ``liger``: ``apply_liger_kernel_to_<family>(model=...)`` (its RMSNorm, rotary and SwiGLU),
  eager, a dynamic cache.

Decode tokens/s and ms per step at each batch: ``generate`` of ``--new`` tokens after a
``--prompt``-token random prompt (every sequence runs to the end), less the time of a
``generate`` of one token (the prefill), over ``new - 1`` steps; the median of 3 runs after a
warm-up run of the same shapes (which compiles and records the graphs). The compiled variants
reuse one static cache, reset before each ``generate``. Prefill: one forward of ``1 x
--prefill`` tokens, the median of 5 after a warm-up (eager variants). The profile: torch's
profiler over 8 decode steps at batch 1 (the same subtraction of the prefill), the GPU time of
its kernels by kind (matrix products, attention, kernkit's kernels, liger's, the rest). It measures and prints; it never
asserts a speed. ``--plot`` draws decode tokens/s by batch, one line per variant (it needs
matplotlib); ``--replot`` draws it from a ``--out`` file without measuring.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from kernkit.testing.models import CONFIGS, random_model

VARIANTS = ("eager", "compile", "kernkit", "kernkit+compile", "liger")

#: Substrings of kernel names, by kind, tried in order (lowercase).
KINDS = (("kernkit", ("kernkit",)), ("liger", ("_rms_norm", "_rope", "_swiglu", "liger")),
         ("attention", ("flash", "fmha", "attention", "efficient")),
         ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "gemv", "splitk", "sm90_")))


def make(name: str, variant: str):
    """A fresh random model for ``variant``; returns it and its patch time (s, or None)."""
    m = random_model(name)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if variant.startswith("kernkit"):
        from kernkit.integrations.transformers import apply_kernkit

        apply_kernkit(m)
    elif variant == "liger":
        import liger_kernel.transformers as liger

        family = m.config.model_type
        getattr(liger, f"apply_liger_kernel_to_{family}")(model=m, rope=True, rms_norm=True, swiglu=True,
                                                           cross_entropy=False, fused_linear_cross_entropy=False)
    else:
        return m, None
    torch.cuda.synchronize()
    return m, time.perf_counter() - t0


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def generator(m, variant: str, batch: int, prompt_len: int, new: int):
    """``gen(n)``: greedy ``generate`` of ``n`` tokens after a random ``batch x prompt_len``
    prompt. The compiled variants use one static cache, reset before each call, so that every
    call replays the same CUDA graphs on the same buffers."""
    from transformers import StaticCache

    prompt = torch.randint(0, m.config.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(batch))
    prompt = prompt.cuda()
    kwargs = dict(do_sample=False, pad_token_id=0)
    cache = StaticCache(config=m.config, max_cache_len=prompt_len + new) if variant.endswith("compile") else None
    if cache is None:
        kwargs["disable_compile"] = True

    def gen(n: int):
        if cache is not None:
            cache.reset()
            kwargs["cache"] = cache
        with torch.no_grad():
            out = m.generate(prompt, max_new_tokens=n, min_new_tokens=n, **kwargs)
        assert out.shape == (batch, prompt_len + n)

    return gen


def decode_step(m, variant: str, batch: int, prompt_len: int, new: int) -> float:
    """Seconds per decode step (module docstring)."""
    gen = generator(m, variant, batch, prompt_len, new)
    gen(new)  # warm-up: compiles and records the graphs of these shapes
    gen(1)
    runs = []
    for _ in range(3):
        runs.append(timed(lambda: gen(new)) - timed(lambda: gen(1)))
    return statistics.median(runs) / (new - 1)


def prefill_time(m, tokens: int) -> float:
    ids = torch.randint(0, m.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(7)).cuda()
    with torch.no_grad():
        m(ids, logits_to_keep=1)
        return statistics.median(timed(lambda: m(ids, logits_to_keep=1)) for _ in range(5))


def kernel_us(fn) -> dict[str, float]:
    """GPU time (us) of the kernels ``fn`` launches, by name."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total for e in prof.key_averages() if e.device_time_total > 0}


def profile(m, variant: str, prompt_len: int, steps: int = 8) -> dict:
    """GPU kernel time of one decode step at batch 1, by kind (``KINDS``), and the eight kernels
    of kind "other" that take longest: a ``generate`` of ``steps + 1`` tokens less one of 1
    (the prefill), over ``steps``."""
    gen = generator(m, variant, 1, prompt_len, steps + 1)
    gen(steps + 1)  # warm
    many, one = kernel_us(lambda: gen(steps + 1)), kernel_us(lambda: gen(1))
    kinds: dict[str, float] = {}
    other: dict[str, float] = {}
    for name, us in many.items():
        us = (us - one.get(name, 0.0)) / steps
        kind = next((k for k, subs in KINDS if any(sub in name.lower() for sub in subs)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + us
        if kind == "other":
            other[name[:90]] = other.get(name[:90], 0.0) + us
    return {"gpu_us": kinds, "other_top_us": dict(sorted(other.items(), key=lambda kv: -kv[1])[:8])}


def plot(results: dict, path: Path) -> None:
    """Decode tokens/s by batch, one line per variant, to ``path``."""
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit("bench_model.py: --plot needs matplotlib: pip install matplotlib") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, r in results["variants"].items():
        points = sorted((int(b), rate) for b, rate in r["decode_tok_s"].items())
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=variant)
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="decode tokens/s",
           title=f"{results['model']}, {results['device']}, {results['date']}")
    ax.set_xticks(results["batches"], [str(b) for b in results["batches"]])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama3-8b", choices=list(CONFIGS))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--prefill", type=int, default=4096)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path, help="draw decode tokens/s by batch to this PNG")
    p.add_argument("--replot", type=Path, help="read the results from this --out file instead of measuring")
    a = p.parse_args()
    if a.replot:
        if not a.plot:
            p.error("--replot needs --plot")
        plot(json.loads(a.replot.read_text()), a.plot)
        return

    import transformers

    results = {"model": a.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "transformers": transformers.__version__,
               "date": time.strftime("%Y-%m-%d"), "prompt": a.prompt, "new": a.new, "batches": a.batches,
               "variants": {}}
    for variant in a.variants:
        torch._dynamo.reset()
        r = {"patch_s": None, "decode_tok_s": {}}
        results["variants"][variant] = r
        m = None
        try:
            m, r["patch_s"] = make(a.model, variant)
            if not variant.endswith("compile"):
                r["prefill_ms"] = prefill_time(m, a.prefill) * 1e3
            r["step_ms"] = {}
            for b in a.batches:
                step = decode_step(m, variant, b, a.prompt, a.new)
                r["step_ms"][b], r["decode_tok_s"][b] = step * 1e3, b / step
                print(f"{variant:16s} batch {b:3d}: {b / step:9.1f} tok/s, {step * 1e3:7.2f} ms/step", flush=True)
                if a.out:  # after each figure: a run cut short keeps what it measured
                    a.out.write_text(json.dumps(results, indent=1))
            r["profile"] = profile(m, variant, a.prompt)
        except Exception as e:  # one variant failing (a peer's patch on this transformers) leaves the others
            r["error"] = f"{type(e).__name__}: {e}"[:500]
            print(f"{variant}: {r['error']}", flush=True)
        del m
        gc.collect()
        torch.cuda.empty_cache()
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))
    if a.plot:
        plot(results, a.plot)

    print(f"\n{a.model} on {results['device']}, {a.prompt}-token prompt, {a.new} new tokens; decode tokens/s "
          f"(ms per step)")
    print(f"{'variant':16s}" + "".join(f"{'b' + str(b):>18s}" for b in a.batches)
          + f"{'prefill ms':>12s}{'patch s':>9s}")
    for variant, r in results["variants"].items():
        print(f"{variant:16s}" + "".join(f"{r['decode_tok_s'][b]:10.1f} ({r['step_ms'][b]:5.2f})"
                                         if b in r["decode_tok_s"] else f"{'-':>18s}" for b in a.batches)
              + (f"{r['prefill_ms']:12.1f}" if "prefill_ms" in r else f"{'-':>12s}")
              + (f"{r['patch_s']:9.2f}" if r["patch_s"] is not None else f"{'-':>9s}"))
    for variant, r in results["variants"].items():
        if "profile" in r:
            gpu = r["profile"]["gpu_us"]
            total = sum(gpu.values())
            print(f"{variant:16s} GPU us/step {total:8.1f}: " + ", ".join(
                f"{k} {v:.1f} ({100 * v / total:.1f}%)" for k, v in sorted(gpu.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
