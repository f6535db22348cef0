"""Thin sglang hook bodies. Each delegates to a plain, testable module of sglang_pdd.

`sglang_pdd.plugin` registers them; nothing else imports this package.
"""
