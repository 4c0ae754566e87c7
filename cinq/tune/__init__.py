"""``cinq tune``: the cheapest serving configuration that meets a latency SLO and a quality floor, found by
pruning a configuration space with ``cinq plan``'s memory and roofline model and deciding by short measured runs."""
