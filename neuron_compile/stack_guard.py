"""Running an executable on a thread whose stack is too small for its kernels' stack temporaries.

A ``fused-rows`` chain keeps a block's temporaries on the stack (``memref.alloca``, sized at compile
time against the smallest thread stack the process had then: :func:`neuron_compile.target.
thread_stack_bytes`). A thread started later with a smaller stack (``threading.stack_size(128 *
1024)`` after the first compile) that calls the executable at one thread runs the loop body itself
and overflows its stack: a segmentation fault in the user's process (a softmax over rows of 30,000
floats keeps a 120 KB row on the stack). Before each call the executable compares the calling
thread's stack (``pthread_getattr_np``, cached per thread) with what its kernels need plus
:data:`HEADROOM` for the frames already on it (the thread's whole stack: what is left below the
caller is not known, so a caller deeper than that still overflows); when it is too small the call
runs on one worker thread with an 8 MB stack instead, at the caller's OpenMP thread count and grad /
inference mode, and returns the same tensors. The worker is recreated in a forked child.
"""
from __future__ import annotations

import ctypes
import os
import queue
import threading
from typing import Any, Callable

import torch

HEADROOM = 256 << 10         # the caller's frames above the kernel (Python, ctypes, the entry point;
                             # 10-15 KB at a model's usual depth, 130 KB under 80 nested modules)
WORKER_STACK = 8 << 20       # the worker's stack: more than any schedule's temporaries (<= 128 KB)

_local = threading.local()
_worker: tuple[threading.Thread, queue.Queue] | None = None
_worker_lock = threading.Lock()


class _Attr(ctypes.Structure):
    _fields_ = [("opaque", ctypes.c_char * 128)]   # pthread_attr_t: 56 bytes on glibc x86-64


def _thread_stack_bytes() -> int | None:
    """The calling thread's stack size in bytes (``pthread_getattr_np``), ``None`` if unknown."""
    try:
        libc = ctypes.CDLL(None)
        libc.pthread_self.restype = ctypes.c_ulong
        attr, addr, size = _Attr(), ctypes.c_void_p(), ctypes.c_size_t()
        if libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), ctypes.byref(attr)) != 0:
            return None
        try:
            if libc.pthread_attr_getstack(ctypes.byref(attr), ctypes.byref(addr), ctypes.byref(size)) != 0:
                return None
        finally:
            libc.pthread_attr_destroy(ctypes.byref(attr))
        return int(size.value)
    except (OSError, AttributeError):  # not glibc: nothing known, the call runs where it is
        return None


def stack_too_small(need: int) -> bool:
    """Whether the calling thread's stack cannot hold ``need`` bytes of kernel temporaries plus
    :data:`HEADROOM` (read once per thread; unknown sizes count as large enough)."""
    size = getattr(_local, "stack", 0)
    if size == 0:
        size = _local.stack = _thread_stack_bytes() or -1
    return 0 < size < need + HEADROOM


def _reset_after_fork() -> None:
    global _worker, _worker_lock
    _worker, _worker_lock = None, threading.Lock()   # the parent's worker does not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _serve(jobs: queue.Queue) -> None:
    from neuron_compile.kernel_runtime import set_thread_count
    torch.get_num_threads()   # torch's per-thread OpenMP set-up, once, before the first job's count
    while True:
        fn, threads, grad, inference, box, done = jobs.get()
        try:
            set_thread_count(threads)
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                box.append((True, fn()))
        except BaseException as exc:  # handed back to the caller, raised there
            box.append((False, exc))
        finally:
            done.set()
            fn = box = None   # the job's inputs and outputs are the caller's alone now


def run_on_large_stack(fn: Callable[[], Any]) -> Any:
    """``fn()`` run on the worker thread (:data:`WORKER_STACK`), at the caller's
    ``torch.get_num_threads()``, grad mode and inference mode; its result, or its exception raised
    here."""
    global _worker
    with _worker_lock:
        if _worker is None or not _worker[0].is_alive():
            jobs: queue.Queue = queue.Queue()
            old = threading.stack_size(WORKER_STACK)
            try:
                t = threading.Thread(target=_serve, args=(jobs,), name="neuron-large-stack", daemon=True)
                t.start()
            finally:
                threading.stack_size(old)
            _worker = (t, jobs)
        jobs = _worker[1]
    box: list = []
    done = threading.Event()
    jobs.put((fn, torch.get_num_threads(), torch.is_grad_enabled(), torch.is_inference_mode_enabled(), box, done))
    done.wait()
    ok, value = box.pop()
    if ok:
        return value
    raise value
