"""kernkit's developer tools, ``python -m kernkit.jit``: one module per subcommand, whose
docstring is that subcommand's ``-h`` text.

``clangd`` (editor setup), ``cache`` (list or clear the built specializations), ``warmup``
(ahead-of-time builds of the registered ops) and ``doctor`` (what the JIT layer sees); ``cli``
parses the command line. The tools sit above ``kernkit.jit`` and ``kernkit.ops`` and use only
their public functions; nothing below imports them.
"""
