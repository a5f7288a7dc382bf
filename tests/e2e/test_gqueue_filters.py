"""gqueue's filters, --format and --iterate on a live cluster."""

from __future__ import annotations

import subprocess

from tests.e2e.cluster import BIN, Cluster


def ids(output: str) -> list[int]:
    return [int(line.split()[0]) for line in output.splitlines()[1:]]


def test_filters_format_and_iterate(cluster: Cluster) -> None:
    a = cluster.submit("-J", "alpha", "--hold", "--wrap", "true")
    b = cluster.submit("-J", "beta", "-p", "debug", "--hold", "--wrap", "true")
    c = cluster.submit("-J", "beta", "--hold", "--wrap", "true")
    assert ids(cluster.run("gqueue", "-p", "debug").stdout) == [b]
    assert ids(cluster.run("gqueue", "-n", "beta").stdout) == [b, c]
    assert ids(cluster.run("gqueue", "-j", f"{a},{c}").stdout) == [a, c]
    assert ids(cluster.run("gqueue", "--me", "-n", "alpha,beta", "-p", "gpu").stdout) == [a, c]
    assert ids(cluster.run("gqueue", "-A", "nobody").stdout) == []
    shown = cluster.run("gqueue", "-j", str(b), "-o", "%.6i %9P %j %r").stdout.splitlines()
    assert shown == [" JOBID PARTITION NAME REASON", f"{b:>6} debug     beta JobHeldUser"]
    bad = cluster.run("gqueue", "-o", "%i %Z")
    assert bad.returncode == 2 and "unknown field %Z" in bad.stderr
    looping = subprocess.Popen([str(BIN / "gqueue"), "-i", "1", "-j", str(a)], env=cluster.env,
                               stdout=subprocess.PIPE, text=True)
    try:
        out, _ = looping.communicate(timeout=2.6)
    except subprocess.TimeoutExpired:
        looping.kill()
        out, _ = looping.communicate()
    assert out.count("JOBID") >= 2  # printed again after a second
    cluster.run("gcancel", str(a), str(b), str(c))
