"""kernkit.integrations.transformers on the CPU, through the emulator: tiny random Llama (default
and llama3 rotary), Qwen2 and Qwen3 models (2 layers, ``from_config``, no download) patched with
``apply_kernkit`` against an unpatched copy.

What "the same model" means here (the module docstring of ``kernkit.integrations.transformers``
says why they are not bit-identical): prefill and 8 greedy decode steps, fed the same tokens,
give logits within ``1e-5 * max|logits|`` in float32 (measured: at most 7.4e-7) and within
``3e-2 * max|logits|`` in bfloat16 (measured: at most 9.8e-3), and ``generate()`` picks the same
tokens in float32 with a dynamic and with a static cache. The patch's errors each name what to
change, and a patch that fails leaves the model as it was."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

transformers = pytest.importorskip("transformers",
                                   reason="needs the transformers extra: pip install 'kernkit[transformers]'")

from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, Qwen2Config, Qwen3Config  # noqa: E402

import kernkit.ops  # noqa: E402
from kernkit.integrations import transformers as kit  # noqa: E402

bf16, fp32 = torch.bfloat16, torch.float32

#: max|patched - unpatched| / max|unpatched| of the logits the docstring allows, per dtype.
TOLERANCE = {fp32: 1e-5, bf16: 3e-2}

COMMON = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=32)


def config(family: str, **changes):
    """A tiny config of ``family``: ``llama``, ``llama3`` (llama3 rotary scaling), ``qwen2``
    (q/k/v biases) or ``qwen3`` (q/k norms; head_dim 64, the least qk_norm takes)."""
    if family == "llama":
        return LlamaConfig(**{**COMMON, **changes})
    if family == "llama3":
        return LlamaConfig(**{**COMMON, "rope_parameters": LLAMA3_ROPE, **changes})
    if family == "qwen2":
        return Qwen2Config(**{**COMMON, **changes})
    return Qwen3Config(**{**COMMON, "head_dim": 64, **changes})


def model(family: str, dtype: torch.dtype = fp32, seed: int = 0, **changes):
    """A random model of ``family`` in ``dtype``, in eval mode, without grads."""
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config(family, **changes), dtype=dtype).eval().requires_grad_(False)


def patched_pair(family: str, dtype: torch.dtype = fp32, **changes):
    ref = model(family, dtype, **changes)
    return ref, kit.apply_kernkit(copy.deepcopy(ref), progress=False)


def snapshot(m: torch.nn.Module) -> dict:
    """What a patch must leave alone when it fails: every tensor's values and storage, and
    every module's class."""
    return {"tensors": {k: (v.clone(), v.data_ptr()) for k, v in m.state_dict(keep_vars=True).items()},
            "buffers": sorted(name for name, _ in m.named_buffers()),
            "classes": [type(sub) for sub in m.modules()], "dict": sorted(m.__dict__)}


def assert_unchanged(m: torch.nn.Module, before: dict) -> None:
    after = snapshot(m)
    assert after["classes"] == before["classes"] and after["buffers"] == before["buffers"]
    assert after["dict"] == before["dict"]
    assert after["tensors"].keys() == before["tensors"].keys()
    for key, (value, ptr) in before["tensors"].items():
        assert torch.equal(after["tensors"][key][0], value) and after["tensors"][key][1] == ptr, key


@pytest.fixture
def op_calls(monkeypatch):
    """Counts of the kernkit ops the patched model calls, by name."""
    counts: dict[str, int] = {}
    for name in ("rmsnorm", "fused_add_rmsnorm", "qk_norm", "rotary_embedding", "silu_and_mul"):
        op = getattr(kernkit.ops, name)

        def counted(*args, _fn=op, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(kernkit.ops, name, functools.wraps(op)(counted))
    return counts


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


@pytest.mark.parametrize("dtype", [fp32, bf16], ids=str)
@pytest.mark.parametrize("family", ["llama", "llama3", "qwen2", "qwen3"])
def test_prefill_and_decode_logits_within_the_stated_tolerance(family, dtype, op_calls):
    ref, m = patched_pair(family, dtype)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    ref_cache, cache = DynamicCache(config=ref.config), DynamicCache(config=m.config)
    with torch.no_grad():
        want = ref(ids, cache=ref_cache, use_cache=True).logits
        got = m(ids, cache=cache, use_cache=True).logits
        calls = dict(op_calls)
        for step in range(9):
            assert rel_error(got, want) <= TOLERANCE[dtype], f"step {step}"
            token = want[:, -1:].argmax(-1)  # both fed the same tokens
            want = ref(token, cache=ref_cache, use_cache=True).logits
            got = m(token, cache=cache, use_cache=True).logits
    # One forward of 2 layers: the first layer's norms and the final norm alone, the second
    # layer's residual add and norm fused; rotary, the MLP and Qwen3's q/k norms once a layer.
    assert calls == {"rmsnorm": 4, "fused_add_rmsnorm": 1, "rotary_embedding": 2, "silu_and_mul": 2,
                     **({"qk_norm": 2} if family == "qwen3" else {})}
    assert cache.get_seq_length() == 12 + 9


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_generate_picks_the_unpatched_models_tokens(family, cache):
    ref, m = patched_pair(family)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(2))
    kwargs = dict(max_new_tokens=8, do_sample=False, cache_implementation=cache, pad_token_id=0)
    want = ref.generate(ids, **kwargs)
    got = m.generate(ids, **kwargs)
    assert got.shape == (2, 15) and torch.equal(got, want)


def test_torch_compile_traces_the_patched_model():
    """``torch.compile`` (aot_eager here; inductor and CUDA graphs: the GPU tests) traces the
    custom ops, with no graph break in a decoder layer."""
    ref, m = patched_pair("qwen3")
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    compiled = torch.compile(m.model.layers[1], backend="aot_eager", fullgraph=True)
    h = torch.randn(1, 5, 128, generator=torch.Generator().manual_seed(4))
    rotary = m.model.rotary_emb(h, torch.arange(5)[None])
    pos = torch.arange(5)[None]
    with torch.no_grad():
        want = m.model.layers[1](h.clone(), position_embeddings=rotary, position_ids=pos, attention_mask=None)
        got = compiled(h.clone(), position_embeddings=rotary, position_ids=pos, attention_mask=None)
        assert torch.equal(got, want)
        assert rel_error(torch.compile(m, backend="aot_eager")(ids).logits, ref(ids).logits) <= TOLERANCE[fp32]
    torch._dynamo.reset()


def test_output_hidden_states_runs_unfused_and_agrees(op_calls):
    """transformers records hidden states through forward hooks on the layers: the patched layer
    then adds and normalizes separately (its input is watched) and still agrees."""
    ref, m = patched_pair("llama")
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want, got = ref(ids, output_hidden_states=True), m(ids, output_hidden_states=True)
    assert len(got.hidden_states) == len(want.hidden_states) == 3
    for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
        assert rel_error(g, w) <= TOLERANCE[fp32]
    assert "fused_add_rmsnorm" not in op_calls and op_calls["rmsnorm"] == 5


def test_the_patch_keeps_the_state_dict_and_its_memory():
    ref, m = patched_pair("qwen2")
    sd_ref, sd = ref.state_dict(), m.state_dict()
    assert sd.keys() == sd_ref.keys() and all(torch.equal(sd[k], sd_ref[k]) for k in sd)
    attn = m.model.layers[0].self_attn
    merged = attn.kernkit_qkv_weight
    assert attn.q_proj.weight.untyped_storage().data_ptr() == merged.untyped_storage().data_ptr()
    assert attn.v_proj.bias.untyped_storage().data_ptr() == attn.kernkit_qkv_bias.untyped_storage().data_ptr()
    assert type(m.model.layers[0]).__name__ == "KernkitQwen2DecoderLayer"
    assert isinstance(m.model.layers[0], transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer)


def test_class_level_patch_applies_to_models_made_later(monkeypatch):
    base = transformers.models.llama.modeling_llama.LlamaPreTrainedModel
    for name in ("from_pretrained", "_from_config"):  # undone after the test
        monkeypatch.setattr(base, name, getattr(base, name))
    assert kit.apply_kernkit_to_llama(progress=False) is None
    m = AutoModelForCausalLM.from_config(config("llama"))
    assert getattr(m, "kernkit_patched", False) and not m.training
    other = AutoModelForCausalLM.from_config(config("qwen2"))  # another family: untouched
    assert not getattr(other, "kernkit_patched", False)
    with pytest.raises(TypeError, match="is not a Llama model"):
        kit.apply_kernkit_to_llama(model("qwen3"))


# ----- patch-time errors: each names what to change, and the model is left as it was


def _refused(m, error, match, **options):
    before = snapshot(m)
    with pytest.raises(error, match=match):
        kit.apply_kernkit(m, progress=False, **options)
    assert_unchanged(m, before)


def test_unknown_model_class_is_refused():
    _refused(torch.nn.Linear(4, 4), TypeError, "is not a model kernkit knows")
    from transformers import GPT2Config
    _refused(AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)),
             TypeError, r"GPT2LMHeadModel \(model_type 'gpt2'\) is not a model kernkit knows")


def test_training_mode_and_grads_are_refused():
    _refused(model("llama").train(), kit.PatchError, r"training mode.*model.eval\(\)")
    m = model("llama")
    m.model.layers[1].mlp.up_proj.weight.requires_grad_(True)
    _refused(m, kit.PatchError, r"'model.layers.1.mlp.up_proj.weight' requires grad.*requires_grad_\(False\)")


def test_a_transformers_whose_layers_take_past_key_values_is_refused(monkeypatch):
    """transformers before 5.25 hands its layers the cache as ``past_key_values``: kernkit's
    forwards, which take ``cache``, would run without it."""
    from transformers.models.llama import modeling_llama

    def older(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
        raise AssertionError("not called")

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", older)
    _refused(model("llama"), kit.PatchError, r"past_key_values.*transformers 5.25 or newer")


def test_dtypes_and_devices_the_ops_refuse():
    _refused(model("llama").double(), kit.PatchError, r"torch.float64.*model.to\(dtype\)")
    m = model("llama")
    m.lm_head.to(bf16)
    _refused(m, kit.PatchError, "torch.bfloat16, torch.float32")


def test_rope_types_with_more_than_a_position_are_refused():
    _refused(model("llama", rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                 original_max_position_embeddings=32)),
             kit.PatchError, "rope_type 'yarn' is not supported.*default, llama3")


def test_shapes_the_ops_refuse_name_the_config_field():
    _refused(model("qwen3", head_dim=32), kit.PatchError, r"qk_norm refuses this model's head_dim=32")
    _refused(model("llama", dtype=bf16, hidden_size=132, num_attention_heads=2), kit.PatchError,
             r"rmsnorm refuses this model's hidden_size=132")
    _refused(model("llama", hidden_act="gelu"), kit.PatchError, "hidden_act 'gelu'")
    _refused(model("llama"), kit.PatchError, "'max_positions': expected a positive int", max_positions=0)


def test_a_patch_failing_midway_leaves_the_model_as_it_was(monkeypatch):
    """A failure after the first projections were merged (here: the second MLP's merge runs out
    of memory) undoes every merge."""
    m = model("qwen2")
    merges = []

    def failing(linears, what, _real=kit._merged):
        merges.append(what)
        if len(merges) == 4:  # two attentions merged, one MLP merged
            raise torch.OutOfMemoryError("out of memory (simulated)")
        return _real(linears, what)

    monkeypatch.setattr(kit, "_merged", failing)
    _refused(m, torch.OutOfMemoryError, "simulated")
    assert len(merges) == 4


def test_patching_twice_is_refused():
    _, m = patched_pair("llama")
    with pytest.raises(kit.PatchError, match="patched already"):
        kit.apply_kernkit(m, progress=False)
