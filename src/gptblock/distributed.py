"""The few pieces of ``torch.distributed`` the trainer needs: without ``torchrun`` every helper
is a no-op for one process, so the trainer has a single code path."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import UserValueError

__all__ = ["DistInfo", "all_gather_rows", "all_reduce_sum", "comm_device", "dist_info"]
__all__ += ["finish_distributed", "init_distributed"]


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the run."""

    rank: int = 0  # global index of this process, 0 .. world_size - 1
    world_size: int = 1  # number of processes
    local_rank: int = 0  # index on this machine: picks the GPU

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes files and prints progress."""
        return self.rank == 0


def dist_info() -> DistInfo:
    """The current process group's view of this process; one process if none is set up."""
    if not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


def init_distributed(device: str) -> tuple[DistInfo, str]:
    """Join the process group torchrun describes (gloo on the CPU, nccl on CUDA), if any;
    return it and this process's device (``cuda:LOCAL_RANK``: one GPU per process).

    Example:
        >>> init_distributed("cpu")  # not under torchrun: one process, nothing to join
        (DistInfo(rank=0, world_size=1, local_rank=0), 'cpu')
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist_info(), device
    if not dist.is_available():
        raise RuntimeError("this PyTorch build has no torch.distributed; run one process")
    local_rank = int(os.environ["LOCAL_RANK"])
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device == "cpu":
        backend = "gloo"
    else:
        raise UserValueError(f"distributed training needs device 'cpu' or 'cuda', got {device!r}")
    dist.init_process_group(backend=backend)
    return dist_info(), device


def finish_distributed(wait: bool = True) -> None:
    """Leave the process group, if joined; with ``wait``, once every process gets here (one
    leaving early makes gloo abort the others; not on an error path, where some never come)."""
    if dist.is_available() and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``t`` over all processes (``t`` itself when run alone)."""
    if dist_info().world_size > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_rows(t: torch.Tensor) -> list[torch.Tensor]:
    """Every process's ``t`` (same shape and dtype, on a device the backend sends), by rank."""
    world = dist_info().world_size
    if world == 1:
        return [t]
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous())
    return out


def comm_device(device: torch.device) -> torch.device:
    """Where tensors must be for a collective: CUDA for nccl, else the CPU (gloo, or alone)."""
    if device.type == "cuda" and dist_info().world_size > 1:
        return device
    return torch.device("cpu")
