"""A TorchvisionBackend image processor made to run without torchvision: `torch_resize_normalize(base)` is `base` with
the two methods that fail without it written in torch — `resize` (torchvision's interpolation mapping) as
torch.nn.functional.interpolate (bilinear, align_corners False, the antialias flag as given: torchvision's tensor
resize calls the same) and `normalize` (`tvF.normalize`) as (x − mean) / std per channel. Every crop plan, slice and
stack stays the real class's own code. Used for the processors that have no PIL twin (hpcmem.trace.vision_molmo2,
hpcmem.trace.vision_step3p7)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def torch_resize_normalize(base: type) -> type:
    """`base` (a TorchvisionBackend image processor class) with `resize` and `normalize` in torch (module docstring)."""
    import torch

    class TorchResizeNormalize(base):  # type: ignore[misc,valid-type]
        def resize(self, image: Any, size: Any, resample: Any = None, antialias: bool = True, **kwargs: Any) -> Any:
            out = torch.nn.functional.interpolate(image.float(), size=(size.height, size.width), mode="bilinear",
                                                  align_corners=False, antialias=antialias)
            return out if image.dtype.is_floating_point else out.round().clamp(0, 255).to(image.dtype)

        def normalize(self, image: Any, mean: Any, std: Any, inplace: bool = False, **kwargs: Any) -> Any:
            mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            std = torch.as_tensor(std, dtype=image.dtype, device=image.device).view(-1, 1, 1)
            return (image - mean) / std

    TorchResizeNormalize.__name__ = TorchResizeNormalize.__qualname__ = f"{base.__name__}Torch"
    return TorchResizeNormalize
