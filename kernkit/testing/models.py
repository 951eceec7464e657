"""transformers models of real shapes with random weights: what the GPU tests of
``kernkit.integrations.transformers`` and ``benchmark/bench_model.py`` run. It needs the
``transformers`` extra; nothing is downloaded.

Example
-------
.. code-block:: python

    from kernkit.testing.models import random_model

    m = random_model("qwen3-8b")  # bfloat16, on the GPU, eval mode, no grad
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

#: Llama-3.1-8B's and Qwen3-8B's shapes (their published config.json files; Qwen3's positions
#: cut from 40960 to 8192, which changes no shape).
CONFIGS = {
    "llama3-8b": lambda: LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                     max_position_embeddings=131072, rms_norm_eps=1e-5,
                                     rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                                          low_freq_factor=1.0, high_freq_factor=4.0,
                                                          original_max_position_embeddings=8192)),
    "qwen3-8b": lambda: Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                    num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                    max_position_embeddings=8192, rms_norm_eps=1e-6,
                                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0)),
}


def random_model(name: str, seed: int = 0):
    """The model of ``CONFIGS[name]`` with random weights, bfloat16, on the GPU, for inference."""
    torch.manual_seed(seed)
    with torch.device("cuda"):
        m = AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=torch.bfloat16)
    return m.eval().requires_grad_(False)
