"""Running `tms` from the CLI tests ($TMS_BIN) and checking its failures."""
import os
import subprocess

TMS = os.environ.get("TMS_BIN")


def tms(*args, env=None, check=False, timeout=600):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([TMS, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def expect_error(p, *needles):
    """A failure as every failure must be: a non-zero exit (not a signal), one line on stderr
    holding every needle."""
    assert p.returncode != 0, f"expected failure, got success: {p.stdout} {p.stderr}"
    assert p.returncode > 0, f"killed by signal {-p.returncode}: {p.stderr!r}"
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {p.stderr!r}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    assert "terminate" not in p.stderr and "Segmentation" not in p.stderr
