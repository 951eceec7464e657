"""kernkit's developer tools, ``python -m kernkit.jit``: one module per subcommand, whose
docstring is that subcommand's ``-h`` text.

``clangd`` (editor setup), ``cache`` (list or clear the built specializations), ``warmup``
(ahead-of-time builds of the registered ops) and ``doctor`` (what the JIT layer sees); ``cli``
parses the command line, ``replay`` turns a manifest into specs for ``warmup`` and ``cache``,
and ``output`` writes a file a command line names (``cache export FILE``, ``clangd -o FILE``).
The tools sit above ``kernkit.jit`` and ``kernkit.ops`` and use only their public functions
(the names in their ``__all__``); nothing below imports them.
"""
