"""lowcomm: compressed collective communication for training over WAN links.

`import lowcomm` registers the torch.distributed backend "lowcomm", so that

    import lowcomm
    torch.distributed.init_process_group("lowcomm")

works; `import lowcomm.torch` does the same (it is the module that registers it). Submodules:
`lowcomm.torch` (group options, per-call codecs, the DDP hook, error-feedback state),
`lowcomm.diloco`, `lowcomm.aqsgd`, `lowcomm.aqsgd_stages` (imported when used).
"""
from . import torch  # noqa: F401  (registers the backend; torch.distributed is imported by it)

__all__ = ["torch"]
