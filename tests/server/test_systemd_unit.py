"""The systemd unit: the settings the design requires, and `systemd-analyze verify`."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str
    cp.read(ROOT / "systemd" / "dualpace.service")
    return cp


def test_unit_settings():
    svc = _unit()["Service"]
    assert svc["Type"] == "notify" and svc["KillMode"] == "mixed"
    assert svc["Restart"] == "on-failure" and svc["LimitMEMLOCK"] == "infinity"
    assert svc["EnvironmentFile"] == "-/etc/dualpace/dualpace.env"
    assert "WatchdogSec" in svc and svc["User"] == "dualpace"
    env = (ROOT / "systemd" / "dualpace.env").read_text()
    from dualpace.cli import build_parser

    serve = next(a for a in build_parser()._subparsers._group_actions[0].choices.items()
                 if a[0] == "serve")[1]
    flags = {o for a in serve._actions for o in a.option_strings if o.startswith("--")}
    undocumented = sorted(f for f in flags - {"--help"} if f not in env)
    assert not undocumented, f"flags missing from dualpace.env: {undocumented}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify(tmp_path):
    text = (ROOT / "systemd" / "dualpace.service").read_text()
    text = (text.replace("/opt/dualpace/bin/dualpace", str(ROOT / "bin" / "dualpace"))
            .replace("WorkingDirectory=/opt/dualpace", f"WorkingDirectory={ROOT}")
            .replace("User=dualpace", "User=root").replace("Group=dualpace", "Group=root"))
    unit = tmp_path / "dualpace.service"
    unit.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
