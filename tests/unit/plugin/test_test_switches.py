"""TestSwitches: off without the environment; the knobs file is re-read at each use."""

import json

import pytest

from sglang_pdd.config import ENV_TEST_KNOBS, ENV_TESTING, PddConfigError
from sglang_pdd.test_switches import OFF, TestKnobs, TestSwitches


def test_off_without_the_environment():
    s = TestSwitches.from_env({})
    assert s == OFF and not s.on and not s.testing and s.knobs() == TestKnobs() and not s.drop_eager_kv()


def test_the_knobs_file_is_re_read_and_may_be_missing(tmp_path):
    path = tmp_path / "knobs.json"
    s = TestSwitches.from_env({ENV_TEST_KNOBS: str(path)})
    assert s.on and s.knobs() == TestKnobs()
    path.write_text(json.dumps({"relay_min_eager": "3", "main_write_delay": 1}))
    assert s.knobs() == TestKnobs(relay_min_eager=3, main_write_delay=1.0)
    path.write_text(json.dumps({"packed_staging_bytes": 1}))  # a flag now: --pdd-packed-staging-bytes
    with pytest.raises(PddConfigError, match="unknown knobs"):
        s.knobs()


def test_drop_eager_kv_needs_the_testing_switch_too(tmp_path):
    path = tmp_path / "knobs.json"
    path.write_text(json.dumps({"drop_eager_kv": True}))
    assert not TestSwitches.from_env({ENV_TEST_KNOBS: str(path)}).drop_eager_kv()
    assert TestSwitches.from_env({ENV_TEST_KNOBS: str(path), ENV_TESTING: "1"}).drop_eager_kv()
