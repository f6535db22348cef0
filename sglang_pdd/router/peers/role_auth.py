"""The key the router calls its roles with: `Authorization: Bearer KEY` on every call to P, RLD and MD.

Each role runs sglang's own API-key check (the roles start with `--api-key KEY`, or `api-key: KEY` in
the file sglang's `--config` names, which keeps it off the command line): without the key a caller
gets 401 from `/generate`, `/abort_request` and the rest of sglang's API; `/health*`, `/ready*` and
`/metrics*` stay open (sglang leaves them open for probes and scrapers). The router holds the same
key in `SGLANG_PDD_ROLE_API_KEY`, or the file `SGLANG_PDD_ROLE_API_KEY_FILE` names (a mounted
Secret), or `--role-api-key` (which `ps` shows: prefer the environment); its one HTTP session sends
it on every call (requests, aborts, health checks, the load and bandwidth polls).

A router without a key refuses to start unless `--insecure-roles` says the roles are meant to be open
(`router.__main__`); with one, it refuses service to a role that answers without it (`role_lock`).
"""

from __future__ import annotations

import os

from sglang_pdd.protocol.env_secret import env_or_file

ENV_KEY = "SGLANG_PDD_ROLE_API_KEY"
ENV_KEY_FILE = ENV_KEY + "_FILE"
FLAG = "--role-api-key"
MISSING = (f"the roles' API (abort every request, flush the cache, load other weights) would be open to whoever "
           f"reaches their ports. Start every role with sglang's --api-key KEY and give the router the same key "
           f"in {ENV_KEY} (or the file {ENV_KEY_FILE} names), or pass --insecure-roles to call open roles "
           "(a test, or a network only the router reaches)")


def load(environ: dict | None = None) -> str | None:
    """The configured key, None when none is set. ValueError, naming the variable, when both
    variables are set, the file cannot be read, or the key is not one header value can carry."""
    env = environ if environ is not None else os.environ
    data, source = env_or_file(env, ENV_KEY, ENV_KEY_FILE)
    if data is None:
        return None
    return _checked(data.decode("utf-8", errors="replace"), source)


def export(flag_value: str | None, environ: dict | None = None) -> str | None:
    """Validate the router's key at start-up; a key given by `--role-api-key` goes into the
    environment, where `headers` reads it. Returns the key (None: the roles are called without one)."""
    env = environ if environ is not None else os.environ
    if flag_value is None:
        return load(env)
    if env.get(ENV_KEY) or env.get(ENV_KEY_FILE):
        raise ValueError(f"{FLAG} and {ENV_KEY} (or {ENV_KEY_FILE}) are both set: set one (prefer the environment)")
    env[ENV_KEY] = _checked(flag_value, FLAG)
    return env[ENV_KEY]


def headers(environ: dict | None = None) -> dict[str, str] | None:
    """The default headers of the router's session to its roles (None without a key)."""
    key = load(environ)
    return {"Authorization": f"Bearer {key}"} if key else None


def _checked(key: str, source: str) -> str:
    if not key:
        raise ValueError(f"{source}: the key is empty")
    if not all("!" <= c <= "~" for c in key):  # visible ASCII: what an HTTP header carries unchanged
        raise ValueError(f"{source}: the key must be printable ASCII without spaces or control characters")
    return key
