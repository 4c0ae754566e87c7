"""Evaluation: reasoning tasks (``tasks``) and their one benchmark implementation (``arithmetic``, with standard
errors: ``standard_error``; generation through the engine or without it: ``generation``), perplexity
(``perplexity``; with KL / top-1 against a baseline in one pass: ``text_scores``), and the quantization study:
per-folder rows (``quant_quality``), the report with findings and plot (``quality_report``, ``findings``), the
variant grid (``variants``) and the resumable runner behind `cinq eval --variants` (``quant_study``). The tasks,
perplexity and arithmetic benchmark are shared with the training and distillation reports in ``cinq.train``."""
