"""`cinq plan` from the command line: tables, JSON, calibration and one-line errors naming the flag."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def cinq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cinq.cli", "plan", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_70b_on_h100_table():
    r = cinq("Llama-3-70B", "--max-model-len", "8192")
    assert r.returncode == 0, r.stderr
    assert "on 2 x H100-80GB" in r.stdout and "minimum tensor_parallel_size  2" in r.stdout
    assert "whole model 141.11 GB" in r.stdout and "whole model 320.00 KiB" in r.stdout


def test_json_with_flags_and_a_custom_device():
    r = cinq("Llama-3-8B", "--memory-gib", "24", "--bandwidth-gbs", "1000", "--tflops", "150",
             "--price-per-hour", "0.5", "--dtype", "int4", "--max-model-len", "4096", "--concurrency", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["device"]["name"] == "custom" and out["device"]["price_per_hour"] == 0.5
    assert out["precision"]["name"] == "int4" and out["memory"]["fits"]
    assert out["memory"]["kv_per_token"] == 128 * 1024 and out["at_concurrency"]["batch"] == 8
    assert out["config"]["num_key_value_heads"] == 8  # the shape planned, as ModelConfig reads it


def test_quantized_folder_takes_its_precision(tmp_path):
    cfg = json.loads((REPO / "cinq" / "assets" / "cinq-tiny" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = cinq(str(tmp_path / "config.json"), "--device", "EPYC-2vCPU", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["precision"]["name"], out["precision"]["group_size"]) == ("int4", 64)
    assert out["settings"]["max_model_len"] == cfg["max_position_embeddings"]


def test_calibrate_against_the_measured_rows():
    r = cinq("--calibrate", "--device", "EPYC-2vCPU", "--markdown")
    assert r.returncode == 0, r.stderr
    assert "| benchmark row |" in r.stdout and "quant.json int4 batch1" in r.stdout
    r = cinq("cinq-tiny", "--device", "EPYC-2vCPU", "--calibrate", "--json")
    out = json.loads(r.stdout)  # one object: the plan and its calibration
    assert out["model"] == "cinq-tiny" and len(out["calibration"]["rows"]) >= 10
    calibrated = out["calibration"]["plan_tokens_per_s"]  # this plan through the fitted step-time model
    assert set(calibrated) == {"1", str(out["at_concurrency"]["batch"])}
    assert 0 < calibrated["1"] < out["batch1"]["tokens_per_s"]


@pytest.mark.parametrize("args, flag", [
    (["Llama-3-8B", "--max-model-len", "0"], "--max-model-len"),
    (["Llama-3-8B", "--concurrency", "-1"], "--concurrency"),
    (["Llama-3-8B", "--max-model-len", "1024", "--context-len", "2048"], "--context-len"),
    (["Llama-3-8B", "--device", "Z100"], "--device"),
    (["Llama-3-8B", "--tensor-parallel-size", "3"], "--tensor-parallel-size"),
    (["cinq-tiny", "--device", "EPYC-2vCPU", "-tp", "2"], "--tensor-parallel-size"),
    (["Llama-3-8B", "--memory-gib", "10"], "--bandwidth-gbs"),
    (["Llama-3-8B", "--gpu-memory-utilization", "2"], "--gpu-memory-utilization"),
    (["Llama-3-8B", "--dtype", "int4", "--group-size", "0"], "--group-size"),
    (["Llama-3-8B", "--price-per-hour", "-3"], "--price-per-hour"),
    (["Llama-9-1T"], "MODEL"),
    ([], "MODEL"),
    (["Llama-3-8B", "--measure"], "--measure"),
    (["--calibrate", "--results-dir", "no/such/dir"], "--results-dir"),
    (["Llama-3-8B", "--dtype", "int3"], "--dtype"),
])
def test_bad_input_is_one_line_naming_the_flag(args, flag, run_cli):
    r = run_cli("plan", *args)
    assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2  # argparse's own: usage + message


def test_json_to_a_reader_that_stops_early_ends_quietly():
    """`cinq plan MODEL --json | head -3`: no traceback, status 141 (128 + SIGPIPE)."""
    p = subprocess.Popen([sys.executable, "-m", "cinq.cli", "plan", "Llama-3-8B", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=REPO)
    p.stdout.close()  # the reader is gone before the plan is written
    _, err = p.communicate(timeout=300)
    assert p.returncode == 141 and err == b"", err.decode()
