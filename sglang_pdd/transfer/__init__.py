"""KV transfer: byte accounting now; the fan-out sender and per-path managers come with the core issue."""
