"""Calibration windows, block-by-block reading, input capture."""

from __future__ import annotations

import pytest
import torch

from cinq.errors import InvalidParameterError
from cinq.model.loader import load_model
from cinq.quant.calibration import (BLOCK_LINEARS, BlockState, CheckpointReader, StopForward, calibration_tokens,
                                    calibration_windows, capture_inputs, run_block)


def test_windows_are_disjoint_seeded_and_bounded():
    ids = list(range(1000))
    w = calibration_windows(ids, 5, 100, seed=0)
    assert w.shape == (5, 100)
    starts = sorted(int(r[0]) for r in w)
    assert all(b - a >= 100 for a, b in zip(starts, starts[1:]))
    assert torch.equal(w, calibration_windows(ids, 5, 100, seed=0))
    assert not torch.equal(w, calibration_windows(ids, 5, 100, seed=1))
    assert calibration_windows(ids, 50, 100).shape == (50, 100)  # short text: overlapping windows fill up
    with pytest.raises(InvalidParameterError, match="fewer than one window"):
        calibration_windows(list(range(10)), 2, 100)


def test_calibration_file_is_required(tmp_path):
    with pytest.raises(InvalidParameterError, match="--calib FILE is required") as e:
        calibration_tokens(None, None, 4, 16)
    assert e.value.param == "calib"
    with pytest.raises(InvalidParameterError, match="not a readable file"):
        calibration_tokens(tmp_path / "missing.txt", None, 4, 16)


def test_blockwise_run_matches_the_whole_model(trained_tiny, calib_tokens):
    reader = CheckpointReader(trained_tiny)
    state = BlockState.from_tokens(reader, calib_tokens[:3])
    for i in range(reader.config.num_hidden_layers):
        state = run_block(reader.block(i), state, batch=2)
    model = load_model(trained_tiny, dtype="float32")
    final_w = reader.tensor("model.norm.weight")
    with torch.no_grad():
        normed = torch.nn.functional.rms_norm(state.hidden + state.residual, (final_w.numel(),),
                                              eps=reader.config.rms_norm_eps) * final_w
        ref = model(calib_tokens[:3])
    assert torch.allclose(normed, ref, atol=1e-4)


def test_capture_sees_shared_inputs_and_stops_early(trained_tiny, calib_tokens):
    reader = CheckpointReader(trained_tiny)
    state = BlockState.from_tokens(reader, calib_tokens[:4])
    block = reader.block(0)
    seen: list[tuple[str, tuple[int, ...]]] = []
    with capture_inputs(block, [names[0] for names in BLOCK_LINEARS], lambda n, x: seen.append((n, tuple(x.shape)))):
        run_block(block, state, batch=2)
    assert [n for n, _ in seen[:4]] == [names[0] for names in BLOCK_LINEARS]
    assert len(seen) == 8 and seen[3][1] == (2, 64, 128)  # down_proj reads the intermediate size
    stopped: list[str] = []
    with capture_inputs(block, ["self_attn.q_proj"], lambda n, x: stopped.append(n), stop_after="self_attn.q_proj"):
        assert run_block(block, state, batch=2, keep_output=False) is None
        with pytest.raises(StopForward):
            run_block(block, state, batch=2)
    assert len(stopped) == 3
