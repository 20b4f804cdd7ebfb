"""torchft on lowcomm: torchft's own integration tests (its Lighthouse, Manager, LocalSGD and
DiLoCo, its EventInjector killing a replica mid-training and the Runner restarting it), with
every Gloo process group they create replaced by lowcomm.torchft.ProcessGroupLowcomm. A test
passes when torchft's own assertions hold: the recovered replica heals from the live one and
the replicas' global state (parameters, outer optimizer) is equal (docs/torch.md, "torchft").
Skipped where torchft is not installed (scripts/deps.sh installs it into .venv)."""
import faulthandler
import unittest

import pytest

pytest.importorskip("torchft")
pytest.importorskip("parameterized")

from datetime import timedelta  # noqa: E402


def _lowcomm_pg_class():
    from lowcomm.torchft import ProcessGroupLowcomm

    class Swapped(ProcessGroupLowcomm):
        """Takes Gloo's constructor arguments (timeout only)."""

        def __init__(self, timeout=timedelta(seconds=60)):
            super().__init__(timeout=timeout)

    return Swapped


@pytest.fixture
def on_lowcomm(monkeypatch):
    import torchft._test.diloco_trainer as dt
    import torchft.local_sgd_integ_test as lit
    import torchft.manager_integ_test as mit
    cls = _lowcomm_pg_class()
    for mod in (dt, lit, mit):
        monkeypatch.setattr(mod, "ProcessGroupGloo", cls)
    made = []
    real_create = cls._create_pg

    def counting(self, store, rank, world_size):
        made.append(self.getBackendName())
        return real_create(self, store, rank, world_size)

    monkeypatch.setattr(cls, "_create_pg", counting)
    return made


def _run(case_cls, name, attempts=3):
    """Runs torchft's test case; a failed attempt is run again, up to `attempts` in all.

    The flake the reruns were for is understood and fixed: a replica's manager hit
    `assert managed_fut._callback` in torchft's callback chain (manager.py,
    _ManagedWork._set_future_callback) because lowcomm's work woke wait() before completing
    its future, so the chain torchft builds right after wait() ran later, on lowcomm's thread,
    after torchft had moved on (test_backend.py checks the order now). The reruns stay as a
    guard; every failed attempt is printed."""
    # torchft's replicas are threads of this process: a hang would stall the whole suite, so
    # past 400 s every thread's stack is printed and the process exits.
    faulthandler.dump_traceback_later(400, exit=True)
    try:
        _attempts(case_cls, name, attempts)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _attempts(case_cls, name, attempts):
    failures = []
    for _ in range(attempts):
        result = unittest.TestResult()
        case_cls(name).run(result)
        problems = [f"{t}: {tb}" for t, tb in result.errors + result.failures]
        if result.testsRun == 1 and not problems and not result.skipped:
            for i, f in enumerate(failures):
                print(f"{name}: attempt {i + 1} failed (passed on a rerun):\n{f}")
            return
        failures.append("\n".join(problems) or str(result.skipped))
    raise AssertionError("\n\n".join(failures))


@pytest.mark.parametrize("name", ["test_local_sgd_recovery_0", "test_diloco_recovery_0",
                                  "test_diloco_healthy_0"])
def test_torchft_local_sgd_and_diloco_on_lowcomm(on_lowcomm, name):
    import torchft.local_sgd_integ_test as lit
    _run(lit.LocalSGDIntegTest, name)
    assert on_lowcomm and set(on_lowcomm) == {"torchft-lowcomm"}, on_lowcomm


@pytest.mark.parametrize("name", ["test_ddp_recovery_0_async_quorum", "test_manager_allreduce_1"])
def test_torchft_manager_on_lowcomm(on_lowcomm, name):
    import torchft.manager_integ_test as mit
    _run(mit.ManagerIntegTest, name)
    assert on_lowcomm and set(on_lowcomm) == {"torchft-lowcomm"}, on_lowcomm
