"""The quantization tests' tiny trained Llama folder, shared with the evaluation tests (one per session)."""

from tests.quant.conftest import trained_tiny  # noqa: F401  (a fixture, used by name)
