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
compiler's message about a half names the line of the source. This is a scan of braces and
declarations, not a C++ parser: a construct it misreads comes out as a compile error of one
half, which names the file.
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
#: What a scope's scan stops at: a declaration's end, a brace, and in a class an access label's colon.
_STOP = re.compile(r"[;{]")
_CLASS_STOP = re.compile(r"[;{:]")
_BRACE = re.compile(r"[{}]")
#: What ``_blank`` blanks: a preprocessor line (with its continuations), a comment, a string or
#: character literal (a quote after a letter or digit is a digit separator, as in 1'000). An
#: unterminated one runs to the end of the text.
_BLANKED = re.compile(r"""^[^\S\n]*\#(?:\\\n|[^\n])*
                          |//[^\n]*
                          |/\*.*?(?:\*/|\Z)
                          |"(?:\\.?|[^"\\])*"?
                          |(?<![^\W_])'(?:\\.?|[^'\\])*'?""", re.M | re.S | re.X)


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
        self.closes: dict[int, int] = {}  # each "{" that is closed: the index after its "}"
        opened: list[int] = []
        for brace in _BRACE.finditer(self.code):
            if brace.group() == "{":
                opened.append(brace.start())
            elif opened:  # a "}" that closes nothing is not code the scan reads
                self.closes[opened.pop()] = brace.end()

    def match(self, i: int) -> int:
        """The index after the brace that closes the one at ``i``."""
        if i not in self.closes:
            raise ValueError("unbalanced braces")
        return self.closes[i]

    def scope(self, begin: int, end: int, in_class: bool) -> tuple[str, str, set[str]]:
        """The device and host halves of the declarations in ``[begin, end)``, and the execution
        spaces of the functions defined there."""
        device, host, kinds = [], [], set()
        i = start = begin
        code, text = self.code, self.text
        stops = _CLASS_STOP if in_class else _STOP
        while True:
            found = stops.search(code, i, end)
            if found is None:
                break
            i, c = found.start(), found.group()
            if c == ";" or (c == ":" and _ACCESS.fullmatch(code[start:i])):
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
    return _BLANKED.sub(lambda m: "\n".join(" " * len(line) for line in m.group().split("\n")), text)
