"""Exporters: a cinq model folder written in another runtime's format (``cinq export``). Kept import-light: the
command's parser reads the choices below without loading torch or the ``gguf`` package."""

# matrix types of a GGUF export (cinq/export/gguf.py)
GGUF_OUTTYPES: tuple[str, ...] = ("bf16", "q8_0", "q4_0")
