import pytest

from sglang_pdd.server.input_guard import BadInputError, check_input_ids


def test_valid_ids_and_text_requests_pass():
    check_input_ids([0, 5, 2047], vocab_size=2048)
    check_input_ids(None, vocab_size=2048)  # text request: tokenized later by sglang


@pytest.mark.parametrize("ids, bad", [([1, 2048], 2048), ([-3, 1], -3), ([1, 10 ** 12, 5000], 10 ** 12)])
def test_first_out_of_vocab_id_is_named(ids, bad):
    with pytest.raises(BadInputError, match=rf"token id {bad} is outside.*\[0, 2048\)"):
        check_input_ids(ids, vocab_size=2048)


def test_empty_prompt_is_rejected():
    with pytest.raises(BadInputError, match="empty"):
        check_input_ids([], vocab_size=2048)


def test_bad_input_is_a_value_error_so_sglang_answers_400():
    assert issubclass(BadInputError, ValueError)
