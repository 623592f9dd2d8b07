"""Debian's kcat (built on librdkafka 2.0.2, which misreads some ApiVersions
replies): metadata list, produce, consume."""

import shutil
import subprocess

import pytest

LINES = [f"key-{i}:value {i} with spaces" for i in range(20)] + [":no key", "k:"]


def kcat(*args, stdin=None, timeout=30):
    binary = shutil.which("kcat")
    if binary is None:
        pytest.fail("kcat is not installed (scripts/test.sh installs it)")
    done = subprocess.run(
        [binary, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"kcat {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def test_produce_list_and_consume(ketch, topic_name):
    broker = ["-b", ketch.bootstrap]

    kcat(*broker, "-P", "-t", topic_name, "-p", "0", "-K:", stdin="\n".join(LINES) + "\n")

    listing = kcat(*broker, "-L")
    assert f'topic "{topic_name}"' in listing, listing
    assert "partition 0, leader 0" in listing, listing

    consumed = kcat(*broker, "-C", "-t", topic_name, "-p", "0", "-o", "beginning", "-e", "-K:")
    assert consumed.splitlines() == LINES


def test_consume_reports_offsets(ketch, topic_name):
    broker = ["-b", ketch.bootstrap]
    kcat(*broker, "-P", "-t", topic_name, "-p", "0", stdin="a\nb\nc\n")
    out = kcat(*broker, "-C", "-t", topic_name, "-p", "0", "-o", "1", "-e", "-f", "%o %s\\n")
    assert out.splitlines() == ["1 b", "2 c"]
