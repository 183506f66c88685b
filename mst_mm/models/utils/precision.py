"""The parts of the step that stay float32 under autocast (docs/method.md)."""
from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def float32_region(device: torch.device) -> Iterator[None]:
    """A block with autocast off on ``device``'s type: its operations run in their inputs'
    dtype, so inputs made at least float32 (:func:`at_least_float32`) stay so."""
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 if it is in a half type (float16, bfloat16); float64 stays float64."""
    return x.float() if x.is_floating_point() and x.element_size() < 4 else x
