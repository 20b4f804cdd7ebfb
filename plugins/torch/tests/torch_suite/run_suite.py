"""Runs PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test,
the suite PyTorch runs for Gloo) against Gloo or against lowcomm, 2 ranks, on CPU.

    python run_suite.py --backend gloo    --out DIR   # DIR/gloo.json, DIR/gloo.log
    python run_suite.py --backend lowcomm --out DIR   # DIR/lowcomm.json, DIR/lowcomm.log
    python run_suite.py --compare DIR                 # DIR/summary.md: counts, Gloo-only passes

Exit status: 0 when every test that ran passed, skipped or failed exactly as KNOWN_FAILURES
expects; 1 when any other test failed or errored, a known failure passed or failed for another
reason (the list is out of date), or no test ran. --compare: 1 when Gloo passes a test that
lowcomm does not pass and that is not a known failure.

The equivalent of PyTorch's test/distributed/test_distributed_spawn.py (not in the wheel):
`TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase)` spawns WORLD_SIZE
processes per test; every process initializes the group from a shared file and runs the test.

How lowcomm runs what Gloo runs: the suite decides at import time which tests exist and which
are skipped from BACKEND (`BACKEND != "gloo"`, `BACKEND not in backend_feature["ddp"]`, ...),
and inside tests which branch to take. So the module is imported with BACKEND=gloo in both runs,
and with --backend lowcomm every process (the spawned ranks re-import this file) imports
lowcomm.torch and rewrites the backend of every process group torch creates
(distributed_c10d._new_process_group_helper, which init_process_group, new_group, new_subgroups
and device meshes all go through): "gloo" becomes "lowcomm", and "cpu:gloo" in a device map
(including the default one of an unnamed backend) becomes "cpu:lowcomm". Nothing else changes,
so a test that asserts the backend's name or class (dist.get_backend() == "gloo",
ProcessGroupGloo) fails on lowcomm for that reason alone. CUDA is hidden (CUDA_VISIBLE_DEVICES
is empty) in both runs: lowcomm has CPU tensors only, and the GPU tests skip for both.
"""
import argparse
import json
import os
import re
import sys
import time
import unittest

SUITE_BACKEND = os.environ.get("LOWCOMM_SUITE_BACKEND")

# The tests expected to fail on each backend, each with a pattern its failure's innermost
# exception line (_reason) must match (docs/torch.md, "PyTorch's distributed suite"). Every
# other test that runs must pass or skip. A listed test that passes, or fails with another
# reason, fails the run too: the list must say what is true.
KNOWN_FAILURES = {
    "gloo": {},
    "lowcomm": {
        # Asserts dist.get_backend() == BACKEND, and the harness runs lowcomm with BACKEND=gloo.
        "test_get_backend": r"AssertionError: .*'lowcomm' != 'gloo'",
        # DDP's logging data names the backend from ProcessGroup::getBackendName(), "custom"
        # for every third-party backend; the test wants dist.get_backend()'s "lowcomm".
        "test_ddp_logging_data_cpu": r"AssertionError: .*'custom' != 'lowcomm'",
    },
}

if SUITE_BACKEND is not None:
    # Set by main() before the suite is imported; inherited by the spawned ranks.
    import torch.distributed.distributed_c10d as c10d

    if SUITE_BACKEND == "lowcomm":
        import lowcomm.torch  # noqa: F401  registers the backend "lowcomm" in every rank

        _helper = c10d._new_process_group_helper

        def _lowcomm_for_gloo(backend):
            if not isinstance(backend, str):
                return backend
            name = backend.lower()
            if name == "gloo":
                return "lowcomm"
            if "gloo" not in name and name != c10d.Backend.UNDEFINED:
                return backend
            device_map = c10d.BackendConfig(backend).get_device_backend_map()
            return ",".join(f"{device}:{'lowcomm' if b == 'gloo' else b}"
                            for device, b in device_map.items())

        def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend,
                                      *args, **kwargs):
            return _helper(group_size, group_rank, global_ranks_in_group,
                           _lowcomm_for_gloo(backend), *args, **kwargs)

        c10d._new_process_group_helper = _new_process_group_helper

    from torch.testing._internal.distributed import distributed_test as _suite  # noqa: E402
    from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
        DistributedTest, TestDistBackend)

    if SUITE_BACKEND == "lowcomm":
        # Tests check profiler events ("gloo:all_reduce", read as f"{dist.get_backend()}:...")
        # only for the backends in these lists; hold lowcomm to the same checks as Gloo.
        for _listed in (_suite.PROFILING_SUPPORTED_BACKENDS,
                        _suite.CUDA_PROFILING_SUPPORTED_BACKENDS,
                        _suite.SEND_RECV_PROFILING_SUPPORTED_BACKENDS):
            _listed.append("lowcomm")

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):

        def setUp(self):
            super().setUp()
            self._spawn_processes()


class _Recorder(unittest.TextTestResult):
    """Keeps every test's outcome, time and (for failures and errors) traceback."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []
        self._start = 0.0

    def startTest(self, test):
        self._start = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, detail=""):
        self.records.append({"test": test.id().split(".")[-1], "outcome": outcome,
                             "seconds": round(time.monotonic() - self._start, 2),
                             "reason": _reason(detail) if outcome in ("fail", "error")
                             else detail, "detail": detail})

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "fail", "unexpected success")


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b.*")


def _reason(detail):
    """The innermost exception line: a rank's failure reaches the parent wrapped in "Process 0
    exited with error code 10 and exception:" and that rank's traceback."""
    lines = [l for l in detail.splitlines() if _EXC_LINE.match(l)] or detail.strip().splitlines()
    return lines[-1][:300] if lines else ""


def _run(args):
    os.makedirs(args.out, exist_ok=True)
    from torch.testing._internal.distributed import distributed_test  # already imported

    loader = unittest.TestLoader()
    suite = loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    if args.k:
        patterns = [re.compile(p) for p in args.k]
        suite = unittest.TestSuite(t for t in suite
                                   if any(p.search(t.id().split(".")[-1]) for p in patterns))
    log_path = os.path.join(args.out, f"{args.backend}.log")
    with open(log_path, "w") as log:
        runner = unittest.TextTestRunner(stream=log, verbosity=2, resultclass=_Recorder)
        start = time.time()
        result = runner.run(suite)
    import torch
    report = {"backend": args.backend, "world_size": args.world_size,
              "torch": torch.__version__, "suite_file": distributed_test.__file__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)),
              "seconds": round(time.time() - start), "counts": _counts(result.records),
              "tests": result.records}
    expected, unexpected = _verdict(args.backend, result.records)
    report["expected_failures"] = expected
    report["unexpected"] = unexpected
    with open(os.path.join(args.out, f"{args.backend}.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"{args.backend}: {report['counts']} in {report['seconds']} s; {log_path}")
    if expected:
        print(f"{args.backend}: {len(expected)} known failure(s), as expected: "
              + ", ".join(expected))
    for problem in unexpected:
        print(f"{args.backend}: UNEXPECTED: {problem}", file=sys.stderr)
    return 1 if unexpected else 0


def _verdict(backend, records):
    """(the known failures that failed as expected, what else went wrong) for one run."""
    known = KNOWN_FAILURES[backend]
    expected, unexpected = [], []
    if not records:
        unexpected.append("no test ran (does -k match any test?)")
    for r in records:
        name, outcome = r["test"], r["outcome"]
        if name in known:
            if outcome in ("fail", "error") and re.search(known[name], r["reason"]):
                expected.append(name)
            elif outcome in ("fail", "error"):
                unexpected.append(f"{name} {outcome}: {r['reason']} (known to fail, but with "
                                  f"/{known[name]}/)")
            elif outcome == "pass":
                unexpected.append(f"{name} passed: remove it from KNOWN_FAILURES")
        elif outcome in ("fail", "error"):
            unexpected.append(f"{name} {outcome}: {r['reason']}")
    return expected, unexpected


def _counts(records):
    counts = {"pass": 0, "fail": 0, "error": 0, "skip": 0, "xfail": 0}
    for r in records:
        counts[r["outcome"]] += 1
    counts["total"] = len(records)
    return counts


def _compare(out):
    runs = {}
    for b in ("gloo", "lowcomm"):
        with open(os.path.join(out, f"{b}.json")) as f:
            runs[b] = json.load(f)
    by_test = {b: {r["test"]: r for r in runs[b]["tests"]} for b in runs}

    def passes_only(b, other):
        return sorted(t for t, r in by_test[b].items() if r["outcome"] == "pass"
                      and by_test[other].get(t, {}).get("outcome") != "pass")

    lines = ["| backend | pass | fail | error | skip | total | time |",
             "|---|---|---|---|---|---|---|"]
    for b, run in runs.items():
        c = run["counts"]
        lines.append(f"| {b} | {c['pass']} | {c['fail']} | {c['error']} | {c['skip']} | "
                     f"{c['total']} | {run['seconds']} s |")
    gloo_only = passes_only("gloo", "lowcomm")
    known = KNOWN_FAILURES["lowcomm"]
    lines += ["", f"Tests Gloo passes that lowcomm does not: {len(gloo_only)}", ""]
    regressions = []
    for t in gloo_only:
        r = by_test["lowcomm"].get(t, {"outcome": "missing", "reason": ""})
        is_known = (t in known and r["outcome"] in ("fail", "error")
                    and re.search(known[t], r["reason"]))
        if not is_known:
            regressions.append(t)
        lines.append(f"- `{t}` ({r['outcome']}{', known' if is_known else ''}): {r['reason']}")
    lowcomm_only = passes_only("lowcomm", "gloo")
    lines += ["", f"Tests lowcomm passes that Gloo does not: {len(lowcomm_only)}", ""]
    lines += [f"- `{t}` (gloo {by_test['gloo'].get(t, {}).get('outcome', 'missing')})"
              for t in lowcomm_only]
    lines += ["", f"Not known failures among the Gloo-only passes: {len(regressions)}"
              + (" (" + ", ".join(f"`{t}`" for t in regressions) + ")" if regressions else "")]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 1 if regressions else 0


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["gloo", "lowcomm"])
    p.add_argument("--compare", metavar="DIR", help="summarize DIR/gloo.json and DIR/lowcomm.json")
    p.add_argument("--out", default="torch_suite_out")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--timeout", type=int, default=180, help="per-test seconds")
    p.add_argument("-k", action="append", help="run only tests whose name matches (regex)")
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    return p


def main():
    p = _parser()
    args = p.parse_args()
    if args.compare:
        return _compare(args.compare)
    if not args.backend:
        p.error("--backend or --compare")
    if args._child:
        return _run(args)
    os.environ.update({"BACKEND": "gloo", "LOWCOMM_SUITE_BACKEND": args.backend,
                       "WORLD_SIZE": str(args.world_size), "CUDA_VISIBLE_DEVICES": "",
                       "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(args.timeout)})
    # As PyTorch's run_test.py does for its file-init variant: tests gated on a file:// init
    # method at import time run (each test's setUp then points INIT_METHOD at its own file).
    os.environ["INIT_METHOD"] = "file://" + os.path.join(os.path.abspath(args.out), "init_file")
    os.environ.setdefault("LOWCOMM_SOCKET_IFNAME", "lo")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    for var in ("LOWCOMM_CODEC", "LOWCOMM_CODEC_THRESHOLD", "LOWCOMM_ERROR_FEEDBACK"):
        os.environ.pop(var, None)  # compression off: every lowcomm op exact
    # Re-run this file with the environment set: the module-level code above then imports the
    # suite as the spawned ranks will (they re-import this file as __mp_main__).
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "--_child"] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
