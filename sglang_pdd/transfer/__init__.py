"""KV transfer on P (and the landing on MD): fan-out sender, main lanes, packed WAN path, accounting."""
