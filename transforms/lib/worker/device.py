"""Where the numeric core runs on this worker: "cpu" (numpy) or a torch CUDA device."""
from __future__ import annotations

import glob

# what --device (and the Python API's device=) accepts
DEVICES = ("auto", "cpu", "cuda")


def resolve_device(requested: str) -> str:
    """The core's device for this worker (called in DoFn.setup): "cpu" (numpy) or a torch device.

    "auto" imports torch only where an NVIDIA device node exists: a CPU worker never pays for torch.
    """
    if requested == "auto":
        return "cuda" if _has_nvidia_device() and _torch_sees_cuda() else "cpu"
    if requested.startswith("cuda") and not _torch_sees_cuda():
        raise RuntimeError("--device cuda was requested but this worker has no CUDA device")
    return requested


def _has_nvidia_device() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def _torch_sees_cuda() -> bool:
    import torch
    return torch.cuda.is_available()
