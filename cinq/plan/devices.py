"""The device table: memory, memory bandwidth, dense bf16 FLOP/s, the link tensor parallelism all-reduces over,
and an hourly price, for common GPUs and CPUs; or a device made from flags.

Sources and caveats:
- memory is the total the driver reports (nvidia-smi's MiB / 1024, in GiB), bandwidth and bf16 FLOP/s are the
  vendors' datasheet peaks (dense tensor-core bf16 with fp32 accumulation; no 2:4 sparsity), the link is the
  per-direction bandwidth of NVLink (SXM parts) or PCIe 4.0 x16 (cards without NVLink). Nothing real reaches a
  peak: ``calibration.py`` measures how far cinq stays from it on this machine.
- **Prices are illustrative defaults**, a rough on-demand cloud rate per card (per machine for the CPUs) at the
  time of writing; they vary several-fold between providers and over time. Give yours with ``--price-per-hour``.
- The A10G's bf16 figure is not on an NVIDIA datasheet; 70 TFLOP/s is the commonly quoted value for AWS's part
  (the A10's datasheet gives 125).
- ``EPYC-2vCPU`` is the machine cinq's benchmarks ran on (2 vCPUs of an AMD EPYC Zen 4, AVX512-BF16, 32 MiB L3,
  23 GiB RAM): its bandwidth is the 27.2 GB/s that benchmarks/throughput.py measured (``--measure`` measures
  it again), its FLOP/s 2 cores x 64 bf16 FLOP/cycle (one 512-bit ``vdpbf16ps`` per cycle) x 2.6 GHz.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cinq.errors import InvalidParameterError


@dataclass(slots=True, frozen=True)
class Device:
    """One accelerator card (or one CPU machine): the figures the plan divides by."""

    name: str
    memory_gib: float
    bandwidth_gbs: float  # memory read bandwidth, GB/s (1e9 bytes)
    tflops: float  # dense bf16 TFLOP/s
    price_per_hour: float  # $ per card-hour (illustrative: see the module docstring)
    link_gbs: float | None = None  # per-direction all-reduce link, GB/s; None: no tensor parallelism modelled
    link_latency_us: float = 10.0  # fixed cost of one small all-reduce (launch + synchronisation)
    reserved_gib: float = 1.0  # per card before any tensor: CUDA context and libraries, or the process itself
    is_cpu: bool = False

    def __post_init__(self) -> None:
        for name, low in (("memory_gib", 0.0), ("bandwidth_gbs", 0.0), ("tflops", 0.0)):
            value = getattr(self, name)
            if not value > low:
                raise InvalidParameterError(f"{name} must be > {low}, got {value}", name)
        if not self.price_per_hour >= 0:
            raise InvalidParameterError(f"price_per_hour must be >= 0, got {self.price_per_hour}",
                                        "price_per_hour")


_NVLINK4, _NVLINK3, _PCIE4 = 450.0, 300.0, 32.0

DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("H100-80GB", 79.6, 3350.0, 989.0, 2.99, _NVLINK4),
    Device("H200", 140.4, 4800.0, 989.0, 3.79, _NVLINK4),
    Device("A100-80GB", 80.0, 2039.0, 312.0, 1.79, _NVLINK3),
    Device("A100-40GB", 40.0, 1555.0, 312.0, 1.29, _NVLINK3),
    Device("L4", 22.5, 300.0, 121.0, 0.80, _PCIE4, link_latency_us=25.0),
    Device("A10G", 22.5, 600.0, 70.0, 1.01, _PCIE4, link_latency_us=25.0),
    Device("RTX-4090", 24.0, 1008.0, 165.0, 0.45, _PCIE4, link_latency_us=25.0),
    Device("EPYC-2vCPU", 23.0, 27.2, 0.333, 0.08, is_cpu=True),
    Device("CPU", 64.0, 60.0, 1.0, 0.40, is_cpu=True),  # a generic 8-16 core server socket, dual-channel DDR5
)}
ALIASES: dict[str, str] = {"H100": "H100-80GB", "H100-SXM": "H100-80GB", "H200-141GB": "H200", "A100": "A100-80GB",
                           "4090": "RTX-4090", "this-cpu": "EPYC-2vCPU"}


def device_names() -> list[str]:
    """The names ``get_device`` accepts (aliases included)."""
    return list(DEVICES) + list(ALIASES)


def get_device(name: str, field: str = "device") -> Device:
    """The table's device of that name (case-insensitive); an unknown name is an error listing the table."""
    lookup = {k.lower(): k for k in DEVICES} | {k.lower(): v for k, v in ALIASES.items()}
    key = lookup.get(name.lower())
    if key is None:
        raise InvalidParameterError(f"unknown device {name!r} (known: {', '.join(device_names())}; or "
                                    f"give --memory-gib, --bandwidth-gbs and --tflops)", field)
    return DEVICES[key]


def custom_device(base: Device | None, memory_gib: float | None = None, bandwidth_gbs: float | None = None,
                  tflops: float | None = None, price_per_hour: float | None = None) -> Device:
    """``base`` with the given figures replaced, or (no base) a device made only of them: then memory,
    bandwidth and FLOP/s are all required, each missing one named in the error."""
    given = {"memory_gib": memory_gib, "bandwidth_gbs": bandwidth_gbs, "tflops": tflops,
             "price_per_hour": price_per_hour}
    if base is None:
        missing = [k for k in ("memory_gib", "bandwidth_gbs", "tflops") if given[k] is None]
        if missing:
            flags = ", ".join("--" + k.replace("_", "-") for k in missing)
            raise InvalidParameterError(f"give --device NAME or all of --memory-gib, --bandwidth-gbs and "
                                        f"--tflops (missing {flags})", missing[0])
        return Device("custom", memory_gib, bandwidth_gbs, tflops,  # type: ignore[arg-type]
                      price_per_hour if price_per_hour is not None else 0.0)
    return replace(base, **{k: v for k, v in given.items() if v is not None})
