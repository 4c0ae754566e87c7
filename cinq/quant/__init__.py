"""Quantization: make quantized models on the CPU (RTN, GPTQ, AWQ, SmoothQuant; one decoder block at a time)
and read/write them as GPTQ v1/v2, AWQ GEMM or cinq W8A8 folders. Serving them is cinq/layers/linear.py plus
the kernels of cinq/quant/kernels.py; `cinq quantize` drives cinq/quant/pipeline.py."""
