"""benchmark/append-script-cost.py still drives the append script: the
tool passes the script's arguments by position, so a change to them must
change the tool too (it exits non-zero when an append is refused)."""

import re
import subprocess
import sys

from conftest import REPO

TOOL = REPO / "benchmark" / "append-script-cost.py"


def run(*args):
    return subprocess.run(
        [sys.executable, str(TOOL), "--calls", "200", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_plain_and_idempotent_appends_are_stored_and_timed():
    for args in ([], ["--idempotent"], ["--idempotent", "--state", "json"]):
        done = run(*args)
        assert done.returncode == 0, done.stderr
        m = re.search(r"script µs/call ([0-9.]+)\s+redis-server CPU µs/call ([0-9.]+)", done.stdout)
        assert m, done.stdout
        # Redis counts each call; its CPU time comes in 10 ms ticks, which
        # 200 calls may not reach.
        assert float(m.group(1)) > 0


def test_a_refused_append_fails_the_run(tmp_path):
    # A script that refuses every append, as append.lua does for a
    # partition it does not know.
    script = tmp_path / "refuse.lua"
    script.write_text("return {'no_partition'}\n")
    done = run("--script", str(script))
    assert done.returncode != 0
    assert "refused" in done.stderr
