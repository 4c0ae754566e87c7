"""What benchmarks/decode_kernels.py measures: the kernels, SmolLM2-135M's decode linear shapes, the activation
rows per call and the thread counts (its measurement and its report read them; benchmarks/kernel_ab.py
times the same shapes)."""

from __future__ import annotations

HIDDEN, INTERMEDIATE, VOCAB, LAYERS = 576, 1536, 49152, 30  # SmolLM2-135M: 9 heads / 3 KV heads of dim 64
SHAPES = {"qkv_proj": (960, HIDDEN), "o_proj": (HIDDEN, HIDDEN), "gate_up_proj": (2 * INTERMEDIATE, HIDDEN),
          "down_proj": (HIDDEN, INTERMEDIATE), "lm_head": (VOCAB, HIDDEN)}  # name -> (N out, K in)
KERNELS = ("bf16", "int8 per-channel", "int8 g32", "int4 g32", "int4 g64", "int4 g128", "nf4 b64", "fp8 per-channel",
           # int8 activations (int8_activation_linear.cpp): GGUF's blocks with their fp16 scales, cinq's grouped ones
           "q4_0 i8", "q4_1 i8", "q8_0 i8", "int4 g32 i8", "int4 g64 i8", "int4 g128 i8", "int8 per-channel i8")
ROWS = (1, 2, 5, 8)  # 5: a speculative verify of 4 drafts (k + 1 rows per sequence)
THREADS = (1, 2)
