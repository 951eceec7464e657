"""``register_op``: the one decorator that makes a function a kernkit op.

It registers ``torch.ops.<namespace>.<name>`` (``torch.library`` define/impl, cheaper per call
than ``custom_op``), so ``torch.compile`` and ``torch.export`` see one node per call; the plain
function routes to it while traced (``torch.compiler.is_compiling()``) and runs the kernel
directly otherwise. An op whose outputs are keyword-only ``out=None`` (and the ``out_<name>=None``
after it, for more than one: ``per_token_quant_fp8``'s ``out`` and ``out_scales``) gets two custom ops:
``name`` (returns new tensors; ``fake`` allocates them) and ``name_out`` (mutates every output,
returns nothing); a traced call that passes some outputs allocates the others with ``fake``,
which then takes the outputs as keywords and returns those given as they are. Ops are not
differentiable (autograd falls through: outputs do not require grad; an input that requires grad
under grad mode is warned about once per op and argument). What torch checks for an
in-place op the public function checks too: it refuses to write a tensor autograd records or an
inference tensor outside inference mode, refuses tensors with the negative bit, and bumps the
version counters of what it wrote.

When a call fails before its launcher could name the argument (a non-tensor where a tensor is
expected, a tensor on a device tvm-ffi cannot take, a string as a float), the decorator checks
the arguments against the function's annotations and raises an error that names the argument.
This runs only after a failure: the per-call path is one ``is_compiling()``, a few tensor flags,
the call and the version bump.

The op's ``specializations(**model_shape)`` is kept too: ``python -m kernkit.jit warmup`` builds
them for every registered op (a user's own included: import its module, or pass ``--import``),
and ``available(op, device, **model_shape)`` tells whether they load here.
"""

from __future__ import annotations

import functools
import inspect
import logging
import typing
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..jit import ArchError, CacheDirError, CompileError, JitDisabledError, JitSpec, ToolchainError

__all__ = ["Op", "available", "register_op", "registered_ops"]

logger = logging.getLogger("kernkit.ops")


@dataclass(frozen=True)
class Op:
    """A registered op: its qualified name, the public function, and what it needs built."""

    qualname: str
    fn: Callable
    specializations: Callable[..., Iterable[JitSpec]] | None

    @property
    def name(self) -> str:
        return self.qualname.split("::")[1]


_ops: dict[str, Op] = {}


def _nothing(*args, **kwargs) -> None:
    """The fake of an op that returns nothing."""
_libraries: dict[str, torch.library.Library] = {}


def registered_ops() -> list[Op]:
    """Every op registered in this process, in registration order."""
    return list(_ops.values())


def _define(qualname: str, impl: Callable, params: list[inspect.Parameter], returns: object,
            mutates: tuple[str, ...], fake: Callable) -> Callable:
    """Define one custom op from a parameter list; returns its ``OpOverloadPacket``."""
    namespace, name = qualname.split("::")

    def proto(*args, **kwargs):  # what infer_schema reads: the op's signature
        pass

    proto.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    lib = _libraries.get(namespace) or _libraries.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
    lib.define(name + torch.library.infer_schema(proto, mutates_args=mutates))
    lib.impl(name, impl, "CompositeExplicitAutograd")
    lib.impl(name, torch.library.fallthrough_kernel, "Autograd")
    torch.library.register_fake(qualname, fake, lib=lib)
    return getattr(getattr(torch.ops, namespace), name)


def register_op(qualname: str | None = None, *, mutates_args: tuple[str, ...] = (), fake: Callable | None = None,
                specializations: Callable[..., Iterable[JitSpec]] | None = None) -> Callable[[Callable], Callable]:
    """Make the decorated function a kernkit op.

    Parameters
    ----------
    qualname
        ``"namespace::name"``; default ``kernkit::<function name>``. Give your own namespace
        for ops outside kernkit.
    mutates_args
        The parameters the op writes in place (besides ``out``).
    fake
        For an op that returns something: computes the result's shape, dtype and device from
        fake tensors (``torch.compile``); with ``out=None`` it is the allocation of ``out``.
    specializations
        ``(**model_shape) -> [JitSpec, ...]``: what the op needs built for a model shape
        (keyword arguments such as ``dtypes``, ``num_heads``, ``head_dim``, ``hidden_size``,
        ``backend``), for ``warmup`` and ``available``.

    Returns
    -------
    The decorator; it returns the public function.

    Example
    -------
    >>> @register_op(fake=lambda src, factor: torch.empty_like(src))
    ... def scale(src: torch.Tensor, factor: float, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    ...     out = torch.empty_like(src) if out is None else out
    ...     _module(src.dtype, src.is_cuda).scale(out, src, factor)
    ...     return out
    """

    def decorate(fn: Callable) -> Callable:
        name = qualname or f"kernkit::{fn.__name__}"
        if name in _ops:
            raise ValueError(f"register_op: {name} is registered already")
        sig = inspect.signature(fn)
        if any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
            raise TypeError(f"register_op: {name} takes positional-only or variable arguments")
        hints = typing.get_type_hints(fn)
        params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()]
        returns = None if hints.get("return") is type(None) else hints.get("return")
        outs = _outputs(name, params, returns)
        rest = [p for p in params if p.name not in outs]

        def impl(*args, **kwargs):  # the custom ops run the public function (op_fn, below)
            return op_fn(*args, **kwargs)

        if not outs:
            op = _define(name, impl, params, returns, mutates_args, fake or _nothing)

            def traced(*args, **kwargs):
                return op(*args, **kwargs)
        else:
            if fake is None:
                raise TypeError(f"register_op: {name} takes out=, so it needs fake= (the allocation of out)")
            functional = _define(name, impl, rest, returns, mutates_args, fake)

            def out_impl(*args, **kwargs):
                op_fn(*args[len(outs):], **dict(zip(outs, args[:len(outs)], strict=True)), **kwargs)

            out_params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor)
                          for n in outs]
            out_op = _define(f"{name}_out", out_impl, [*out_params, *rest], None, (*mutates_args, *outs), _nothing)

            def traced(*args, **kwargs):
                given = {n: kwargs.pop(n, None) for n in outs}
                if all(t is None for t in given.values()):
                    return functional(*args, **kwargs)
                if len(outs) == 1:
                    out_op(given["out"], *args, **kwargs)
                    return given["out"]
                if any(t is None for t in given.values()):  # the others, as the functional op allocates them
                    given = dict(zip(outs, fake(*args, **given, **kwargs), strict=True))
                out_op(*given.values(), *args, **kwargs)
                return tuple(given.values())

        tensors = [p.name for p in params if torch.Tensor in (p.annotation, *typing.get_args(p.annotation))]
        op_fn = _wrapper(fn, sig, traced, lambda e, args, kwargs: _argument_error(sig, hints, args, kwargs),
                         tensors, (*mutates_args, *outs))
        _ops[name] = Op(name, op_fn, specializations)
        return op_fn

    return decorate


def _outputs(name: str, params: list[inspect.Parameter], returns: object) -> list[str]:
    """The output parameters of an op: ``out``, and the keyword-only ``out_<name>=None`` after it.
    With one, the op returns it; with several, the tuple of them in order."""
    names = [p.name for p in params]
    if "out" not in names:
        return []
    first = names.index("out")
    if params[first].kind is not inspect.Parameter.KEYWORD_ONLY or params[first].default is not None:
        raise TypeError(f"register_op: {name}'s out must be keyword-only and default to None")
    outs = ["out", *(p.name for p in params[first + 1:] if p.name.startswith("out_")
                     and p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None)]
    pair = typing.get_origin(returns) is tuple
    if (len(outs) > 1) != pair or (pair and len(typing.get_args(returns)) != len(outs)):
        raise TypeError(f"register_op: {name} returns {returns}; with out=, an op returns out, or the tuple of its "
                        f"outputs ({', '.join(outs)}) when it takes out_<name> ones too")
    return outs


_DEVICES = ("cuda", "cpu")
_ERRORS = (AttributeError, BufferError, IndexError, TypeError, RuntimeError, ValueError)


def _wrapper(fn: Callable, sig: inspect.Signature, traced: Callable, name_error: Callable, tensors: list[str],
             written: tuple[str, ...]) -> Callable:
    """The public function: ``traced`` while torch.compile or torch.export traces, else ``fn``,
    with a failure's error replaced by ``name_error(e, args, kwargs)`` when that names the
    argument.

    Around ``fn`` it does what torch does for an in-place op, which no launcher can (DLPack
    carries no autograd state): before, refuse a tensor with the negative bit and, among the
    ``written`` ones, a tensor autograd records or an inference tensor outside inference mode
    (``_refuse``); after, bump the version counters of the ``written`` tensors, so that
    autograd refuses a saved tensor the op overwrote. An input that requires grad under grad
    mode is warned about once (``_refuse``). The bump goes through
    ``torch._C._increment_version`` itself (what these cost a call:
    benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md).

    It is compiled with ``fn``'s own parameter list (as dataclasses compile their ``__init__``):
    a generic ``(*args, **kwargs)`` wrapper would pack a tuple and a dict on every call."""
    params: list[str] = []
    pos: list[str] = []
    kw: list[str] = []
    scope: dict[str, typing.Any] = {}  # the namespace exec fills
    for p in sig.parameters.values():
        if p.kind is p.KEYWORD_ONLY and "*" not in params:
            params.append("*")
        if p.default is not p.empty:
            scope[f"_d_{p.name}"] = p.default
        params.append(p.name + (f"=_d_{p.name}" if p.default is not p.empty else ""))
        (kw if p.kind is p.KEYWORD_ONLY else pos).append(p.name)
    call = ", ".join(pos + [f"{n}={n}" for n in kw])
    kwargs = "{" + ", ".join(f"{n!r}: {n}" for n in kw) + "}"
    optional = {p.name for p in sig.parameters.values() if p.default is None}

    def test(name: str, t: str) -> str:
        return f"({name} is not None and ({t}))" if name in optional else t

    read = [n for n in tensors if n not in written]
    # True exactly where ``refuse`` raises or warns, so that a call under inference mode (whose
    # tensors are inference tensors) or no_grad stays on this path. Under inference mode grad
    # mode is off and inference tensors may be written, so only the negative bit refuses: the
    # serving path reads one flag a tensor (``negs``); outside it, ``tests``.
    negs = " or ".join(test(n, f"{n}.is_neg()") for n in tensors) or "False"
    checks = [test(n, f"({n}.requires_grad and grad_enabled()) or {n}.is_inference() or {n}.is_neg()"
                   if n in written else f"{n}.is_neg()") for n in tensors]
    if read:  # an input that requires grad: only under grad mode (a Parameter under no_grad passes)
        checks.append(f"(({' or '.join(test(n, f'{n}.requires_grad') for n in read)}) and grad_enabled())")
    tests = " or ".join(checks) or "False"
    bumps = "".join(f"    if {n} is not None:\n        bump(({n},))\n" for n in written if n in optional)
    required = [n for n in written if n not in optional]
    if required:
        bumps += f"    bump(({''.join(n + ', ' for n in required)}))\n"
    exec(f"def {fn.__name__}({', '.join(params)}):\n"
         f"    if is_compiling():\n        return traced({call})\n"
         f"    try:\n"
         f"        if ({negs}) if inference_mode() else ({tests}):\n"
         f"            refuse({{{', '.join(f'{n!r}: {n}' for n in tensors)}}})\n"
         f"        result = fn({call})\n"
         f"    except ERRORS as e:\n        named = name_error(e, ({''.join(n + ', ' for n in pos)}), {kwargs})\n"
         f"        if named is None:\n            raise\n        raise named from e\n"
         f"{bumps}    return result\n",
         dict(scope, is_compiling=torch.compiler.is_compiling, traced=traced, fn=fn, ERRORS=_ERRORS,
              name_error=name_error, grad_enabled=torch.is_grad_enabled,
              inference_mode=torch.is_inference_mode_enabled,
              refuse=functools.partial(_refuse, op=fn.__name__, written=written, warned=set()),
              # what torch.autograd.graph.increment_version calls, without its Python frame
              bump=torch._C._increment_version), scope)
    return functools.wraps(fn)(scope[fn.__name__])


def _refuse(tensors: dict[str, torch.Tensor | None], op: str, written: tuple[str, ...], warned: set) -> None:
    """Raise for the first tensor torch would not let an in-place op take; return when every one
    passes (a tensor that requires grad may be written under ``torch.no_grad()``). An input that
    requires grad under grad mode is warned about, once per op and argument: the result will not
    require grad (a weight that is a Parameter, say, outside ``torch.no_grad()``)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            continue  # the launcher names it
        if t.is_neg():
            raise ValueError(f"'{name}': has torch's negative bit set (a lazy negation, e.g. from z.conj().imag), "
                             f"which the kernel would not see: pass {name}.resolve_neg()")
        if name not in written:
            if t.requires_grad and torch.is_grad_enabled() and name not in warned:
                warned.add(name)
                warnings.warn(f"kernkit.ops.{op}: '{name}' requires grad, but kernkit ops are not differentiable: "
                              f"the result does not require grad and no gradient reaches '{name}' (call the op "
                              f"under torch.no_grad() or torch.inference_mode() to silence this)", stacklevel=3)
            continue
        if t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(f"'{name}': requires grad, and kernkit ops are not differentiable: write into it "
                               f"under torch.no_grad(), or into a tensor that does not require grad")
        if t.is_inference() and not torch.is_inference_mode_enabled():
            raise RuntimeError(f"'{name}': is an inference tensor, which torch does not let an in-place op "
                               f"write outside torch.inference_mode(); write into a clone of it")


def _argument_error(sig: inspect.Signature, hints: dict, args: tuple, kwargs: dict) -> Exception | None:
    """After a failed call: an error naming the first argument that does not match its
    annotation (a tensor on a device kernkit supports, a float, an int, a sequence of ints), or
    None."""
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None  # Python's own message already names what is missing or extra
    for name, value in bound.arguments.items():
        hint = hints.get(name)
        if value is None and type(None) in typing.get_args(hint):
            continue
        kinds = [hint, *typing.get_args(hint)]
        if torch.Tensor in kinds:
            if not isinstance(value, torch.Tensor):
                return TypeError(f"'{name}': expected a tensor, got {type(value).__name__}")
            if value.device.type not in _DEVICES:
                return ValueError(f"'{name}': expected a cuda or cpu tensor, got a {value.device.type} tensor")
        elif float in kinds and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return TypeError(f"'{name}': expected a float, got {type(value).__name__}")
        elif int in kinds and not _is_int64(value):
            return TypeError(f"'{name}': expected an int64, got {value!r}")
        elif any(typing.get_args(k) == (int,) for k in kinds) and not (
                isinstance(value, (list, tuple)) and all(_is_int64(v) for v in value)):
            return TypeError(f"'{name}': expected a sequence of int64 values, got {value!r}")
    return None


def _is_int64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63


def _find_op(name: str) -> Op:
    """The registered op ``name`` names, read as ``warmup`` reads names: ``"namespace::name"``,
    or a bare name: kernkit's op of that name, else the one op of that name in another namespace
    (``add_residual_scale`` for ``my_project::add_residual_scale``); a ``ValueError`` listing the
    candidates when none or several match."""
    if name in _ops:
        return _ops[name]
    matches = [op for op in _ops.values() if op.name == name]
    kernkit_op = [op for op in matches if op.qualname.startswith("kernkit::")]
    if len(kernkit_op or matches) == 1:
        return (kernkit_op or matches)[0]
    if matches:
        raise ValueError(f"{name!r} names several ops: {', '.join(op.qualname for op in matches)}; give one of them")
    raise ValueError(f"{name!r} is not a registered op; registered: {', '.join(_ops)}")


def available(op: str, device: str | torch.device | None = None, **model_shape: object) -> bool:
    """Whether every specialization ``op`` needs for ``model_shape`` loads here, for tensors on
    ``device``, building what is missing (never inside a CUDA-graph capture). A caller that has
    a fallback of its own asks this once instead of catching errors per call; why not is logged
    at WARNING.

    Parameters
    ----------
    op
        ``"store_cache"``, ``"namespace::name"``, or the bare name of an op in another namespace
        (as ``warmup`` reads op names).
    device
        Where the caller's tensors are: ``"cuda"`` (a GPU build), ``"cpu"`` (kernkit's CPU
        emulator, the same as ``backend="emu"``), a ``torch.device``, or None: ``"cuda"`` when
        torch sees a GPU, else ``"cpu"``.
    model_shape
        The keyword arguments of the op's ``specializations`` (e.g. ``dtypes``, ``num_heads``;
        ``backend`` picks the GPU build's compiler).

    Example
    -------
    >>> if not available("store_cache", dtypes=[torch.bfloat16], num_heads=8, head_dim=128):
    ...     store = my_torch_store  # doctest: +SKIP
    >>> available("scale", "cpu", dtypes=[torch.bfloat16])  # doctest: +SKIP
    True
    """
    entry = _find_op(op)
    if entry.specializations is None:
        raise ValueError(f"available: {entry.qualname} has no specializations to build")
    backend = model_shape.get("backend")
    if device is None:
        device = "cpu" if backend == "emu" or (backend is None and not torch.cuda.is_available()) else "cuda"
    kind = torch.device(device).type
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"'device': expected cuda or cpu, got {device!r}")
    if backend is not None and (backend == "emu") != (kind == "cpu"):
        raise ValueError(f"'backend': {backend!r} does not build for {kind} tensors (CPU tensors run on 'emu')")
    if kind == "cpu":
        model_shape["backend"] = "emu"
    try:
        for spec in entry.specializations(**model_shape):
            spec.build_and_load()
    except (ArchError, CacheDirError, CompileError, JitDisabledError, ToolchainError) as e:
        logger.warning("kernkit: %s is not available here: %s", op, e)
        return False
    return True
