"""
torchrun support for evaluate and train: which process this is, its share of the work, and its device.

Under torchrun (RANK, WORLD_SIZE and LOCAL_RANK in the environment) `start()` joins the process group, NCCL
on CUDA and gloo on CPU, and gives each process its own GPU; run plainly, it is rank 0 of 1 and joins nothing.

    torchrun --nproc-per-node 2 -m arr_coc.evaluate --model tiny --synthetic 8 --out runs/eval
    python -m arr_coc.evaluate --model tiny --synthetic 8 --out runs/eval     # the same results, one process

When a worker fails, the others stop, at their next barrier or at torchrun's SIGTERM, with a line saying
so; whatever each has already written stays on disk, complete line by complete line.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence, TypeVar

if TYPE_CHECKING:  # torch loads in start(), after a command has checked its flags
    import torch

T = TypeVar("T")


def world_size() -> int:
    """How many processes torchrun started (1 without torchrun); read before torch loads, e.g. to check flags."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def default_device(device: str | None) -> str:
    """The device a command runs on: the user's --device, else cuda where a CUDA GPU is, else cpu (loads torch)."""
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class Process:
    rank: int  # this process's index among all processes, 0 .. world_size - 1
    world_size: int  # how many processes share the work (1 without torchrun)
    device: str  # where this process runs its model: "cuda:LOCAL_RANK" under torchrun on GPUs

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the reports and the checkpoint."""
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's items: every world_size-th one from its rank, so shards differ by at most one item."""
        return list(items[self.rank::self.world_size])

    def barrier(self) -> None:
        """Wait until every process gets here (a no-op alone); a worker that died on the way stops this one."""
        if self.distributed:
            import torch.distributed as dist

            try:
                dist.barrier()
            except RuntimeError:  # gloo's "connection closed by peer", which can come before torchrun's SIGTERM
                self.stop_for_failed_worker()

    def stop_for_failed_worker(self) -> None:
        """Exit with one clear line when another worker has failed (rather than a collective's traceback)."""
        self.log("stopping: another worker failed (its error is above); everything written so far is kept")
        sys.exit(1)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over all processes, as a new tensor (itself alone); via this device, as NCCL needs."""
        if not self.distributed:
            return tensor
        import torch.distributed as dist

        total = tensor.to(self.device, copy=True)
        dist.all_reduce(total)
        return total.to(tensor.device)

    def log(self, message: str) -> None:
        """A progress line on stderr, prefixed with the rank when there are several."""
        prefix = f"[rank {self.rank}] " if self.distributed else ""
        print(prefix + message, file=sys.stderr, flush=True)


def start(device: str | None = None) -> Process:
    """
    This process: alone, or joined to torchrun's group. `device` is the user's --device; under torchrun on
    CUDA each process takes cuda:LOCAL_RANK, and on CPU all take the CPU.
    """
    import torch

    device = default_device(device)
    if world_size() == 1:
        return Process(0, 1, device)
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    process = Process(rank, world_size(), device)
    signal.signal(signal.SIGTERM, lambda signum, frame: process.stop_for_failed_worker())  # torchrun's stop
    return process


def finish(process: Process) -> None:
    """Leave the process group (so NCCL does not warn at exit), all together: a gloo process that leaves while
    another still works can abort at exit ("terminate called without an active exception")."""
    if process.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

