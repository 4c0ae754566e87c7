"""Data, training and distillation: the corpus builder (``sources``, ``corpus``, ``build``), the BPE tokenizer
(``tokenizer_train``), token files and batches (``data``), the training loop (``trainer``, ``schedule``,
``checkpoint``), pretraining (``pretrain``, ``presets``), knowledge distillation (``losses``, ``objective``,
``distill`` with ``seqkd``, ``onpolicy`` and ``cot`` regimes, ``generation``), and what ships a model
(``evaluate``, ``model_card``, ``distill_report``, ``eval_runs``, ``export``, ``plots``, ``sizing``)."""
