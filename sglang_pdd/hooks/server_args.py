"""`--pdd-*` flags on sglang's own parser, and the validated PddConfig handed to every process."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sglang_pdd import __version__, config
from sglang_pdd.server import supported

logger = logging.getLogger(__name__)


def after_add_cli_args(_result, parser) -> None:
    config.add_cli_args(parser)


def after_from_cli_args(server_args, _cls, args, *, require_hooks_applied: Callable[[], None]) -> None:
    """The plugin passes `require_hooks_applied` (`Hook.plugin_check`): a hook never imports the plugin."""
    try:
        cfg = supported.validated(args)
    except config.PddConfigError as e:
        raise SystemExit(f"sglang-pdd: error: {e}") from None
    if cfg.active:
        require_hooks_applied()
    from sglang_pdd.server.idle_wait import configure_server_args

    configure_server_args(server_args, cfg)  # patch 0005: sglang's own idle wait
    server_args._pdd_config = cfg.to_json()  # bookkeeping: survives pickling to the schedulers
    cfg.export_env()
    logger.info("sglang-pdd %s: %s, peers: none configured", __version__, cfg.describe())
