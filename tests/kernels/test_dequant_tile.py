"""The dequant-GEMMs' shared launch shape (the tile helpers themselves run inside tests/kernels/test_int4_gemm.py
and test_nf4_gemm.py, which compare both kernels with a dequantized reference)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cinq.kernels.triton.dequant_tile import tile_launch  # noqa: E402


@pytest.mark.parametrize("m,block_m", [(1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (200, 64)])
def test_row_tiles_follow_m_and_the_grid_covers_y(m, block_m):
    tiles = tile_launch(torch.zeros(m, 8, dtype=torch.bfloat16), 130, interpreted=False)
    assert tiles.block_m == block_m
    assert tiles.grid == (-(-m // block_m), 3)  # 130 columns over 64-wide tiles
    assert tiles.grid[0] * tiles.block_m >= m > (tiles.grid[0] - 1) * tiles.block_m


@pytest.mark.parametrize("dtype,interpreted,fp32", [(torch.bfloat16, False, False), (torch.float16, False, False),
                                                    (torch.float32, False, True), (torch.bfloat16, True, True)])
def test_the_dot_runs_in_float32_for_fp32_models_and_the_interpreter(dtype, interpreted, fp32):
    assert tile_launch(torch.zeros(2, 8, dtype=dtype), 64, interpreted).fp32_dot is fp32
