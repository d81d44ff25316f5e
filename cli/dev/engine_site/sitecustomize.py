"""Start-up shim of a vLLM engine serving a vision model (on its PYTHONPATH only, with the
torchvision wheel of ``.engine-vl``; titoflow's own environment never imports it).

Qwen-VL's processor needs torchvision, and the registry's torchvision wheel is built for CUDA: its
``_C`` extension does not load beside torch's CPU build, so the ``torchvision::*`` operators it
would define never exist, and ``torchvision._meta_registrations`` then fails on the two it
registers fake kernels for without checking (``nms``, ``qnms``: "operator torchvision::nms does
not exist"). Image processing uses only torchvision's pure-torch transforms, never these
operators, so defining their schemas (no kernels: calling one raises) is all the import needs.

Invariant: nothing happens unless and until the process imports torchvision; the schemas are
defined once, just before that import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Any

# The two schemas exactly as the torchvision 0.28.0 wheel's _C.so declares them.
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_libraries: list[Any] = []  # a torch Library undefines its operators when collected


class _DefineTorchvisionOps(importlib.abc.MetaPathFinder):
    """Defines the operators on the first import of torchvision, then steps aside."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torchvision":
            sys.meta_path.remove(self)
            torch: Any = importlib.import_module("torch")  # the engine environment's torch
            library = torch.library.Library("torchvision", "FRAGMENT")
            for schema in SCHEMAS:
                library.define(schema)
            _libraries.append(library)
        return None  # the import itself proceeds as usual


sys.meta_path.insert(0, _DefineTorchvisionOps())
