"""The offline quantization tool: make quantized models on the CPU (RTN, GPTQ, AWQ, SmoothQuant; one decoder
block at a time) and write them as GPTQ v1/v2, AWQ GEMM or cinq W8A8 folders. `cinq quantize` drives
cinq/quant/pipeline.py with a QuantConfig (the format to write, cinq.layers.quantization.format.QuantFormat, and
the recipe, recipe.QuantRecipe). Loading and serving them is cinq.layers.quantization, which never imports this
package."""
