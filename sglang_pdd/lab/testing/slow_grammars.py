"""Grammars that compile slowly, for the tests of the router's grammar bound (tests/unit/router/api/grammar/
test_guard.py, tests/e2e/test_hostile_clients.py)."""


def nested(n: int) -> dict:
    """A JSON schema of objects nested `n` deep: 200 deep compiles in 2.1-3.3 s, 400 deep in 27 s (xgrammar on
    the tiny model's 2048-token vocabulary, one thread, a loaded 2-core box)."""
    s = {"type": "string"}
    for _ in range(n):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s
