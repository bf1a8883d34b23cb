"""Per-graph IR dumps (``NEURON_DUMP_DIR`` / ``options={"dump_dir": ...}``).

Layout: ``<dump_dir>/<graph>/<NN>.<phase>.<ext>`` numbered in the order written (``00.fx.txt``,
``01.fx.dce.txt``, ``02.fx-opt.txt``, ``03.linalg.mlir``, ``04.llvm.mlir``, ``05.obj.ll``), the
tools' work files under ``work/`` (what a reproduce command points at), ``key.txt`` with the cache
key parts and a runnable ``repro.py`` that compiles the FX graph and compares it with eager. When
dumping is off the :class:`Dumper` does nothing, so call sites need no ``if``.
"""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import torch

from neuron_compile.errors import NeuronCompileError


class Dumper:
    """Writes numbered per-phase files for one graph; a no-op when ``root`` is ``None``.

    Raises:
        NeuronCompileError: ``root`` cannot be used as a directory.
    """

    def __init__(self, root: str | None, graph_name: str):
        self.dir = Path(root) / graph_name if root else None
        self._n = itertools.count()
        if self.dir is not None:
            try:
                (self.dir / "work").mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise NeuronCompileError(
                    f"cannot create the dump directory {self.dir} ({exc}); set NEURON_DUMP_DIR / "
                    "options={'dump_dir': ...} to a writable directory") from None

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    @property
    def workdir(self) -> Path | None:
        return self.dir / "work" if self.dir is not None else None

    def write(self, phase: str, ext: str, text: str) -> Path | None:
        if self.dir is None:
            return None
        path = self.dir / f"{next(self._n):02d}.{phase}.{ext}"
        path.write_text(text)
        return path

    def copy(self, phase: str, src: Path) -> Path | None:
        """A numbered copy of a tool's work file (``kernel.llvm.mlir`` → ``NN.llvm.mlir``)."""
        if self.dir is None:
            return None
        path = self.dir / f"{next(self._n):02d}.{phase}{''.join(src.suffixes[-1:])}"
        shutil.copyfile(src, path)
        return path

    def fx(self, phase: str, gm: torch.fx.GraphModule) -> Path | None:
        if self.dir is None:
            return None
        return self.write(phase, "txt", gm.print_readable(print_output=False, include_stride=True,
                                                         include_device=False))

    def partition(self, gm: torch.fx.GraphModule) -> None:
        """The kernel partition of the fusion pass, as text and as a Graphviz DOT picture."""
        if self.dir is None:
            return
        from neuron_compile.passes.analysis import partition_dot, partition_text
        kernel_of = {n: n.meta["neuron_kernel"] for n in gm.graph.nodes if "neuron_kernel" in n.meta}
        if kernel_of:
            self.write("partition", "txt", partition_text(gm, kernel_of))
            self.write("partition", "dot", partition_dot(gm, kernel_of))

    def key(self, digest: str, explanation: str) -> None:
        if self.dir is not None:
            (self.dir / "key.txt").write_text(explanation + "\n")

    def repro(self, gm: torch.fx.GraphModule) -> Path | None:
        """A script that rebuilds inputs from the metadata, compiles the graph and compares with eager
        (run it; or import it for ``Repro`` (the graph, eager) and ``example_args()``)."""
        if self.dir is None:
            return None
        specs = [(tuple(n.meta["val"].shape), tuple(n.meta["val"].stride()), str(n.meta["val"].dtype))
                 for n in gm.graph.nodes if n.op == "placeholder"]
        constants = {n.target: getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
        torch.save(constants, self.dir / "repro_constants.pt")
        body = "\n".join("    " + ln for ln in gm.code.splitlines())
        text = f'''"""Repro of one neuron-compile graph: python {self.dir / "repro.py"}"""
import torch
from torch import device  # noqa: F401  (printed graph code may name it)
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.compiler import compile_graph
from neuron_compile.config import Config

inf, nan = float("inf"), float("nan")


class Repro(torch.nn.Module):
    def __init__(self):
        super().__init__()
        here = __import__("pathlib").Path(__file__).parent
        for name, value in torch.load(here / "repro_constants.pt", weights_only=True).items():
            self.register_buffer(name, value)

{body}


def make(shape, stride, dtype):
    dtype = eval(dtype)
    t = torch.empty_strided(shape, stride, dtype=dtype)
    return t.normal_() if dtype.is_floating_point else t.random_(0, 2)


def example_args():
    """Inputs of the graph's shapes, strides and dtypes (the order of its placeholders)."""
    torch.manual_seed(0)
    return [make(*s) for s in {specs!r}]


def main():
    args = example_args()
    torch.manual_seed(0)  # random ops (dropout) draw the same numbers in both runs
    expected = Repro()(*args)
    exe = compile_graph(make_fx(Repro(), tracing_mode="fake")(*args), Config(cache=False))
    torch.manual_seed(0)
    got = exe(list(args))
    bad = 0
    for i, (g, e) in enumerate(zip(got, expected if isinstance(expected, (list, tuple)) else [expected])):
        if isinstance(e, torch.Tensor):
            ok = torch.allclose(g.double(), e.double(), rtol=1e-4, atol=1e-5, equal_nan=True)
            bad += not ok
            print(f"output {{i}}: {{'ok' if ok else 'MISMATCH'}} {{tuple(e.shape)}} {{e.dtype}}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
'''
        path = self.dir / "repro.py"
        path.write_text(text)
        return path
