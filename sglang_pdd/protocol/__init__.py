"""Wire formats of sglang-pdd: per-request parameters and the RLD<->MD token channel (versioned, HMAC'd)."""

PROTOCOL_VERSION = 1
