"""TokenizerManager: validate every request's token IDs before it is queued (see input_guard)."""

from __future__ import annotations

from sglang_pdd.server.input_guard import check_input_ids


def before_validate_one_request(manager, obj, input_ids, *args, **kwargs) -> None:
    check_input_ids(input_ids, manager.model_config.vocab_size)
