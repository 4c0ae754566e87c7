"""The CPU a report names (cinq/plan/cpu.py): the instruction set is read from the flags line, widest first."""

from __future__ import annotations

from cinq.plan.cpu import cpu_label, vector_isa

ZEN3 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
ZEN4 = "model name\t: AMD EPYC 9B14\nflags\t\t: avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni\n"
SAPPHIRE = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 fma avx512_bf16 amx_bf16 amx_tile amx_int8\n"


def test_the_widest_instruction_set_the_kernels_use_is_named() -> None:
    assert vector_isa(ZEN3) == "AVX2 + FMA, no AVX512-BF16"
    assert vector_isa(ZEN4) == "AVX512-BF16"
    assert vector_isa(SAPPHIRE) == "AMX"
    assert vector_isa("model name\t: Cortex\nFeatures\t: fp asimd\n") == ""
    assert vector_isa("") == ""


def test_the_label_has_name_cores_and_instruction_set() -> None:
    name, cores, isa = cpu_label(ZEN4).split(", ")
    assert name == "AMD EPYC 9B14" and cores.endswith(" cores") and int(cores.split()[0]) >= 1
    assert isa == "AVX512-BF16"
    assert cpu_label("flags\t\t: sse2\n").split(", ")[-1].endswith("cores")  # no ISA part, no name: still a label
