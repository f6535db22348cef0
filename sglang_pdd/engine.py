"""`sglang_pdd.Engine(**kwargs)`: sglang's offline Engine (`sglang.Engine`) with the plugin's options.

`sglang.Engine(**kwargs)` builds its ServerArgs from the keywords and refuses any it does not know,
so `sglang.Engine(pdd_role="main")` raises a TypeError. This takes the plugin's options as keywords
named as on the command line (`--pdd-role` -> `pdd_role`), checks them exactly as `launch_server`
does (the same `sglang-pdd: error: ...` messages, as a ValueError), hands the config to the engine's
processes (`SGLANG_PDD_CONFIG`, as the launcher does: one PDD config per Python process) and starts
`sglang.Engine` with the rest:

    engine = sglang_pdd.Engine(model_path=M, disaggregation_mode="decode", pdd_role="main", ...)
"""

from __future__ import annotations

from typing import Any

from sglang_pdd import config
from sglang_pdd.server import supported

PREFIX = "pdd_"


class _Args:
    """sglang's server args, with the plugin's options by their dest names (defaults where not given)."""

    def __init__(self, server_args: Any, pdd: dict):
        self._server_args = server_args
        self.__dict__.update({s.dest: s.default for s in config.FLAGS}, **pdd)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server_args, name)


def split(kwargs: dict) -> tuple[dict, dict]:
    """(the plugin's options, sglang's); TypeError for a `pdd_*` keyword the plugin does not have."""
    known = {s.dest for s in config.FLAGS}
    pdd = {k: v for k, v in kwargs.items() if k.startswith(PREFIX)}
    unknown = sorted(set(pdd) - known)
    if unknown:
        raise TypeError(f"sglang-pdd: unknown option {', '.join(unknown)} (the plugin's: {', '.join(sorted(known))})")
    return pdd, {k: v for k, v in kwargs.items() if k not in pdd}


def server_args_and_config(**kwargs) -> tuple[Any, config.PddConfig]:
    """sglang's ServerArgs for the keywords other than the plugin's, and the checked PddConfig."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    pdd, rest = split(kwargs)
    if pdd and "server_args" in rest:
        raise TypeError("sglang-pdd: give the pdd_* options with the other keywords, not with server_args")
    load_plugins()  # as sglang.Engine does before it builds its ServerArgs
    server_args = rest["server_args"] if "server_args" in rest else ServerArgs(**{"log_level": "error", **rest})
    try:
        cfg = supported.validated(_Args(server_args, pdd))
    except config.PddConfigError as e:
        raise ValueError(f"sglang-pdd: error: {e}") from None
    from sglang_pdd.server.idle_wait import configure_server_args

    configure_server_args(server_args, cfg)  # patch 0005: sglang's own idle wait
    return server_args, cfg


def Engine(**kwargs):  # noqa: N802  (named as sglang's)
    import sglang

    server_args, cfg = server_args_and_config(**kwargs)
    if cfg.active:
        from sglang_pdd.plugin import require_hooks_applied

        require_hooks_applied()
    cfg.export_env()
    return sglang.Engine(server_args=server_args)
