"""The training fixtures (a tiny corpus and a teacher trained on it) for the benchmark modules that train:
benchmarks/finetune.py is tested on the same teacher as cinq/train's tests, built once per session."""

from tests.train.conftest import corpus_settings, fixture_sources, teacher, tiny_corpus  # noqa: F401
