"""Evaluation: reasoning tasks (``tasks``), perplexity (``perplexity``) and the quantization quality report
(``quant_quality``); the tasks and perplexity are shared with the distillation reports in ``cinq.train``."""
