"""The CUDA tensor support that can be checked without a GPU (test_cuda.py has the rest): the
backend is registered for "cuda" (one object for both devices), last_op_stats() has the device
fields, the codec bindings refuse devices they cannot take and calls that mix devices, and the
Python layers take a device argument."""
import sys
import traceback

import pytest
import torch
import torch.distributed as dist

from _spawn import run_world

import lowcomm.torch
from lowcomm import _C


def _registered_worker(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        lc = dist.new_group(backend="lowcomm")
        cpu = lc._get_backend(torch.device("cpu"))
        cuda = lc._get_backend(torch.device("cuda"))
        assert isinstance(cpu, _C.LowcommBackend), type(cpu)
        assert cuda is cpu or (isinstance(cuda, _C.LowcommBackend)
                               and cuda.last_op_stats() == cpu.last_op_stats())
        t = torch.ones(1000)
        dist.all_reduce(t, group=lc)
        st = lowcomm.torch.last_op_stats(lc)
        assert st["device_to_host_bytes"] == 0 and st["host_to_device_bytes"] == 0, st
        assert st["device_path"] == "", st
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_backend_is_registered_for_cpu_and_cuda(tmp_path):
    assert dist.Backend.backend_capability["lowcomm"] == ["cpu", "cuda"]
    assert isinstance(lowcomm.torch.WITH_CUDA, bool)
    run_world(_registered_worker, 2, tmp_path)


def test_codec_bindings_refuse_other_devices():
    x = torch.empty(256, device="meta")
    with pytest.raises(ValueError, match="must be a CPU"):
        _C.encode("q4", x)
    with pytest.raises(ValueError, match="must be a CPU"):
        _C.decode("q4", torch.empty(_C.encoded_size("q4", 256), dtype=torch.uint8), x)


def test_codec_bindings_refuse_mixed_devices():
    n = 256
    out = torch.empty(n)
    codes = torch.empty(_C.encoded_size("q4", n), dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match="one device"):
        _C.decode("q4", codes, out)
    with pytest.raises(ValueError, match="one device"):
        _C.decode_delta("q4", codes, torch.zeros(n), out)
    with pytest.raises(ValueError, match="must be a CPU"):
        _C.encode_delta("q4", torch.ones(n), torch.zeros(n, device="meta"))


def test_codec_bindings_keep_their_cpu_bytes():
    # The CUDA build's bindings choose the device per call; CPU calls are the CPU codec's.
    x = torch.linspace(-3, 3, 1024)
    codes = _C.encode("q4", x)
    assert codes.device.type == "cpu" and codes.dtype == torch.uint8
    out = torch.empty_like(x)
    _C.decode("q4", codes, out)
    assert (out - x).abs().max() < 0.5


def test_python_layers_take_a_device():
    from lowcomm.aqsgd import ActivationCache, Link
    link = Link(1, (4, 8), device="cpu")
    assert link.device == torch.device("cpu") and link.cache.device == torch.device("cpu")
    cache = ActivationCache((4, 8), device="cpu")
    rows = cache.add([5, 6])
    cache.write(rows, torch.ones(2, 32))
    assert torch.equal(cache.read(rows), torch.ones(2, 32))
    from lowcomm import aqsgd_stages
    assert aqsgd_stages.token_like().device.type == "cpu"
