"""Moved to ``cinq.quant.variants`` (issue 33: quant no longer imports eval). This name stays only until
``cinq/tune`` (another change in flight) imports the new one; then delete this file."""

from cinq.quant.variants import one_variant

__all__ = ["one_variant"]
