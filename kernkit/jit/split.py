"""The device and host halves of a CUDA source, for compilers that see only one: NVRTC takes no
host code, and the host compiler no device code.

nvcc splits a ``.cu`` file with its own front end (cudafe++). Without it, kernkit splits by
declaration, which its sources make easy: a function's execution space is written in its
declaration (``__global__``, ``__device__``, ``KERNKIT_DEVICE``, ``__host__ __device__``).

* The device half drops host functions (with their ``template <...>`` heads), ``namespace
  host`` blocks and classes whose member functions are all host functions; ``constexpr``
  functions stay in both halves (as nvcc's ``--expt-relaxed-constexpr`` lets device code call them).
* The host half turns every ``__global__`` definition into a declaration (the host object then
  names every kernel instantiation a launcher takes the address of, as an undefined symbol) and
  drops device-only functions.

Preprocessor lines, comments and everything that is not a function definition are kept as they
are in both halves, and what a half drops leaves its newlines: every line keeps its number, so a
compiler's message about a half names the line of the source. This is a scan of braces and declarations, not a C++ parser: a construct it
misreads comes out as a compile error of one half, which names the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Words in a declaration that mark a function as device code (``KERNKIT_DEVICE`` is
#: ``__forceinline__ __device__``).
_DEVICE = re.compile(r"\b(__device__|KERNKIT_DEVICE)\b")
_GLOBAL = re.compile(r"\b__global__\b")
_HOST = re.compile(r"\b__host__\b")
_CONSTEXPR = re.compile(r"\b(constexpr|consteval)\b")
_CLASS = re.compile(r"\b(class|struct|union|enum)\b")
_NAMESPACE = re.compile(r"^\s*(inline\s+)?namespace\b\s*([A-Za-z_]\w*)?\s*$|^\s*extern\s+\"C(\+\+)?\"\s*$")
_ACCESS = re.compile(r"\s*(public|private|protected)\s*")
#: The end of a function's declarator: ``)`` then qualifiers, a trailing return type, attributes.
_DECLARATOR_END = re.compile(r"\)\s*(const\b|volatile\b|noexcept\b(\s*\([^)]*\))?|override\b|final\b|&&?|"
                             r"->[^;{}]*|__attribute__\s*\(\(.*\)\))*\s*$", re.S)
_LAMBDA = re.compile(r"=\s*\[")


@dataclass
class Halves:
    """The two halves of one source and the names of the kernels it defines."""

    device: str
    host: str
    kernels: list[str]


def split(text: str) -> Halves:
    """Split one source file (see the module docstring)."""
    scanner = _Scanner(text)
    device, host, _ = scanner.scope(0, len(text), in_class=False)
    return Halves(device, host, scanner.kernels)


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.code = _blank(text)  # comments, strings and preprocessor lines as spaces: braces are real
        self.kernels: list[str] = []

    def match(self, i: int) -> int:
        """The index after the brace that closes the one at ``i``."""
        depth = 0
        for j in range(i, len(self.code)):
            c = self.code[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return j + 1
        raise ValueError("unbalanced braces")

    def scope(self, begin: int, end: int, in_class: bool) -> tuple[str, str, set[str]]:
        """The device and host halves of the declarations in ``[begin, end)``, and the execution
        spaces of the functions defined there."""
        device, host, kinds = [], [], set()
        i = start = begin
        code, text = self.code, self.text
        while i < end:
            c = code[i]
            if c == ";" or (c == ":" and in_class and _ACCESS.fullmatch(code[start:i])):
                device.append(text[start:i + 1])
                host.append(text[start:i + 1])
                i = start = i + 1
                continue
            if c != "{":
                i += 1
                continue
            head, close = code[start:i], self.match(i)
            namespace = _NAMESPACE.match(head)
            if namespace:
                d, h, _ = self.scope(i + 1, close - 1, in_class=False)
                device.append(text[start:i + 1] + d + "}" if namespace.group(2) != "host" else _gap(text[start:close]))
                host.append(text[start:i + 1] + h + "}")
                i = start = close
            elif _DECLARATOR_END.search(head) and not _LAMBDA.search(head):
                kind = _kind(head)
                kinds.add(kind)
                whole = text[start:close]
                if kind == "global":
                    self.kernels.append(_function_name(head))
                    declaration = text[start:i].rstrip()
                    host.append(declaration + ";" + _gap(whole[len(declaration):]))
                device.append(whole if kind != "host" else _gap(whole))
                if kind != "global":
                    host.append(whole if kind in ("host", "both") else _gap(whole))
                i = start = close
            elif _CLASS.search(head):
                semi = code.index(";", close)
                d, h, members = self.scope(i + 1, close - 1, in_class=True)
                tail = text[close - 1:semi + 1]
                if not members or members - {"host"}:  # a class of host functions only is host code
                    device.append(text[start:i + 1] + d + tail)
                else:
                    device.append(_gap(text[start:semi + 1]))
                host.append(text[start:i + 1] + h + tail)
                i = start = semi + 1
            else:  # a braced initializer or a lambda: part of a declaration that ends with ";"
                i = close
        device.append(text[start:end])
        host.append(text[start:end])
        return "".join(device), "".join(host), kinds


def _gap(dropped: str) -> str:
    """What stands for dropped text: its newlines."""
    return "\n" * dropped.count("\n")


def _function_name(head: str) -> str:
    """The name in a function's declaration: the identifier before its parameter list (the
    parenthesis that the declarator's last ``)`` closes)."""
    depth, i = 0, head.rindex(")")
    while i >= 0:
        depth += {")": 1, "(": -1}.get(head[i], 0)
        if depth == 0:
            break
        i -= 1
    name = re.search(r"([A-Za-z_]\w*)\s*$", head[:i])
    return name.group(1) if name else ""


def _kind(head: str) -> str:
    if _GLOBAL.search(head):
        return "global"
    if _DEVICE.search(head):
        return "both" if _HOST.search(head) else "device"
    # constexpr functions serve both sides (nvcc's and NVRTC's --expt-relaxed-constexpr)
    return "both" if _CONSTEXPR.search(head) else "host"


def _blank(text: str) -> str:
    """``text`` with comments, string and character literals and preprocessor lines replaced by
    spaces (newlines kept), so that every brace and semicolon left is code."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):  # 1'000 digit separators
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)
