"""Evaluation, the quality room: perplexity (``perplexity``; with KL / top-1 against a baseline in one pass:
``text_scores``), the one arithmetic benchmark (``arithmetic``, with standard errors: ``standard_error``;
generation through the engine or without it: ``generation``) and few-shot tasks (``task_set``), the offline
acceptance of speculative heads (``spec_acceptance``), and the quantization study: per-folder rows
(``quant_quality``), the report with findings and plot (``quality_report``, ``findings``) and the resumable runner
behind `cinq eval --variants` (``quant_study``; its grid is ``cinq.quant.variants``). The problems themselves are
``cinq.tasks``, shared with training; eval imports neither ``cinq.train`` nor anything that imports eval."""
