"""An EngineConfig written back as arguments: only what differs from the defaults, MODEL first, booleans as the
flag that flips them (the round trips through the parser are in tests/commands/test_engine_args.py)."""

from __future__ import annotations

from cinq.config import EngineConfig
from cinq.config_argv import config_file_dict, engine_argv, flag_fields


def test_model_is_positional_not_a_flag():
    assert "model" not in {f.name for f in flag_fields()}


def test_only_changed_fields_are_written():
    cfg = EngineConfig(model="m", max_num_seqs=3, enable_prefix_caching=False)
    assert engine_argv(cfg) == ["m", "--max-num-seqs", "3", "--no-prefix-caching"]  # EngineConfig's field order
    assert config_file_dict(cfg) == {"model": "m", "max_num_seqs": 3, "enable_prefix_caching": False}
    assert engine_argv(EngineConfig(model="m")) == ["m"] and config_file_dict(EngineConfig(model="m")) == {"model": "m"}
