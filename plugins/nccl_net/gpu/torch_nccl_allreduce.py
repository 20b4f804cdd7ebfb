#!/usr/bin/env python3
"""torch's "nccl" process group (torch's own NCCL) between processes on one GPU machine, for
checking the net plugin with an unchanged torch script (scripts/nccl_gpu.sh). One process per
rank, every rank on cuda:0; the caller sets a different NCCL_HOSTID per process and the plugin's
environment (NCCL_NET_PLUGIN, NCCL_NET, LOWCOMM_*).

    python torch_nccl_allreduce.py --rank R --world 2 --init-file /tmp/pg [--bytes 1M,16M,256M]
                                   [--iters 5] [--dtype fp32|bf16]

Inputs are small integers so sums are exact; results are checked element by element. Rank 0
prints one JSON line per size, as nccl_net_allreduce does.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist


def parse_bytes(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--init-file", required=True)
    ap.add_argument("--bytes", default="1M,16M,256M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{args.init_file}", rank=args.rank,
                            world_size=args.world, device_id=torch.device("cuda:0"))
    failures = 0
    for nbytes in (parse_bytes(b) for b in args.bytes.split(",")):
        n = nbytes // torch.finfo(dtype).bits * 8
        pattern = (torch.arange(n, device="cuda") % 7).to(dtype)
        times = []
        for it in range(args.iters + 1):
            t = pattern + (args.rank + 1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            torch.cuda.synchronize()
            if it:
                times.append(time.perf_counter() - t0)
        want = pattern * args.world + args.world * (args.world + 1) // 2
        wrong = int((t != want).sum().item())
        failures += wrong > 0
        s = statistics.median(times)
        algbw = nbytes / s / 1e9
        if args.rank == 0:
            print(json.dumps({"torch": torch.__version__,
                              "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
                              "dtype": args.dtype, "bytes": nbytes, "ranks": args.world,
                              "seconds": round(s, 6), "algbw_GBps": round(algbw, 4),
                              "busbw_GBps": round(algbw * 2 * (args.world - 1) / args.world, 4),
                              "wrong_elements": wrong}), flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
