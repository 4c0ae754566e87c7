"""Dollars per million tokens: what the cards cost per hour over what they produce per hour."""

from __future__ import annotations

from cinq.errors import InvalidParameterError


def dollars_per_million_tokens(tokens_per_s: float, price_per_hour: float, num_cards: int = 1) -> float | None:
    """$ per 1M tokens when ``num_cards`` cards at ``price_per_hour`` each produce ``tokens_per_s`` together;
    None when nothing is produced."""
    if price_per_hour < 0 or num_cards < 1:
        raise InvalidParameterError(f"price_per_hour must be >= 0 and num_cards >= 1, got {price_per_hour} and "
                                    f"{num_cards}", "price_per_hour")
    if tokens_per_s <= 0:
        return None
    return price_per_hour * num_cards / 3600.0 / tokens_per_s * 1e6
