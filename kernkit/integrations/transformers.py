"""transformers' Llama, Qwen2 and Qwen3 models on kernkit's kernels, for inference.

``apply_kernkit(model)`` swaps, in one model, what liger-kernel's ``apply_liger_kernel_to_*``
swaps, and fuses where kernkit has a kernel for it:

- every RMSNorm runs ``rmsnorm``; the residual add before each layer's second norm and that norm
  run as one ``fused_add_rmsnorm`` (not in the first layer, whose input may be the caller's
  ``inputs_embeds``, nor while a forward hook watches a layer's input or output);
- the q, k and v projections run as one GEMM; Qwen3's ``q_norm`` and ``k_norm`` run as one
  ``qk_norm`` on its q and k slices, and rotary as ``rotary_embedding`` on them, in place, with a
  cos/sin cache made once by the model's own rotary module (``default`` and ``llama3``
  ``rope_type``);
- the MLP's gate and up projections run as one GEMM, then ``silu_and_mul``.

The norms use transformers' rounding (``cast_x_before_out_mul=True``: the normalized value is
rounded to the model's dtype before the weight multiplies it), so a bf16 model keeps its own
rounding there. Attention itself, the cache, the projections and sampling stay transformers'.
The merged projections are stored once: the model's ``q_proj``/``k_proj``/``v_proj`` and
``gate_proj``/``up_proj`` weights become views of them, so ``state_dict()`` keeps its names and
values and the model needs no more memory than before.

How close the patched model is to the unpatched one: the kernels round once where transformers
rounds two or three times (rotary, the fp32 norm arithmetic), and their sums of squares add in
another order, so logits differ by a few roundings of the model's dtype, amplified by the
layers. Measured on random weights: float32 logits agree within ``1e-5 * max|logits|`` (tiny
models, the suite's test_transformers.py); a bfloat16 model is as close to a float32 copy of
its weights as it is unpatched (8B shapes, ``kernkit.testing.models``, the suite's GPU test
test_transformers_gpu.py: within 1.25 times the unpatched model's error, and closer where
measured), and its greedy token changes only
at near-ties of the unpatched model's logits.

Limits: inference only (the model in eval mode, no parameter requiring grad); one dtype
(float16, bfloat16 or float32) and one device (CUDA, or the CPU through kernkit's emulator) for
all parameters; ``hidden_act="silu"``; positions below ``max_positions`` (default the config's
``max_position_embeddings``: rotary leaves a token at a position past the cache unrotated).
Move the model to its device and dtype before patching, and save the unpatched model: a
``.to()`` afterwards copies the merged weights apart from their views.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

import kernkit.ops as ops
from kernkit.jit import JitSpec

try:
    import transformers
except ImportError as e:  # pragma: no cover - only without the extra
    raise ImportError("kernkit.integrations.transformers needs transformers: "
                      "pip install 'kernkit[transformers]'") from e

__all__ = ["PatchError", "apply_kernkit", "apply_kernkit_to_llama", "apply_kernkit_to_qwen2",
           "apply_kernkit_to_qwen3"]

#: model_type -> the prefix of its classes in transformers.models.<model_type>.modeling_<model_type>.
FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}

#: The rotary types whose cos/sin depend on the position alone, so that one cache serves.
ROPE_TYPES = ("default", "llama3")

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class PatchError(ValueError):
    """The model cannot run on kernkit's kernels as it is; the message says what to change. The
    model is left as it was."""


def _modeling(model_type: str) -> types.ModuleType:
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


def _family(model: nn.Module) -> tuple[str, types.ModuleType]:
    """``(prefix, modeling module)`` of a model of a family this module knows, else a TypeError."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in FAMILIES:
        modeling = _modeling(model_type)
        if isinstance(model, getattr(modeling, f"{FAMILIES[model_type]}PreTrainedModel")):
            return FAMILIES[model_type], modeling
    raise TypeError(f"apply_kernkit: {type(model).__name__} (model_type {model_type!r}) is not a model kernkit "
                    f"knows; supported: the transformers classes of model_type {', '.join(map(repr, FAMILIES))} "
                    f"(Llama 2/3, Qwen2, Qwen3 dense)")


# --- the patched forwards ---------------------------------------------------------------------
# Each is the forward of a subclass of the model's own class (``_subclass``), so that isinstance
# checks (transformers' output capture among them) still hold.


def _norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return ops.rmsnorm(hidden_states, self.weight, self.variance_epsilon, cast_x_before_out_mul=True)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.down_proj(ops.silu_and_mul(F.linear(x, self.kernkit_gate_up_weight, self.kernkit_gate_up_bias)))


def _attention_forward(self, hidden_states: torch.Tensor, position_embeddings: tuple, attention_mask=None,
                       cache=None, **kwargs):
    input_shape = hidden_states.shape[:-1]
    qkv = F.linear(hidden_states, self.kernkit_qkv_weight, self.kernkit_qkv_bias)
    q_size, kv_size = self.kernkit_sizes
    d = self.head_dim
    rows = qkv.view(-1, qkv.shape[-1])
    q = rows[:, :q_size].unflatten(-1, (-1, d))
    k = rows[:, q_size:q_size + kv_size].unflatten(-1, (-1, d))
    if hasattr(self, "q_norm"):  # Qwen3
        ops.qk_norm(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.variance_epsilon,
                    cast_x_before_out_mul=True)
    cos_sin_cache, positions = position_embeddings  # from _RotaryCache
    ops.rotary_embedding(positions, q, k, cos_sin_cache, True)

    shape = (*input_shape, -1, d)
    query_states = qkv[..., :q_size].view(shape).transpose(1, 2)
    key_states = qkv[..., q_size:q_size + kv_size].view(shape).transpose(1, 2)
    value_states = qkv[..., q_size + kv_size:].view(shape).transpose(1, 2)
    if cache is not None:
        key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
    attention = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, self.kernkit_eager_attention)
    if hasattr(self, "sliding_window"):  # Qwen2, Qwen3
        kwargs["sliding_window"] = self.sliding_window
    attn_output, attn_weights = attention(self, query_states, key_states, value_states, attention_mask,
                                          dropout=0.0, scaling=self.scaling, **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return self.o_proj(attn_output), attn_weights


def _layer_forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None, cache=None,
                   use_cache=False, position_embeddings=None, **kwargs) -> torch.Tensor:
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, cache=cache,
                                      use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    prev = self.kernkit_previous_layer
    if prev is not None and not (prev._forward_hooks or self._forward_pre_hooks):
        # The input is the previous layer's own output, which nothing else holds: it becomes the
        # residual sum in place, and the attention output its norm.
        norm = self.post_attention_layernorm
        ops.fused_add_rmsnorm(hidden_states, residual, norm.weight, norm.variance_epsilon,
                              cast_x_before_out_mul=True)
    else:
        residual = residual + hidden_states
        hidden_states = self.post_attention_layernorm(residual)
    return residual + self.mlp(hidden_states)


class _RotaryCache(nn.Module):
    """Stands in for the model's rotary module: it hands every layer the cos/sin cache and the
    tokens' positions, flattened (as ``position_embeddings``), instead of cos and sin."""

    cos_sin_cache: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, cos_sin_cache: torch.Tensor, replaced: nn.Module):
        super().__init__()
        self.register_buffer("cos_sin_cache", cos_sin_cache, persistent=False)
        self.rope_type = replaced.rope_type
        self.__dict__["kernkit_replaced"] = replaced  # kept for reading, not a submodule

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # position_ids is [1, s] or [b, s]; rotary_embedding takes one contiguous row per token.
        return self.cos_sin_cache, position_ids.expand(x.shape[:-1]).reshape(-1).contiguous()


_FORWARDS = {"RMSNorm": _norm_forward, "MLP": _mlp_forward, "Attention": _attention_forward,
             "DecoderLayer": _layer_forward}


@functools.cache
def _subclass(cls: type) -> type:
    """``Kernkit<cls>``: ``cls`` with kernkit's forward for its kind."""
    kind = next(k for k in _FORWARDS if cls.__name__.endswith(k))
    return type(f"Kernkit{cls.__name__}", (cls,), {"forward": _FORWARDS[kind], "__module__": __name__})


# --- checks, made before anything is changed --------------------------------------------------


def _check_model(model: nn.Module, prefix: str) -> tuple[torch.dtype, torch.device]:
    if getattr(model, "kernkit_patched", False):
        raise PatchError(f"apply_kernkit: this {type(model).__name__} is patched already")
    if model.training:
        raise PatchError(f"apply_kernkit: {type(model).__name__} is in training mode; kernkit's patch is for "
                         f"inference: call model.eval() first")
    params = list(model.named_parameters())
    for name, p in params:
        if p.requires_grad:
            raise PatchError(f"apply_kernkit: parameter {name!r} requires grad; kernkit's ops are not "
                             f"differentiable: call model.requires_grad_(False) first")
    dtypes = {p.dtype for _, p in params}
    devices = {p.device for _, p in params}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
        raise PatchError(f"apply_kernkit: the parameters are {', '.join(sorted(map(str, dtypes)))}; kernkit "
                         f"needs one dtype of float16, bfloat16, float32: call model.to(dtype) first")
    device = next(iter(devices))
    if len(devices) != 1 or device.type not in ("cuda", "cpu"):
        raise PatchError(f"apply_kernkit: the parameters are on {', '.join(sorted(map(str, devices)))}; kernkit "
                         f"needs them on one CUDA device (or the CPU, through its emulator): call "
                         f"model.to(device) first")
    config: Any = model.config  # a transformers config: its fields are its family's
    if getattr(config, "hidden_act", "silu") != "silu":
        raise PatchError(f"apply_kernkit: hidden_act {config.hidden_act!r} is not supported; kernkit's MLP "
                         f"runs silu_and_mul (hidden_act 'silu')")
    return next(iter(dtypes)), device


def _modules(model: nn.Module, prefix: str, modeling: types.ModuleType) -> dict[str, list]:
    """The model's modules of each kind kernkit patches, by exact class."""
    layer_forward = getattr(modeling, f"{prefix}DecoderLayer").forward
    if "cache" not in inspect.signature(layer_forward).parameters:  # kernkit's forwards take `cache=`
        raise PatchError(f"apply_kernkit: transformers {transformers.__version__} hands its layers the KV cache "
                         f"as past_key_values; kernkit's forwards follow transformers 5.25 or newer (cache): "
                         f"pip install 'kernkit[transformers]'")
    found: dict[str, list] = {kind: [] for kind in (*_FORWARDS, "RotaryEmbedding")}
    exact = {getattr(modeling, f"{prefix}{kind}"): kind for kind in found}
    for parent in model.modules():
        for name, child in parent.named_children():
            kind = exact.get(type(child))
            if kind is not None:
                found[kind].append((parent, name, child))
    if not found["DecoderLayer"] or len(found["RotaryEmbedding"]) != 1:
        raise PatchError(f"apply_kernkit: {type(model).__name__} has {len(found['DecoderLayer'])} "
                         f"{prefix}DecoderLayer and {len(found['RotaryEmbedding'])} {prefix}RotaryEmbedding "
                         f"modules; kernkit patches a model with decoder layers and one rotary module")
    rotary = found["RotaryEmbedding"][0][2]
    if rotary.rope_type not in ROPE_TYPES:
        raise PatchError(f"apply_kernkit: rope_type {rotary.rope_type!r} is not supported: its cos and sin depend "
                         f"on more than the position; supported: {', '.join(ROPE_TYPES)}")
    return found


def _specs(config, dtype: torch.dtype, device: torch.device, head_dim: int, qk_norm: bool) -> list[JitSpec]:
    """The builds the patched model runs, each op's own ``specializations``; an op that refuses
    the model's shape raises a PatchError that names the config field."""
    backend = "emu" if device.type == "cpu" else None
    wanted = [("rmsnorm", dict(hidden_size=config.hidden_size), "hidden_size"),
              ("rotary_embedding", dict(head_dim=head_dim), "head_dim"),
              ("silu_and_mul", {}, "intermediate_size")]
    if qk_norm:
        wanted.append(("qk_norm", dict(head_dim=head_dim), "head_dim"))
    by_name = {op.qualname: op for op in ops.registered_ops()}
    specs: list[JitSpec] = []
    for name, shape, field in wanted:
        specializations = by_name[f"kernkit::{name}"].specializations
        if specializations is None:
            raise PatchError(f"apply_kernkit: kernkit.ops.{name} declares no specializations to build")
        try:
            specs += specializations(dtypes=[dtype], backend=backend, cast_x_before_out_mul=True, **shape)
        except (TypeError, ValueError) as e:
            value = getattr(config, field, shape.get(field))
            raise PatchError(f"apply_kernkit: kernkit.ops.{name} refuses this model's {field}={value} in "
                             f"{dtype}: {e}") from e
    return specs


def _build(specs: list, what: str, progress: bool) -> None:
    """Build (or find in the cache) and load every spec, in parallel: a fresh cache compiles
    here, with a progress bar, and not at the first token."""
    with ThreadPoolExecutor(min(len(specs), 8)) as pool, \
            tqdm(total=len(specs), desc=f"kernkit: kernels for {what}", unit="build", disable=not progress) as bar:
        for spec in pool.map(lambda s: (s.build_and_load(), s)[1], specs):
            bar.set_postfix_str(spec.title, refresh=False)
            bar.update(1)


def _cos_sin_cache(rotary: nn.Module, dtype: torch.dtype, device: torch.device, positions: int) -> torch.Tensor:
    """``[positions, head_dim]``: the cosines, then the sines, of each position, computed by the
    model's rotary module itself and rounded to the model's dtype as it rounds them."""
    with torch.no_grad():
        cos, sin = rotary(torch.empty(0, dtype=dtype, device=device),
                          torch.arange(positions, device=device)[None])
    half = cos.shape[-1] // 2
    return torch.cat([cos[0, :, :half], sin[0, :, :half]], dim=-1).contiguous()


def _merged(linears: list[nn.Linear], what: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) holding ``linears``' in order; allocates, changes nothing."""
    biases = [lin.bias for lin in linears]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        raise PatchError(f"apply_kernkit: {what}: some projections have a bias and some do not")
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    return weight, bias


def _share(module: nn.Module, name: str, linears: list[nn.Linear], weight: torch.Tensor,
           bias: torch.Tensor | None) -> Callable[[], None]:
    """Store the merged weight and bias on ``module`` (non-persistent buffers) and make the
    projections' parameters views of them (the same values: the model stays as it was); returns
    the undo."""
    originals = [(lin.weight.data, None if bias is None else lin.bias.data) for lin in linears]
    module.register_buffer(f"kernkit_{name}_weight", weight, persistent=False)
    module.register_buffer(f"kernkit_{name}_bias", bias, persistent=False)
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight.data = weight[start:start + rows]
        if bias is not None:
            lin.bias.data = bias[start:start + rows]
        start += rows

    def undo() -> None:
        del module._buffers[f"kernkit_{name}_weight"], module._buffers[f"kernkit_{name}_bias"]
        for lin, (w, b) in zip(linears, originals, strict=True):
            lin.weight.data = w
            if b is not None:
                lin.bias.data = b

    return undo


# --- the patch --------------------------------------------------------------------------------


def apply_kernkit(model: nn.Module, *, max_positions: int | None = None, progress: bool = True) -> nn.Module:
    """Run a transformers Llama, Qwen2 or Qwen3 model on kernkit's kernels, in place.

    Every check is made and every kernel built (or found in kernkit's cache) before the model is
    changed; a patch that fails leaves the model as it was. The module docstring says what is
    replaced, how close the results are, and the limits.

    Parameters
    ----------
    model
        A ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` (or another class of
        these families: the base model, a classification head), in eval mode, with
        ``requires_grad_(False)``, on its device and in its dtype.
    max_positions
        Rows of the cos/sin cache: positions the model may see. Default
        ``config.max_position_embeddings``.
    progress
        Show a progress bar (on stderr) while the kernels are built or loaded.

    Returns
    -------
    The model, patched: it works with ``generate()``, ``DynamicCache`` and ``StaticCache``, under
    ``torch.compile`` and with CUDA graphs.

    Raises
    ------
    TypeError
        A model of another family.
    PatchError
        A model in training mode, a parameter that requires grad, a dtype, device, activation,
        rotary type or shape the kernels do not take; the message says what to change.

    Example
    -------
    >>> model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16).cuda().eval()  # doctest: +SKIP
    >>> apply_kernkit(model.requires_grad_(False))  # doctest: +SKIP
    >>> model.generate(**inputs, max_new_tokens=32)  # doctest: +SKIP
    """
    prefix, modeling = _family(model)
    dtype, device = _check_model(model, prefix)
    found = _modules(model, prefix, modeling)
    config: Any = model.config  # a transformers config: its fields are its family's
    attentions = [m for _, _, m in found["Attention"]]
    head_dim = attentions[0].head_dim
    qk_norm = hasattr(attentions[0], "q_norm")
    if qk_norm and any(a.q_norm.variance_epsilon != a.k_norm.variance_epsilon for a in attentions):
        raise PatchError("apply_kernkit: q_norm and k_norm have different eps; qk_norm takes one")
    positions = config.max_position_embeddings if max_positions is None else max_positions
    if not isinstance(positions, int) or isinstance(positions, bool) or positions <= 0:
        raise PatchError(f"apply_kernkit: 'max_positions': expected a positive int, got {positions!r}")
    _build(_specs(config, dtype, device, head_dim, qk_norm), type(model).__name__, progress)
    rotary_parent, rotary_name, rotary = found["RotaryEmbedding"][0]
    cache = _cos_sin_cache(rotary, dtype, device, positions)

    undo: list[Callable[[], None]] = []
    try:
        for attn in attentions:
            linears = [attn.q_proj, attn.k_proj, attn.v_proj]
            undo.append(_share(attn, "qkv", linears, *_merged(linears, "q_proj, k_proj, v_proj")))
        for _, _, mlp in found["MLP"]:
            linears = [mlp.gate_proj, mlp.up_proj]
            undo.append(_share(mlp, "gate_up", linears, *_merged(linears, "gate_proj, up_proj")))
    except BaseException:
        for step in reversed(undo):
            step()
        raise
    # Nothing below allocates on the device or can fail on the model's data.
    for attn in attentions:
        attn.kernkit_sizes = (attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0])
        attn.kernkit_eager_attention = modeling.eager_attention_forward  # a plain attribute: not bound
    layers = [m for _, _, m in found["DecoderLayer"]]
    for i, layer in enumerate(layers):
        layer.__dict__["kernkit_previous_layer"] = layers[i - 1] if i else None
    setattr(rotary_parent, rotary_name, _RotaryCache(cache, rotary))
    for kind in _FORWARDS:
        for _, _, module in found[kind]:
            # mypy takes a type[Any] for unhashable (python/mypy#11470); a class is hashable.
            module.__class__ = _subclass(type(module))  # type: ignore[arg-type]
    # torch types Module.__setattr__'s value as a tensor or module; it takes any.
    model.kernkit_patched = True  # type: ignore[assignment]
    return model


def _apply_to(model_type: str, model: nn.Module | None, options: dict) -> nn.Module | None:
    """The ``apply_kernkit_to_<family>`` forms: patch ``model``, or, without one, every model of
    the family that ``from_pretrained`` or ``from_config`` makes from now on."""
    modeling = _modeling(model_type)
    if model is not None:
        if _family(model)[1] is not modeling:
            raise TypeError(f"apply_kernkit_to_{model_type}: {type(model).__name__} is not a "
                            f"{FAMILIES[model_type]} model; apply_kernkit(model) takes any supported family")
        return apply_kernkit(model, **options)
    base = getattr(modeling, f"{FAMILIES[model_type]}PreTrainedModel")
    for name in ("from_pretrained", "_from_config"):
        original = getattr(base, name).__func__
        if getattr(original, "kernkit_wraps", None) is not None:
            continue

        def make(cls, *args, _original=original, **kwargs):
            loaded = _original(cls, *args, **kwargs)
            return apply_kernkit(loaded.eval().requires_grad_(False), **options)

        make.__dict__["kernkit_wraps"] = original  # a function's own attributes are not typed
        setattr(base, name, classmethod(functools.wraps(original)(make)))
    return None


def apply_kernkit_to_llama(model: nn.Module | None = None, **options) -> nn.Module | None:
    """liger-kernel's form for Llama 2/3: ``apply_kernkit(model)`` with a check that it is a
    Llama model, or, with no model, every Llama model that ``from_pretrained`` or
    ``AutoModel*.from_config`` makes from now on, put in eval mode and
    ``requires_grad_(False)`` first (a model made with its constructor: patch it with
    ``apply_kernkit``).

    Parameters
    ----------
    model
        The model to patch, or None.
    options
        ``apply_kernkit``'s keywords.

    Returns
    -------
    The patched model, or None.

    Example
    -------
    >>> apply_kernkit_to_llama()  # doctest: +SKIP
    >>> model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", dtype=torch.bfloat16,
    ...                                              device_map="cuda")  # doctest: +SKIP
    """
    return _apply_to("llama", model, options)


def apply_kernkit_to_qwen2(model: nn.Module | None = None, **options) -> nn.Module | None:
    """``apply_kernkit_to_llama`` for Qwen2 models."""
    return _apply_to("qwen2", model, options)


def apply_kernkit_to_qwen3(model: nn.Module | None = None, **options) -> nn.Module | None:
    """``apply_kernkit_to_llama`` for Qwen3 dense models."""
    return _apply_to("qwen3", model, options)
