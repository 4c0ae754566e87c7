import json

from cinq.train.sizing import sizing_table


def test_sizing_table_measures_each_shape_in_both_precisions(tmp_path):
    shape = tmp_path / "tiny-shape.json"
    shape.write_text(json.dumps({"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "num_key_value_heads": 1}))
    rows = sizing_table(["micro", str(shape)], 256, 2, 8, 1e6, tmp_path / "sizing")
    assert [r["config"] for r in rows] == ["micro", "tiny-shape"]
    assert rows[0]["parameters"] > rows[1]["parameters"]
    for r in rows:
        assert r["bf16_tokens_per_s"] > 0 and r["fp32_tokens_per_s"] > 0
        assert r["minutes_for_budget"] == 1e6 / r["bf16_tokens_per_s"] / 60
    assert "| tiny-shape |" in (tmp_path / "sizing.md").read_text()
    assert json.loads((tmp_path / "sizing.json").read_text()) == rows
