"""sglang-pdd: Prefill -> RelayDecode -> MainDecode disaggregation for SGLang.

Importing the package is cheap and never imports sglang; the sglang hooks live in
`sglang_pdd.plugin` and are loaded by sglang through its `sglang.srt.plugins` entry point.
"""

__version__ = "0.1.0"


def Engine(**kwargs):  # noqa: N802  (named as sglang's)
    """sglang's offline Engine with the plugin's `pdd_*` options (see `sglang_pdd.engine`)."""
    from sglang_pdd.engine import Engine as _engine

    return _engine(**kwargs)
