"""Why a build failed at a wrapper: its template arguments fit no function.

A wrapper such as ``("bias_add_gelu", "bias_add_gelu<128, false>")`` whose arguments do not fit
the template (``<typename T, bool>``, or too few) makes the compilers report a failed deduction
inside ``KERNKIT_EXPORT`` (``export.h``), naming neither the wrapper nor the template. ``blame``
reads the failed build's log and says both, first: the wrapper, and the declarations of the
templates of that name in the spec's files. A scan of the source text rather than a second
compile: it runs on the error path only, and a declaration is a ``template <...>`` head followed
by the name and ``(``, which comments aside needs no parser.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

#: A function set that resolved to nothing, as gcc, clang and EDG (nvcc, NVRTC) say it.
_UNRESOLVED = re.compile(r"unresolved overloaded function type|cannot resolve address of overloaded function|"
                         r"no instance of (?:function template|overloaded function)|no matches converting function|"
                         r"address of overloaded function .* does not match")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def blame(log: str, unit: Path, wrappers: Sequence[tuple[str, str]], files: Sequence[str]) -> list[str]:
    """One ``kernkit:`` line per wrapper that the failed build's ``log`` shows unresolved: a
    failed resolution, and the wrapper's ``KERNKIT_EXPORT`` line of ``unit`` (the source that
    failed) quoted (gcc, clang) or named by its number (EDG quotes the expansion). Each line
    names the wrapper, then each template of its name declared in ``files`` with its parameter
    list and place."""
    if not _UNRESOLVED.search(log):
        return []
    try:
        text = unit.read_text(errors="replace").splitlines()
    except OSError:
        text = []
    named = {text[int(a or b) - 1] for a, b in re.findall(re.escape(unit.name) + r"(?:\((\d+)\)|:(\d+):)", log)
             if 0 < int(a or b) <= len(text)}
    lines = []
    for export, symbol in wrappers:
        export_line = f"KERNKIT_EXPORT({export}, ({symbol}))"
        if export_line not in named and export_line not in log:
            continue
        name = symbol.split("<", 1)[0].strip()
        found = [d for f in files for d in declarations(f, name.rsplit("::", 1)[-1])]
        theirs = "; ".join(found) if found else f"no template named {name} is declared in the spec's files"
        lines.append(f"kernkit: the wrapper ({export!r}, {symbol!r}) names no function: the arguments fit no "
                     f"template {name}. Declared: {theirs}")
    return lines


def declarations(path: str, name: str) -> list[str]:
    """``'file:line: template <...> R name(...)'`` for each function template ``name`` that
    ``path`` declares; none when it cannot be read."""
    try:
        text = _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), Path(path).read_text(errors="replace"))
    except OSError:
        return []
    out = []
    for m in re.finditer(r"\btemplate\s*<", text):
        end = _closing(text, m.end())
        # The return type may hold brackets, and parentheses inside them (enable_if_t<sizeof(T) == 2>).
        head = re.match(r"(?:[^;{}()<]|<[^;{}]*?>)*?\b" + re.escape(name) + r"\s*\(", text[end:]) if end else None
        if head:
            line = text.count("\n", 0, m.start()) + 1
            out.append(f"{path}:{line}: " + " ".join(f"{text[m.start():end]}{head.group()}...)".split()))
    return out


def _closing(text: str, i: int) -> int | None:
    """The index just past the ``>`` that closes the ``<`` before ``i`` (brackets inside
    parentheses, such as ``(N > 0)``, do not count); None if none does."""
    depth, parens = 1, 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "(":
            parens += 1
        elif c == ")":
            parens -= 1
        elif parens == 0 and c in "<>":
            depth += 1 if c == "<" else -1
            if depth == 0:
                return j + 1
        elif c in ";{}":
            return None
    return None
