"""transformers' own torchvision-backed image processors, run where torchvision is not installed: the processor
module executed over an empty stand-in `torchvision.transforms.v2.functional` (its `_preprocess` calls none of it
directly), and the two TorchvisionBackend methods `_preprocess` calls, written in torch."""

from __future__ import annotations

import importlib.util
import sys
import types
from types import SimpleNamespace
from typing import Any


def real_image_processor_class(monkeypatch: Any, module: str, name: str) -> Any:
    """Class `name` of transformers module `module`, executed over the stand-in torchvision package, all of it in
    sys.modules for the calling test only (monkeypatch removes it at teardown)."""
    package = types.ModuleType("torchvision")
    transforms = types.ModuleType("torchvision.transforms")
    v2 = types.ModuleType("torchvision.transforms.v2")
    functional = types.ModuleType("torchvision.transforms.v2.functional")
    package.transforms, transforms.v2, v2.functional = transforms, v2, functional
    for key, stub in (("torchvision", package), ("torchvision.transforms", transforms),
                      ("torchvision.transforms.v2", v2), ("torchvision.transforms.v2.functional", functional)):
        monkeypatch.setitem(sys.modules, key, stub)
    spec = importlib.util.find_spec(module)
    loaded = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, loaded)       # its decorators read it back; removed at teardown
    spec.loader.exec_module(loaded)
    return getattr(loaded, name)


def torch_backend() -> SimpleNamespace:
    """The two TorchvisionBackend methods `_preprocess` calls, in torch: `pad` (image_processing_backends.py: right
    and bottom, `tvF.pad(images, (0, 0, pad_w, pad_h), fill=fill_value)`) and `rescale_and_normalize` (the fused
    (x · factor − mean) / std in fp32)."""
    import torch

    def pad(images, pad_size, fill_value=0, **kwargs):
        out = []
        for image in images:
            h, w = image.shape[-2:]
            out.append(torch.nn.functional.pad(image, (0, pad_size.width - w, 0, pad_size.height - h),
                                               value=fill_value))
        return out

    def rescale_and_normalize(image, do_rescale, rescale_factor, do_normalize, mean, std):
        mean = torch.tensor(mean).view(-1, 1, 1)
        std = torch.tensor(std).view(-1, 1, 1)
        return (image.float() * rescale_factor - mean) / std

    return SimpleNamespace(pad=pad, rescale_and_normalize=rescale_and_normalize)
