"""A stand-in for the few parts of torch the communicator reads (``Tensor`` with ``dtype``, ``is_cuda``, ``is_cpu``,
``get_device()``, ``device.type``, ``is_contiguous()``, ``stride()``, ``numel()``, ``data_ptr()``; the dtypes;
``torch._C._cuda_getCurrentRawStream``), over numpy arrays that may claim any device: CI has no GPU, and this lets it
check the torch path's refusals of tensors on other devices. Real torch's CPU tensors run in torch_jobs.py, its GPU
tensors in scripts/gpu_python.sh."""

import sys
import types

import ml_dtypes
import numpy as np


class dtype:
    def __init__(self, name, np_dtype):
        self.name, self.np_dtype = name, np.dtype(np_dtype)

    def __repr__(self):
        return f"torch.{self.name}"


bfloat16 = dtype("bfloat16", ml_dtypes.bfloat16)
float16 = dtype("float16", np.float16)
float32 = dtype("float32", np.float32)
float64 = dtype("float64", np.float64)
_DTYPES = [bfloat16, float16, float32, float64]


class device:
    def __init__(self, type, index=None):
        self.type, self.index = type, index


class Tensor:
    """A numpy array claiming to live on ``device``."""

    def __init__(self, array, device_type="cpu", index=None):
        self.array = array
        self.device = device(device_type, index)

    @property
    def dtype(self):
        return next(d for d in _DTYPES if d.np_dtype == self.array.dtype)

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    @property
    def is_cpu(self):
        return self.device.type == "cpu"

    def get_device(self):
        return -1 if self.device.type == "cpu" else self.device.index

    def is_contiguous(self):
        return self.array.flags.c_contiguous

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def numel(self):
        return self.array.size

    def data_ptr(self):
        return self.array.__array_interface__["data"][0]


_C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda index: 0)
cuda = types.SimpleNamespace(current_stream=lambda index=None: types.SimpleNamespace(cuda_stream=0))


def install():
    """Makes ``import torch`` (and the communicator's lookup of sys.modules["torch"]) find this module."""
    sys.modules["torch"] = sys.modules[__name__]
