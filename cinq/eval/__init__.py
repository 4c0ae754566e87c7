"""Evaluation primitives: reasoning tasks (``tasks``) and perplexity (``perplexity``), shared by the
quantization, distillation and speculative-decoding reports."""
