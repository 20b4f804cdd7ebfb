"""Launchers and rendezvous: torchrun (env://) with lowcomm as the default group, tcp://, and
subgroups of some of the ranks (new_group(ranks=...)), each in real processes; `import lowcomm`
alone registers the backend, in a fresh interpreter."""
import datetime
import os
import socket
import subprocess
import sys
import textwrap
import traceback

import torch
import torch.distributed as dist

from _spawn import run_world

import lowcomm.torch  # noqa: F401

TORCHRUN_SCRIPT = textwrap.dedent("""
    import os
    import torch
    import torch.distributed as dist
    import lowcomm.torch  # registers "lowcomm"

    dist.init_process_group("lowcomm")  # env:// from torchrun: no other change
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(os.environ["WORLD_SIZE"]) == 3
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((1000,), 6.0)), x[:4]
    gloo = dist.new_group(backend="gloo")  # a Gloo group beside the lowcomm default
    y = torch.ones(10)
    dist.all_reduce(y, group=gloo)
    assert torch.equal(y, torch.full((10,), 3.0))
    dist.barrier()
    print(f"rank {rank}: ok", flush=True)
    dist.destroy_process_group()
""")


IMPORT_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    import lowcomm  # the package only: registers "lowcomm"

    assert "lowcomm" in dist.Backend.backend_list
    dist.init_process_group("lowcomm", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    assert dist.get_backend() == "lowcomm"
    x = torch.ones(8)
    dist.all_reduce(x)
    assert torch.equal(x, torch.ones(8))
    dist.destroy_process_group()
    print("ok", flush=True)
""")


def test_import_lowcomm_registers_the_backend(tmp_path):
    out = subprocess.run([sys.executable, "-c", IMPORT_SCRIPT, str(tmp_path / "init")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    # every submodule imports first in a fresh interpreter (no import cycle through lowcomm)
    for mod in ("lowcomm.torch", "lowcomm.diloco", "lowcomm.aqsgd", "lowcomm.aqsgd_stages"):
        out = subprocess.run([sys.executable, "-c", f"import {mod}; import torch.distributed as d; "
                              "assert 'lowcomm' in d.Backend.backend_list"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (mod, out.stderr[-3000:])


def test_torchrun_env_rendezvous(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=3", str(script)], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for r in range(3):
        assert f"rank {r}: ok" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_worker(rank, world, init_file, errors):
    try:
        port = int(open(init_file + ".port").read())
        dist.init_process_group("lowcomm", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        x = torch.full((100,), float(rank))
        dist.all_reduce(x)
        assert torch.equal(x, torch.full((100,), float(sum(range(world))))), x[:4]
        # subgroups of some ranks: only members call into lowcomm; the others get no group
        pair = dist.new_group([0, 2], backend="lowcomm")
        odd = dist.new_group([1, 2], backend="lowcomm")
        if rank in (0, 2):
            y = torch.full((7,), float(rank + 1))
            dist.all_reduce(y, group=pair)
            assert torch.equal(y, torch.full((7,), 4.0)), y
            z = torch.arange(6, dtype=torch.int64) if rank == 2 else torch.zeros(6, dtype=torch.int64)
            dist.broadcast(z, src=2, group=pair)  # a global rank, as torch takes it
            assert torch.equal(z, torch.arange(6, dtype=torch.int64)), z
        if rank in (1, 2):
            w = torch.full((5,), float(rank))
            dist.all_reduce(w, op=dist.ReduceOp.MAX, group=odd)
            assert torch.equal(w, torch.full((5,), 2.0)), w
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_tcp_rendezvous_and_subgroups_of_some_ranks(tmp_path):
    (tmp_path / "init.port").write_text(str(free_port()))
    run_world(tcp_worker, 3, tmp_path)
