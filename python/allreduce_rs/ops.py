"""allreduce_rs's calls as torch custom operators, so ``torch.compile(fn, fullgraph=True)`` traces them.

Dynamo cannot trace a method call on a :class:`~allreduce_rs.Communicator` (an extension type), so an operator
names its communicator by a *group*: a string registered here, which a compiled graph holds as a constant::

    import allreduce_rs.ops                              # imports torch; `import allreduce_rs` alone does not
    group = allreduce_rs.ops.register(comm)              # "comm0", or register(comm, "tp")
    y = allreduce_rs.ops.all_reduce(x, group)            # torch.ops.allreduce_rs.all_reduce(x, group)

The operators (namespace ``allreduce_rs``), each with a fake (meta) implementation for tracing:

    all_reduce(Tensor x, str group, Tensor? bias=None) -> Tensor                  the sum in a new tensor
    all_reduce_(Tensor(a!) x, str group, Tensor? bias=None) -> ()                 the sum in x
    all_reduce_out(Tensor x, str group, Tensor(a!) out, Tensor? bias=None) -> ()  the sum in out (x's shape)

A ``bias`` (x's shape and dtype, the same values on every rank) is added to every sum after the ranks' inputs,
inside the kernel (car's ``z``): what a row-parallel Linear's bias needs, with no second kernel.
    reduce_scatter(Tensor x, str group, bool split_last_dim=False) -> Tensor
    all_reduce_add_rms_norm(Tensor x, str group, Tensor(a2!) residual, Tensor weight, float eps) -> Tensor

``all_reduce_add_rms_norm`` is the epilogue serving stacks fuse after a row-parallel layer: ``residual += sum of x``
(in place), then RMSNorm of every row of ``weight.numel()`` elements into a new tensor, with the same bits whichever
design runs it (fused in car's kernels, or the allreduce and then a norm kernel).

The functions of this module call the operators; called eagerly on plain tensors (no tracing, compiling, mode,
transform, profiler or gradient in play) they run the operators' implementation directly, without torch's
dispatcher, whose call of a Python kernel adds about 2 us per call (``torch.ops.allreduce_rs.*`` called directly
still pays it). Compiled graphs hold the operators.

They run the communicator's calls (bfloat16, float16 or float32 tensors of its device; on a GPU, on torch's current
stream), and are collective like them: every rank runs the same operators in the same order. A graph that torch
compiles the same way on every rank keeps that order. Tensors of any layout are taken: one that is not contiguous
goes through a contiguous copy, since the kernels read and write one dense range. They have no autograd formula
(serving runs without gradients): a backward pass through one raises.

Several communicators per process (one per group of ranks, as car's comm_idx) are registered under their own names
and may be used alternately, in one graph too; each name keeps its communicator alive until :func:`unregister`. Each
communicator of a process needs its own job id: ``from_env`` takes the launcher's for one, and any other is built
with ``Communicator(rank, world_size, local_rank, job_id)`` and an id its ranks agree on.
"""

import itertools
from typing import Dict, List, Optional

import torch

from ._native import Communicator
from .errors import ArgumentError

_GROUPS: Dict[str, Communicator] = {}
_NEXT_INDEX = itertools.count()


def register(comm: Communicator, name: Optional[str] = None) -> str:
    """Makes ``comm`` the communicator of group ``name`` (default: the next free ``comm0``, ``comm1``, ...) and
    returns the name. Registering the same communicator under the same name again returns it unchanged.

    Names are per process: a rank's compiled graphs look them up in its own registry, so ranks that register their
    communicators in the same order get the same default names, but need not.

    Raises:
        ArgumentError: ``comm`` is no Communicator, or ``name`` is empty or already names another communicator.
    """
    if not isinstance(comm, Communicator):
        raise ArgumentError(f"register: a {type(comm).__name__} is not an allreduce_rs.Communicator")
    if name is None:
        name = next(n for n in (f"comm{i}" for i in _NEXT_INDEX) if n not in _GROUPS)
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"register: the group name {name!r} is not a non-empty string")
    held = _GROUPS.setdefault(name, comm)
    if held is not comm:
        raise ArgumentError(f"register: group {name!r} already names another communicator; unregister it first")
    return name


def unregister(group: str) -> Communicator:
    """Forgets group ``group`` (a graph compiled with it raises at its next call) and returns its communicator,
    which stays open: close it yourself.

    Raises:
        ArgumentError: no communicator is registered under ``group``.
    """
    communicator(group)
    return _GROUPS.pop(group)


def communicator(group: str) -> Communicator:
    """The communicator registered as ``group``.

    Raises:
        ArgumentError: no communicator is registered under ``group``.
    """
    comm = _GROUPS.get(group)
    if comm is None:
        raise ArgumentError(
            f"group {group!r}: no communicator is registered under this name (registered: {sorted(_GROUPS)}); "
            "allreduce_rs.ops.register(comm, name) registers one"
        )
    return comm


def _check_out(x: torch.Tensor, out: torch.Tensor) -> None:
    if out.shape != x.shape:
        raise ArgumentError(f"all_reduce_out: out has shape {list(out.shape)}, x has {list(x.shape)}: they must match")


def _sum_into(comm: Communicator, x: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    """Sums ``x`` over every rank into ``out`` (the same shape; the same tensor for in place), plus ``bias``."""
    dense = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
    comm.all_reduce(x.contiguous(), out=dense, bias=None if bias is None else bias.contiguous())
    if dense is not out:
        out.copy_(dense)


def _shard_shape(x: torch.Tensor, world: int, split_last_dim: bool) -> List[int]:
    """The shape of a rank's reduce-scatter shard of ``x``: its first (or last) dimension divided by ``world``."""
    dim = x.dim() - 1 if split_last_dim else 0
    which = "last" if split_last_dim else "first"
    if x.dim() == 0 or x.shape[dim] % world != 0:
        raise ArgumentError(
            f"reduce_scatter: x of shape {list(x.shape)} has no {which} dimension divisible by the world size {world}"
        )
    shape = list(x.shape)
    shape[dim] //= world
    return shape


def _all_reduce(x: torch.Tensor, group: str, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    out = x.new_empty(x.shape)
    _sum_into(communicator(group), x, out, bias)
    return out


def _all_reduce_fake(x: torch.Tensor, group: str, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    # Every fake implementation looks its group up, so an unknown name is refused while tracing, before any rank runs.
    communicator(group)
    return x.new_empty(x.shape)


def _all_reduce_inplace(x: torch.Tensor, group: str, bias: Optional[torch.Tensor] = None) -> None:
    _sum_into(communicator(group), x, x, bias)


def _all_reduce_inplace_fake(x: torch.Tensor, group: str, bias: Optional[torch.Tensor] = None) -> None:
    communicator(group)


def _all_reduce_out(x: torch.Tensor, group: str, out: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
    _check_out(x, out)
    _sum_into(communicator(group), x, out, bias)


def _all_reduce_out_fake(x: torch.Tensor, group: str, out: torch.Tensor, bias: Optional[torch.Tensor] = None) -> None:
    communicator(group)
    _check_out(x, out)


def _reduce_scatter(x: torch.Tensor, group: str, split_last_dim: bool = False) -> torch.Tensor:
    comm = communicator(group)
    world = comm.world_size
    out = x.new_empty(_shard_shape(x, world, split_last_dim))
    comm.reduce_scatter(x.contiguous(), out, split_last_dim=split_last_dim)
    return out


def _reduce_scatter_fake(x: torch.Tensor, group: str, split_last_dim: bool = False) -> torch.Tensor:
    return x.new_empty(_shard_shape(x, communicator(group).world_size, split_last_dim))


def _norm_shapes(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ArgumentError(
            f"all_reduce_add_rms_norm: residual {list(residual.shape)} {residual.dtype} is not x's "
            f"{list(x.shape)} {x.dtype}"
        )
    if x.dim() == 0 or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ArgumentError(
            f"all_reduce_add_rms_norm: weight {list(weight.shape)} is not one row of x {list(x.shape)}"
        )


def _all_reduce_add_rms_norm(
    x: torch.Tensor, group: str, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    comm = communicator(group)
    _norm_shapes(x, residual, weight)
    out = x.new_empty(x.shape)
    dense = residual if residual.is_contiguous() else residual.contiguous()
    comm.all_reduce_add_rms_norm(x.contiguous(), dense, weight.contiguous(), eps, out=out)
    if dense is not residual:
        residual.copy_(dense)
    return out


def _all_reduce_add_rms_norm_fake(
    x: torch.Tensor, group: str, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    communicator(group)
    _norm_shapes(x, residual, weight)
    return x.new_empty(x.shape)


# Defined through torch.library.Library rather than the custom_op decorator: the decorator's Python dispatch adds
# about 30 us to every eager call (measured on the H200: results/h200-mps/call-path), the direct kernels next to
# nothing. One kernel for every device (CompositeExplicitAutograd): the communicator's driver decides which it takes.
_LIB = torch.library.Library("allreduce_rs", "DEF")
for _schema, _impl, _fake in [
    ("all_reduce(Tensor x, str group, Tensor? bias=None) -> Tensor", _all_reduce, _all_reduce_fake),
    ("all_reduce_(Tensor(a0!) x, str group, Tensor? bias=None) -> ()", _all_reduce_inplace, _all_reduce_inplace_fake),
    (
        "all_reduce_out(Tensor x, str group, Tensor(a2!) out, Tensor? bias=None) -> ()",
        _all_reduce_out,
        _all_reduce_out_fake,
    ),
    ("reduce_scatter(Tensor x, str group, bool split_last_dim=False) -> Tensor", _reduce_scatter, _reduce_scatter_fake),
    (
        "all_reduce_add_rms_norm(Tensor x, str group, Tensor(a2!) residual, Tensor weight, float eps) -> Tensor",
        _all_reduce_add_rms_norm,
        _all_reduce_add_rms_norm_fake,
    ),
]:
    _name = _schema.split("(")[0]
    _LIB.define(_schema)
    _LIB.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"allreduce_rs::{_name}", _fake, lib=_LIB)


# What _undispatched asks on every eager call, looked up once (each lookup costs as much as the check).
_MODES = (
    torch.compiler.is_compiling,
    torch._C._len_torch_dispatch_stack,
    torch._C._len_torch_function_stack,
    torch._C._are_functorch_transforms_active,
    torch._C._autograd._profiler_enabled,
)
_GRAD_ENABLED = torch.is_grad_enabled
_TENSOR = torch.Tensor


def _undispatched(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether an eager call may run its implementation without going through torch's dispatcher, which adds about
    2 us per call for a kernel written in Python (results/h200-mps/call-path): only plain tensors,
    outside tracing, compiling, dispatch and function modes (FakeTensor, make_fx, torch.set_default_device ...),
    functorch transforms and the profiler (which records the operator by name), and with no gradient asked for (the
    operators have no autograd formula, and the dispatcher says so). Then the operator would run the same
    implementation on the same tensors: same bits, same refusals."""
    for active in _MODES:
        if active():
            return False
    grad = _GRAD_ENABLED()
    for t in tensors:
        if t is not None and (type(t) is not _TENSOR or (grad and t.requires_grad)):
            return False
    return True


_OPS = torch.ops.allreduce_rs


def all_reduce(x: torch.Tensor, group: str, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The sum of ``x`` over every rank of ``group``'s communicator, in a new contiguous tensor
    (``torch.ops.allreduce_rs.all_reduce``; eager calls on plain tensors skip the dispatcher, see the module)."""
    if _undispatched(x, bias):
        return _all_reduce(x, group, bias)
    return _OPS.all_reduce.default(x, group, bias)


def all_reduce_(x: torch.Tensor, group: str, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Sums ``x`` over every rank in place and returns it (``torch.ops.allreduce_rs.all_reduce_``)."""
    if _undispatched(x, bias):
        _all_reduce_inplace(x, group, bias)
    else:
        _OPS.all_reduce_.default(x, group, bias)
    return x


def all_reduce_out(x: torch.Tensor, group: str, out: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Writes the sum of ``x`` over every rank into ``out`` (x's shape and dtype, memory disjoint from x's) and
    returns it (``torch.ops.allreduce_rs.all_reduce_out``)."""
    if _undispatched(x, out, bias):
        _all_reduce_out(x, group, out, bias)
    else:
        _OPS.all_reduce_out.default(x, group, out, bias)
    return out


def reduce_scatter(x: torch.Tensor, group: str, split_last_dim: bool = False) -> torch.Tensor:
    """Rank r's shard of the sum of ``x`` over every rank (``torch.ops.allreduce_rs.reduce_scatter``).

    By default ``x``'s first dimension is split: a shape ``[d0, ...]`` with ``d0`` divisible by the world size ``W``
    gives rank r the rows ``[r * d0 / W, (r + 1) * d0 / W)``, shape ``[d0 / W, ...]``, with no copy of a
    contiguous ``x``. With ``split_last_dim`` the last dimension is split: ``[..., N]`` with ``N`` divisible by
    ``W`` gives rank r the columns ``[r * N / W, (r + 1) * N / W)``, shape ``[..., N / W]`` (as a column-parallel
    layer's output is split), gathered densely inside the kernel.

    Raises:
        ArgumentError: the dimension to split does not divide by the world size (or ``x`` is 0-dimensional).
    """
    if _undispatched(x):
        return _reduce_scatter(x, group, split_last_dim)
    return _OPS.reduce_scatter.default(x, group, split_last_dim)


def all_reduce_add_rms_norm(
    x: torch.Tensor, group: str, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """``residual += sum of x over every rank`` (in place), then returns the RMSNorm of every row of ``residual``
    (``residual / sqrt(mean(residual**2, -1) + eps) * weight``) in a new tensor
    (``torch.ops.allreduce_rs.all_reduce_add_rms_norm``).

    Raises:
        ArgumentError: ``residual`` is not ``x``'s shape and dtype, or ``weight`` not one row of ``x``.
    """
    if _undispatched(x, residual, weight):
        return _all_reduce_add_rms_norm(x, group, residual, weight, eps)
    return _OPS.all_reduce_add_rms_norm.default(x, group, residual, weight, eps)


__all__ = [
    "register",
    "unregister",
    "communicator",
    "all_reduce",
    "all_reduce_",
    "all_reduce_out",
    "reduce_scatter",
    "all_reduce_add_rms_norm",
]
