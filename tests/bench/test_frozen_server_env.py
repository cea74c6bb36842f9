"""bench/common.py's frozen_server_env: the servers of a long benchmark import a snapshot of
the package taken when it first asked, so edits of the tree during the run do not reach them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import common


def test_servers_import_the_snapshot_not_the_tree(monkeypatch, tmp_path):
    tree = tmp_path / "repo"
    (tree / "dualpace" / "__pycache__").mkdir(parents=True)
    (tree / "dualpace" / "__init__.py").write_text("VERSION = 'at start'\n")
    (tree / "dualpace" / "__pycache__" / "x.pyc").write_bytes(b"stale")
    monkeypatch.setattr(common, "REPO", tree)
    common.frozen_server_env.cache_clear()
    try:
        env = common.frozen_server_env()
        assert common.frozen_server_env() is env  # one snapshot per benchmark process
        (tree / "dualpace" / "__init__.py").write_text("VERSION = 'edited'\n")
        out = subprocess.run([sys.executable, "-c", "import dualpace; print(dualpace.VERSION, "
                              "dualpace.__file__)"], env=env, capture_output=True, text=True,
                             check=True, cwd=tmp_path).stdout.split()
        assert out[0:2] == ["at", "start"], out
        snapshot = Path(out[2]).parent
        assert snapshot.parent != tree and not (snapshot / "__pycache__" / "x.pyc").exists()
    finally:
        common.frozen_server_env.cache_clear()
