"""The quantization runtime: what loading and serving a quantized checkpoint needs.

format.py (QuantFormat: a checkpoint's ``quantization_config`` both ways, and the linear factory), linear.py
(GPTQLinear, AWQLinear, W8A8Linear), packing.py (GPTQ v1/v2, AWQ GEMM and W8A8 tensor layouts), qweight.py
(QuantizedWeight), kernels.py (kernel choice and the CPU int4/int8 paths), native.py (the native int4 linear),
shard_kernels.py (merged GPTQ shards whose act-order g_idx differ: one kernel per run of agreeing shards).
It imports only cinq.kernels, cinq.errors and cinq.layers.weight_loader; the offline tool that *makes* quantized checkpoints
is cinq.quant, which imports this package, never the reverse.
"""
