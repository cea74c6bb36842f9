"""--profile: the profile's controls fill what the flags left at their defaults."""

from __future__ import annotations

import json

import pytest

from dualpace.config import EngineConfig
from dualpace.profile_file import apply_profile


def test_profile_fills_defaults_and_flags_win(tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"assist_thresholds": [32, 16], "max_num_batched_tokens": 1024,
                                "cpu_batch_limit": 256, "cpu_dtype": "float32"}))
    cfg = apply_profile(EngineConfig(model="m", profile=str(prof)))
    assert cfg.assist_thresholds == "32,16" and cfg.max_num_batched_tokens == 1024
    assert cfg.cpu_batch_limit == 256 and cfg.cpu_dtype == "float32"
    flags = apply_profile(EngineConfig(model="m", profile=str(prof), assist_thresholds="4,2",
                                       cpu_batch_limit=8))
    assert flags.assist_thresholds == "4,2" and flags.cpu_batch_limit == 8


@pytest.mark.parametrize("content,match", [
    ("{", "not valid JSON"), ("[1]", "JSON object"),
    ('{"assist_thresholds": [1]}', "assist_thresholds"),
    ('{"cpu_batch_limit": 0}', "cpu_batch_limit"),
    ('{"assist_thresholds": [0, 0]}', "before Eq. 5 was read literally"),
])
def test_bad_profiles(tmp_path, content, match):
    prof = tmp_path / "p.json"
    prof.write_text(content)
    with pytest.raises(ValueError, match=match):
        apply_profile(EngineConfig(model="m", profile=str(prof)))
    with pytest.raises(ValueError, match="does not exist"):
        apply_profile(EngineConfig(model="m", profile=str(tmp_path / "nope.json")))


def test_format_2_zero_zero_is_always_fused_assist(tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"format": 2, "assist_thresholds": [0, 0]}))
    assert apply_profile(EngineConfig(model="m", profile=str(prof))).assist_thresholds == "0,0"
