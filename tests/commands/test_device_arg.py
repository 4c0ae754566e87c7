"""``--device`` is checked before any engine process starts: a device torch cannot parse, one the engine does not
run on, or a CUDA device this machine lacks is one line naming the flag (exit 2), no traceback."""

from __future__ import annotations

import pytest
import torch

from cinq.commands.device_arg import check_device
from cinq.errors import InvalidParameterError


@pytest.mark.parametrize("device,said", [
    ("nonsense", "--device nonsense: not a device torch knows"),
    ("cuda:x", "--device cuda:x: not a device torch knows"),
    ("meta", "--device meta: cinq's engine runs on cpu or cuda[:N], not meta"),
    ("mps", "--device mps: cinq's engine runs on cpu or cuda[:N], not mps"),
])
def test_a_device_the_engine_cannot_run_on_names_the_flag(device, said):
    with pytest.raises(InvalidParameterError, match="^" + said.replace("[", r"\[").replace("]", r"\]")) as e:
        check_device(device)
    assert e.value.param == "device"


def test_cpu_passes():
    check_device("cpu")
    check_device("cpu:0")


def test_cuda_without_cuda_says_why(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    with pytest.raises(InvalidParameterError, match=r"^--device cuda: this torch build has no CUDA device"):
        check_device("cuda")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InvalidParameterError, match=r"^--device cuda:0: torch sees no CUDA device"):
        check_device("cuda:0")
    check_device("cuda", local=False)  # replicas on a remote Ray cluster: their machines have the device


def test_a_cuda_index_past_the_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda:1")
    check_device("cuda")
    with pytest.raises(InvalidParameterError, match=r"^--device cuda:2: this machine has 2 CUDA device\(s\), "
                                                    r"cuda:0 to cuda:1"):
        check_device("cuda:2")


@pytest.mark.parametrize("command", [["generate", "-p", "hi"], ["serve", "--port", "0"], ["chat"]])
@pytest.mark.parametrize("device", ["nonsense", "meta"] + ([] if torch.cuda.is_available() else ["cuda"]))
def test_the_commands_refuse_a_bad_device_before_an_engine_starts(command, device, run_cli, monkeypatch):
    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started")
    monkeypatch.setattr("cinq.engine.protocol.make_llm_engine", no_engine)
    monkeypatch.setattr("cinq.engine.protocol.make_engine_client", no_engine)
    r = run_cli(command[0], "cinq-tiny", *command[1:], "--device", device)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith(f"cinq {command[0]}: error: "
                                                                               f"--device {device}: ")
