"""kernkit's ops inside other libraries' models: ``transformers`` (Llama, Qwen2 and Qwen3 decoding
on kernkit's kernels). Each integration needs its own extra (``pip install 'kernkit[transformers]'``)
and is imported by name; this package imports nothing."""
