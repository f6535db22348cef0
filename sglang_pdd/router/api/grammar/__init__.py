"""The grammar guard: a request's grammar compiled within bounds before any role sees it (`guard`), in
worker processes a bound can kill (`workers`), each kind compiled as sglang's xgrammar backend does
(`compile`)."""
