"""Run a function on several processes that form a gloo process group on 127.0.0.1.

Each rank runs ``fn(rank, world)`` in a fresh ``spawn``-ed process (``torch.multiprocessing``),
inside ``init_process_group("gloo", init_method="tcp://127.0.0.1:<free port>")`` with a bounded
collective timeout; the process group is always destroyed. :func:`run_ranks` returns each rank's
result or raises :class:`RanksFailed` with every rank's traceback; past ``timeout`` seconds every
rank still running is killed, so a test can never hang.
"""
from __future__ import annotations

import datetime
import queue as queue_mod
import socket
import time
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp


class RanksFailed(RuntimeError):
    """Some rank raised, died or ran out of time. ``errors`` maps rank → traceback or reason."""

    def __init__(self, errors: dict[int, str], elapsed: float):
        self.errors, self.elapsed = errors, elapsed
        super().__init__(f"{len(errors)} rank(s) failed after {elapsed:.1f} s:\n"
                         + "\n".join(f"--- rank {r} ---\n{e}" for r, e in sorted(errors.items())))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable[[int, int], Any], results, collective_timeout: float):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)  # two ranks on two cores
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=collective_timeout))
        try:
            results.put((rank, "ok", fn(rank, world)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(fn: Callable[[int, int], Any], world: int = 2, timeout: float = 240.0,
              collective_timeout: float = 60.0) -> list[Any]:
    """``[fn(0, world), ..., fn(world - 1, world)]``, each on its own process.

    Args:
        fn: a module-level function (it is pickled by reference); its result must be picklable.
        timeout: seconds for the whole run; ranks still alive then are killed.
        collective_timeout: gloo's timeout for one collective, seconds.
    Raises:
        RanksFailed: a rank raised, exited without a result, or the run timed out.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, results, collective_timeout), daemon=True)
             for r in range(world)]
    start = time.monotonic()
    for p in procs:
        p.start()
    got: dict[int, tuple[str, Any]] = {}
    try:
        while len(got) < world:
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                break
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
                got[rank] = (status, value)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if r not in got and not p.is_alive()]
                if dead and all(not p.is_alive() for r, p in enumerate(procs) if r not in got):
                    break  # every missing rank has exited without a result
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, timeout - (time.monotonic() - start))))
            if p.is_alive():
                p.kill()
                p.join()
    elapsed = time.monotonic() - start
    errors = {r: v for r, (s, v) in got.items() if s != "ok"}
    for r, p in enumerate(procs):
        if r not in got:
            errors[r] = (f"no result: exit code {p.exitcode}" if elapsed < timeout
                         else f"killed after the {timeout:.0f} s time bound")
    if errors:
        raise RanksFailed(errors, elapsed)
    return [got[r][1] for r in range(world)]
