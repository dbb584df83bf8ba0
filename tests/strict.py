"""Equality that also compares types, dict key order and tensors (dtype, shape, values): what "restored" means."""
import math


def differences(a, b, path="") -> list[str]:
    """Where a and b differ; [] when they are the same in type and value all the way down."""
    if type(a) is not type(b):
        return [f"{path}: {type(a).__name__} != {type(b).__name__}"]
    if type(a).__module__.startswith("torch") and hasattr(a, "dtype"):
        import torch
        same = (a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
                and torch.equal(a.detach(), b.detach()))
        return [] if same else [f"{path}: tensor {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)} or values"]
    if isinstance(a, dict):
        if list(a) != list(b):
            return [f"{path}: keys {list(a)} != {list(b)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float):
        same = (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
        return [] if same else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]
