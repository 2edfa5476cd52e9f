"""Data-parallel SFT over the local GPUs: torchrun starts the processes, PyTorch DDP syncs the gradients.

    sft.distributed: ddp            # configs: every visible GPU (sft.nproc to choose), one process each
    python -m torch.distributed.run --standalone --nproc_per_node 2 -m training.sft --base B --data D --out O

`training.sft.train` calls `launch(...)` when the settings ask for DDP on more than one process and this is not
already a torchrun worker: it runs `python -m training.sft` under torchrun and reads the result file rank 0
wrote. Inside a worker, `Context` says who we are; the loss of an optimizer step is computed as on one device
(each rank takes every world-th sample of the step, the loss is divided by the step's target tokens over all
ranks and scaled by the world size, because DDP averages gradients), so the step count, the sample order and
exact resume are the same as single-device training. Only rank 0 writes state, the model and the result.
CPU works too (gloo backend): that is how the tests run it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULT_FILE = "sft_result.json"  # an SFT run's result in its output folder: rank 0 writes it, `launch` reads it


@dataclass
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def in_worker() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies. torchrun starts each worker in a session of its own,
    so killing the command's process group (a SIGKILLed stage, a cancelled flow run) would otherwise leave the
    ranks training on, writing into the run's folder while a rerun resumes it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def setup() -> Context:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU) and pin this rank's GPU; a worker dies with the
    torchrun agent that started it (die_with_parent)."""
    if not in_worker():
        return Context()
    die_with_parent()
    import torch
    import torch.distributed as dist

    ctx = Context(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    if torch.cuda.is_available():
        torch.cuda.set_device(ctx.local_rank)  # "cuda" below means this rank's GPU
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return ctx


def teardown(ctx: Context) -> None:
    if ctx.active:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            _CPU_GROUP.clear()
            dist.destroy_process_group()


def exit_worker() -> None:
    """End a torchrun worker once its work is done and its group torn down, without the interpreter's shutdown.

    At that shutdown a rank sometimes died with SIGABRT (`terminate called without an active exception`, no Python
    frame: a C++ thread object destroyed while still joinable), after its result was written and its barrier
    passed; torchrun then failed the whole run (docs/LOG.md). Every file is closed by then, so the output is
    flushed and the process exits with status 0 at once. Outside a worker this does nothing."""
    if not in_worker():
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to keep
            pass
    os._exit(0)


def barrier(ctx: Context) -> None:
    if ctx.active:
        import torch.distributed as dist

        dist.barrier()


def global_sum(ctx: Context, value: int) -> int:
    return int(round(global_float(ctx, float(value)))) if ctx.active else value


_CPU_GROUP: list = []


def _cpu_group():
    """A gloo group for host-side counters: summing them over NCCL would make every rank wait for its GPU."""
    import torch.distributed as dist

    if not _CPU_GROUP:
        _CPU_GROUP.append(dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None)
    return _CPU_GROUP[0]


def global_float(ctx: Context, value: float) -> float:
    return global_floats(ctx, [value])[0] if ctx.active else value


def global_floats(ctx: Context, values: list[float]) -> list[float]:
    """Element-wise sums over the ranks, in one all-reduce on the host (gloo)."""
    if not ctx.active:
        return list(values)
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=_cpu_group())
    return t.tolist()


def gather(ctx: Context, obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank."""
    if not ctx.active:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * ctx.world
    dist.all_gather_object(out, obj, group=_cpu_group())
    return out


def balanced_share(idx: list[int], lengths: list[int], ctx: Context) -> list[int]:
    """This rank's part of a step's samples (dataset indices `idx`, token counts `lengths`), in step order. Every
    rank computes the same split. A sample starts on its home rank (index mod world), so across epochs each rank
    meets mostly the same samples and its caches (encodings, vision features) keep serving it. Then, while a rank
    holds no sample, it takes the smallest one of the rank holding the most; and while moving a sample from the
    most to the least loaded rank (or swapping it with a shorter one there, in steps of up to 128 samples) lowers the
    gap, the move nearest half the gap is made. With at least `world` samples every rank gets one."""
    if not ctx.active:
        return list(idx)
    w = ctx.world
    owner = [i % w for i in idx]
    load = [0] * w
    for j, r in enumerate(owner):
        load[r] += lengths[j]

    def move(j: int, to: int) -> None:
        load[owner[j]] -= lengths[j]
        owner[j], load[to] = to, load[to] + lengths[j]

    for r in range(w):
        counts = [owner.count(q) for q in range(w)]
        if counts[r] == 0 and max(counts) > 1:
            rich = max(range(w), key=lambda q: (counts[q], -q))
            move(min((j for j in range(len(idx)) if owner[j] == rich), key=lambda j: (lengths[j], j)), r)
    while True:
        hi = max(range(w), key=lambda q: (load[q], -q))
        lo = min(range(w), key=lambda q: (load[q], q))
        gap = load[hi] - load[lo]
        mine = [j for j in range(len(idx)) if owner[j] == hi]
        theirs = [j for j in range(len(idx)) if owner[j] == lo] if len(idx) <= 128 else []  # swaps: small steps
        # (d, j, k): move j (hi -> lo), or swap it with k (lo -> hi); d = how much of the gap it closes
        options = [(lengths[j], j, -1) for j in mine if len(mine) > 1]
        options += [(lengths[j] - lengths[k], j, k) for j in mine for k in theirs]
        options = [o for o in options if 0 < o[0] < gap]
        if not options:
            break
        _, j, k = min(options, key=lambda o: (abs(2 * o[0] - gap), o[1], o[2]))
        move(j, lo)
        if k >= 0:
            move(k, hi)
    return [idx[j] for j in range(len(idx)) if owner[j] == ctx.rank]


def nproc_for(s: Any) -> int:
    """Processes a DDP run starts: sft.nproc / rl.nproc, else every visible GPU (1 on a CPU-only box)."""
    if s.nproc:
        return int(s.nproc)
    import torch

    return max(1, torch.cuda.device_count())


def wants_launch(s: Any) -> bool:
    return s.distributed == "ddp" and not in_worker() and nproc_for(s) > 1


def torchrun(
    module: str,
    args: list[str],
    n: int,
    *,
    progress: bool,
    env: dict[str, str] | None = None,
    what: str = "DDP training",
) -> None:
    """`python -m <module> <args>` under torchrun, n processes on this machine; one clear error if it fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", "-m", module, *args]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        # a rank killed by a fatal signal (SIGABRT from a C++ abort, SIGSEGV) prints its Python stack
        "PYTHONFAULTHANDLER": os.environ.get("PYTHONFAULTHANDLER", "1"),
        **(env or {}),
    }
    r = subprocess.run(cmd, env=env, capture_output=not progress, text=True)
    if r.returncode != 0:
        detail = worker_failure(r.stderr or "") if not progress else ""
        raise RuntimeError(f"{what} ({n} processes) failed with exit code {r.returncode}: {detail}")


# the agent's log lines; the source path is printed as torch finds it (".venv/lib/.../torch/...", "/usr/lib/...")
_AGENT_LOG = re.compile(r"^[WEI]\d{4} [\d:.]+ +\d+ \S*torch/distributed/elastic/")


def worker_failure(stderr: str, limit: int = 2500) -> str:
    """What a failed torchrun printed, for the error: the ranks' own last words (a Python traceback, a C++
    `terminate called ...`, faulthandler's stack), which come before the agent's log lines, then the agent's
    root-cause block. The plain tail would be the agent's own traceback and report only."""
    lines = stderr.splitlines()
    cut = next((i for i, line in enumerate(lines) if _AGENT_LOG.match(line)), len(lines))
    ranks = "\n".join(lines[:cut]).strip()[-limit:]
    rest = "\n".join(lines[cut:])
    root = rest[rest.find("Root Cause") :] if "Root Cause" in rest else rest[-600:]
    return "\n".join(part for part in (ranks, root.strip()) if part)


def launch(base: str, data_files: str | Path, out: Path, s: Any, *, progress: bool) -> dict[str, Any]:
    """Run this training under torchrun (one process per GPU) and return rank 0's result."""
    settings = json.dumps({k: v for k, v in asdict(s).items()})
    torchrun(
        "training.sft",
        ["--base", str(base), "--data", str(data_files), "--out", str(out), "--settings", settings]
        + ([] if progress else ["--no-progress"]),
        nproc_for(s),
        progress=progress,
    )
    return json.loads((Path(out) / RESULT_FILE).read_text())


def ddp_wrap(fn, model, device):
    """`fn(model, *args, **kw)` as a module in PyTorch DDP, so DDP's hooks see the whole forward (backbone and the
    head the loss projects through): gradients all-reduced (averaged) across the torchrun ranks after each synced
    backward, overlapped with it in buckets. The SFT loss and the RL log-probs both go through it."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    class Call(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

        def forward(self, *args, **kw):
            return fn(self.model, *args, **kw)

    return DistributedDataParallel(
        Call(model), device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
    )  # grads live in the buckets: no copy, less memory
