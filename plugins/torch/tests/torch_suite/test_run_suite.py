"""The exit status of run_suite.py (PyTorch's distributed suite on lowcomm): non-zero exactly
when a test expected to pass did not, or the known-failure list is out of date. Runs without
torch's suite (the verdict and the comparison work on recorded outcomes)."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_suite  # noqa: E402

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_suite.py")
GET_BACKEND = "AssertionError: String comparison failed: 'lowcomm' != 'gloo'"
DDP_LOGGING = "AssertionError: String comparison failed: 'custom' != 'lowcomm'"


def rec(test, outcome, reason=""):
    return {"test": test, "outcome": outcome, "seconds": 0.1, "reason": reason, "detail": reason}


def as_run(backend, records):
    return {"backend": backend, "seconds": 1, "counts": run_suite._counts(records),
            "tests": records}


def test_known_failures_with_their_reasons_pass_the_run():
    records = [rec("test_barrier", "pass"), rec("test_foo", "skip", "needs GPUs"),
               rec("test_get_backend", "error", GET_BACKEND),
               rec("test_ddp_logging_data_cpu", "fail", DDP_LOGGING)]
    expected, unexpected = run_suite._verdict("lowcomm", records)
    assert expected == ["test_get_backend", "test_ddp_logging_data_cpu"]
    assert unexpected == []


@pytest.mark.parametrize("records, what", [
    ([rec("test_barrier", "error", "RuntimeError: lowcomm: Timed out")], "test_barrier error"),
    ([rec("test_barrier", "fail", "unexpected success")], "test_barrier fail"),
    ([rec("test_get_backend", "error", "RuntimeError: connection reset")],
     "known to fail, but with"),
    ([rec("test_get_backend", "pass")], "remove it from KNOWN_FAILURES"),
    ([], "no test ran"),
])
def test_anything_else_fails_the_run(records, what):
    _, unexpected = run_suite._verdict("lowcomm", records)
    assert len(unexpected) == 1 and what in unexpected[0], unexpected


def test_gloo_has_no_known_failures():
    _, unexpected = run_suite._verdict("gloo", [rec("test_get_backend", "error", GET_BACKEND)])
    assert len(unexpected) == 1


def write_runs(tmp_path, gloo, lowcomm):
    for backend, records in (("gloo", gloo), ("lowcomm", lowcomm)):
        (tmp_path / f"{backend}.json").write_text(json.dumps(as_run(backend, records)))


def compare(tmp_path):
    return subprocess.run([sys.executable, RUNNER, "--compare", str(tmp_path)],
                          capture_output=True, text=True)


def test_compare_accepts_only_known_failures_among_gloo_only_passes(tmp_path):
    gloo = [rec("test_barrier", "pass"), rec("test_get_backend", "pass")]
    write_runs(tmp_path, gloo, [rec("test_barrier", "pass"),
                                rec("test_get_backend", "error", GET_BACKEND)])
    done = compare(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(error, known)" in (tmp_path / "summary.md").read_text()

    for lowcomm in ([rec("test_barrier", "skip", "skipped"), rec("test_get_backend", "error",
                                                                  GET_BACKEND)],
                    [rec("test_get_backend", "error", GET_BACKEND)]):  # missing on lowcomm
        write_runs(tmp_path, gloo, lowcomm)
        done = compare(tmp_path)
        assert done.returncode == 1, done.stdout
        assert "Not known failures among the Gloo-only passes: 1 (`test_barrier`)" in done.stdout


def test_a_run_that_matches_no_test_exits_non_zero(tmp_path):
    # The child imports torch's suite (a few seconds) and runs nothing.
    for needed in ("torch", "expecttest", "hypothesis"):
        pytest.importorskip(needed)
    done = subprocess.run([sys.executable, RUNNER, "--backend", "gloo", "--out", str(tmp_path),
                           "-k", "^no_such_test$"], capture_output=True, text=True, cwd="/tmp",
                          timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no test ran" in done.stderr
