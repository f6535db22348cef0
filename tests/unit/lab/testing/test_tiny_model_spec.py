import pytest

from sglang_pdd.lab.testing.tiny_model import TinyModelSpec


def test_default_kv_size_is_realistic():
    spec = TinyModelSpec()
    assert spec.kv_bytes_per_token == 2 * 4 * 8 * 64 * 4 == 16384
    assert spec.kv_bytes_per_token >= 8 * 1024


def test_kv_bytes_follow_the_architecture():
    assert TinyModelSpec(layers=2, kv_heads=2, head_dim=32, heads=4, dtype="float16").kv_bytes_per_token == 512


@pytest.mark.parametrize("kw, match", [
    ({"heads": 6, "kv_heads": 4}, "multiple of kv_heads"),
    ({"dtype": "int8"}, "dtype must be one of"),
    ({"vocab": 100}, "vocab must be at least"),
])
def test_invalid_specs_are_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        TinyModelSpec(**kw)


def test_fingerprint_changes_with_the_spec():
    assert TinyModelSpec().fingerprint() != TinyModelSpec(seed=1).fingerprint()
