"""The profile JSON that ``dualpace serve --profile`` reads (paper §4.3: the offline
profiler's controls). Keys, all optional:

    {"format": 2,                      # 2: assist_thresholds follow Eq. 5 literally
     "assist_thresholds": [P, F],      # post-attention routing (Eq. 5, Algorithm 1)
     "max_num_batched_tokens": N,      # GPU batched-token limit (PAVA plateau rule)
     "cpu_batch_limit": C,             # CPU decode batch limit (decode-throughput peak)
     "cpu_dtype": "bfloat16"}          # the CPU dense dtype the profiler chose

Flags given on the command line win over the profile; the profile wins over defaults.
Profiles written before format 2 read (0, 0) as "no assist"; Eq. 5 makes it "always
Fused-Assist", so such a profile with (0, 0) is refused rather than silently reversed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dualpace.config import EngineConfig

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
PROFILE_FORMAT = 2


def load_profile(path: str) -> dict:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"profile: {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"profile: {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"profile: {path} must hold a JSON object")
    out = {}
    th = data.get("assist_thresholds")
    if th is not None:
        if not (isinstance(th, list) and len(th) == 2 and all(isinstance(x, int) for x in th)):
            raise ValueError(f"profile: {path}: 'assist_thresholds' must be [P, F]")
        if th == [0, 0] and data.get("format", 1) < PROFILE_FORMAT:
            raise ValueError(f"profile: {path}: assist_thresholds [0, 0] in a profile written "
                             "before Eq. 5 was read literally meant 'no Dense Assist'; it now "
                             "means 'always Fused-Assist'. Re-run `dualpace profile`, or drop "
                             "the key (no assist is the default)")
        out["assist_thresholds"] = f"{th[0]},{th[1]}"
    for key in ("max_num_batched_tokens", "cpu_batch_limit"):
        v = data.get(key)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"profile: {path}: '{key}' must be a positive integer")
            out[key] = v
    if data.get("cpu_dtype") is not None:
        out["cpu_dtype"] = data["cpu_dtype"]
    return out


def apply_profile(config: EngineConfig) -> EngineConfig:
    """A new config with the profile's values where the config still has the defaults."""
    if not config.profile:
        return config
    values = load_profile(config.profile)
    chosen = {k: v for k, v in values.items() if getattr(config, k) == _DEFAULTS[k]}
    return dataclasses.replace(config, **chosen)
