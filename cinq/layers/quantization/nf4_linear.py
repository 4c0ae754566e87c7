"""``NF4Linear``: a linear stored as bitsandbytes NF4 (nf4.py), served without requantizing.

After loading, each shard's packed bytes and quant state are decoded (double quantization undone: absmax in
float32, 4 bytes per block of 64 values) and merged along the output channels; then the kernel is chosen:

* ``nf4_native`` (bf16 on the CPU, the block size dividing K): cinq/kernels/cpu/float_code_linear.cpp, the 16
  levels looked up in registers, weights kept at 4 bits; past ``NATIVE_MAX_ROWS`` rows (a prefill chunk) the weight
  is dequantized per call and run through oneDNN's matmul.
* ``nf4_triton`` (CUDA): cinq/kernels/triton/nf4_gemm.py.
* ``dequantized_at_load`` elsewhere (float32 parity runs, blocks spanning rows, no native build): the exact values
  once, dense; said once in the log.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cinq.errors import ModelLoadError
from cinq.layers.linear_split import LinearSplit
from cinq.layers.quantization import kernels
from cinq.layers.quantization.collected_linear import CollectedLinear
from cinq.layers.quantization.nf4 import NF4Weight, STATE_KEY, decode_nf4
from cinq.layers.weight_loader import OutputShards

# buffer name -> checkpoint suffix after "weight" (see nf4.SUFFIXES)
_BUFFERS = {"weight": "", "weight__absmax": ".absmax", "weight__quant_map": ".quant_map",
            "weight__nested_absmax": ".nested_absmax", "weight__nested_quant_map": ".nested_quant_map",
            "weight__quant_state": "." + STATE_KEY}


def nf4_dense(t: dict[str, torch.Tensor], n: int, k: int, blocksize: int) -> torch.Tensor:
    """W [N, K] float32 of the kernel's tensors (codes [N, K / 2], absmax, levels)."""
    return NF4Weight(t["codes"], t["absmax"], t["levels"], blocksize, (n, k)).dequantize(torch.float32)


class NF4Linear(CollectedLinear):
    """A linear stored as bitsandbytes NF4 (``double_quant``: the file's absmax are 8-bit, with nested tensors)."""

    checkpoint_params = {name: "weight" + suffix for name, suffix in _BUFFERS.items()}
    format_name = "NF4"

    def __init__(self, in_features: int, out_features: int, bias: bool, double_quant: bool = False,
                 prefix: str = "", *, compute_dtype: torch.dtype, output_shards: OutputShards | None = None,
                 split: LinearSplit | None = None) -> None:
        names = tuple(n for n in _BUFFERS if double_quant or "nested" not in n)
        super().__init__(in_features, out_features, bias, prefix, compute_dtype, output_shards, split, names)
        self.double_quant = double_quant
        self.blocksize = 0

    def nf4_weights(self) -> list[NF4Weight]:
        """Each shard's decoded NF4 weight, in output order (before ``process_weights_after_loading``)."""
        out = []
        for where, size, t in self.shard_parts():
            w = decode_nf4({_BUFFERS[name]: v for name, v in t.items()}, where)
            if w.shape != (size, self.in_features):
                raise ModelLoadError(f"{where}: the quant state's shape {list(w.shape)} is not the model's "
                                     f"[{size}, {self.in_features}]")
            out.append(w)
        return out

    def process_weights_after_loading(self) -> None:
        parts = self.nf4_weights()
        k, n = self.in_features, self.out_features
        sizes = {p.blocksize for p in parts}
        bs = parts[0].blocksize
        levels = parts[0].levels
        same = len(sizes) == 1 and k % bs == 0 and all(torch.equal(p.levels, levels) for p in parts)
        device, dtype = self.weight.device, self.compute_dtype
        if same:
            t = {"codes": torch.cat([p.packed for p in parts]).to(device),
                 "absmax": torch.cat([p.absmax for p in parts]).to(device), "levels": levels.to(device)}
            if kernels._FORCE_DEQUANTIZED_AT_LOAD:
                pass
            elif device.type == "cpu" and dtype == torch.bfloat16 and bs % 64 == 0:
                from cinq.layers.quantization.native_float import float_kernels_available
                if float_kernels_available():
                    self.blocksize = bs
                    self._finish(t, "nf4_native", bs)
                    return
            elif device.type == "cuda":
                try:
                    import cinq.kernels.triton.nf4_gemm  # noqa: F401
                    self.blocksize = bs
                    self._finish(t, "nf4_triton", bs)
                    return
                except ImportError as e:
                    kernels.say_once(f"NF4: Triton unavailable ({e}); dequantized at load on CUDA")
        if not kernels._FORCE_DEQUANTIZED_AT_LOAD:
            kernels.say_once(f"NF4 weights: no NF4 kernel for {dtype} on {device.type} (block size {bs}, "
                             f"K {k}); dequantized once at load (same values, dense speed and memory)")
        w = torch.cat([p.dequantize(torch.float32) for p in parts]).to(device=device, dtype=dtype)
        self._finish({"weight": w}, kernels.DEQUANTIZED_AT_LOAD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self._kernel_tensors()
        if self.kind == kernels.DEQUANTIZED_AT_LOAD:
            return self._add_bias(kernels.weight_only_mm(self.kind, t, 0, x))
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        if self.kind == "nf4_triton":
            from cinq.kernels.triton.nf4_gemm import nf4_gemm
            y = nf4_gemm(x2, t["codes"], t["absmax"], t["levels"], self.blocksize)
        elif x2.shape[0] <= kernels.NATIVE_MAX_ROWS:
            from cinq.layers.quantization.native_float import nf4_linear
            y = nf4_linear(x2, t["codes"], t["absmax"], t["levels"], self.blocksize)
        else:
            w = nf4_dense(t, self.out_features, k, self.blocksize)
            y = F.linear(x2.to(torch.bfloat16), w.to(torch.bfloat16))
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return self._add_bias(y.reshape(*lead, -1))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, nf4 block={self.blocksize or '-'}, double_quant={self.double_quant}"
