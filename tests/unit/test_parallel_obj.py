"""The ``obj`` phase split into modules compiled by parallel processes (``compile_jobs``): the
library links and computes what eager PyTorch computes, whatever the number of processes."""
from __future__ import annotations

import pytest
import torch

from neuron_compile.config import resolve_config
from neuron_compile.errors import NeuronCompileError


def _model(x, w):
    # two GEMMs and a row reduction: several parallel loops, i.e. several LLVM functions to split
    h = torch.nn.functional.gelu(x @ w)
    return (h @ w.t()).softmax(-1)


@pytest.mark.parametrize("jobs", [1, 3])
def test_split_compile_matches_float64_eager(jobs, monkeypatch):
    from neuron_compile import target
    monkeypatch.setattr(target, "SPLIT_MIN_BYTES", 0)  # split even this small graph
    torch.manual_seed(0)
    x, w = torch.randn(64, 48), torch.randn(48, 40)
    torch._dynamo.reset()
    got = torch.compile(_model, backend="neuron", dynamic=False, options={"compile_jobs": jobs})(x, w)
    want = _model(x.double(), w.double())
    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-5)


def test_objects_are_split_by_function(tmp_path, monkeypatch):
    """``llvm-split`` gives one module per part; every part becomes an object that is linked."""
    from neuron_compile import target
    from neuron_compile.target import HostCPU
    monkeypatch.setattr(target, "SPLIT_MIN_BYTES", 0)
    ll = tmp_path / "kernel.ll"
    ll.write_text("".join(f"define i32 @f{i}(i32 %x) {{\n  %y = add i32 %x, {i}\n  ret i32 %y\n}}\n"
                          for i in range(5)))
    objs = HostCPU.detect()._objects(ll, tmp_path, 2, 120, jobs=2)
    assert len(objs) == 5 and all(o.stat().st_size > 0 for o in objs)
    assert len(HostCPU.detect()._objects(ll, tmp_path, 2, 120, jobs=1)) == 1
    monkeypatch.setattr(target, "SPLIT_MIN_BYTES", ll.stat().st_size + 1)  # small: one module
    assert len(HostCPU.detect()._objects(ll, tmp_path, 2, 120, jobs=2)) == 1


def test_negative_compile_jobs_is_refused():
    with pytest.raises(NeuronCompileError, match="compile_jobs"):
        resolve_config({"compile_jobs": -1}, environ={})


def test_the_graph_functions_loops_are_extracted_and_stay_out_of_line(tmp_path):
    """Big modules: each top-level loop becomes a ``noinline`` function (``opt -O3`` on one function
    holding every kernel was quadratic), and ``-O3`` does not inline them back."""
    import re
    import subprocess

    from neuron_compile.target import _extract_loops
    from neuron_compile.toolchain import tool
    body = "".join(_LOOP.format(i=i, j=i + 1, v=f"{i}.0") for i in range(3))
    ll = tmp_path / "kernel.ll"
    ll.write_text(f"define void @neuron_kernel(ptr %a) {{\nb0:\n{body}  ret void\n}}\n")
    out = _extract_loops(ll, tmp_path, 120)
    text = out.read_text()
    assert len(re.findall(r"^define internal .* noinline", text, re.M)) == 3
    opt = subprocess.run([tool("opt"), "-O3", "-S", str(out)], capture_output=True, text=True, check=True).stdout
    assert len(re.findall(r"^define ", opt, re.M)) == 4


# a loop storing {v} to a[0..100), from block b{i} to b{j}
_LOOP = ("  br label %h{i}\nh{i}:\n  %i{i} = phi i64 [0, %b{i}], [%n{i}, %h{i}]\n"
         "  %p{i} = getelementptr float, ptr %a, i64 %i{i}\n  store float {v}, ptr %p{i}\n"
         "  %n{i} = add i64 %i{i}, 1\n  %c{i} = icmp ult i64 %n{i}, 100\n  br i1 %c{i}, label %h{i}, label %b{j}\n"
         "b{j}:\n")


def test_identical_extracted_loops_are_compiled_once(tmp_path):
    """The same kernel once per layer: after extraction, identical loop functions are merged
    (``mergefunc``), so one body reaches ``opt``/``llc`` (end-to-end results: the model tests)."""
    import re

    from neuron_compile.target import _extract_loops
    body = "".join(_LOOP.format(i=i, j=i + 1, v="1.0" if i < 2 else "2.0") for i in range(3))
    ll = tmp_path / "kernel.ll"
    ll.write_text(f"define void @neuron_kernel(ptr %a) {{\nb0:\n{body}  ret void\n}}\n")
    text = _extract_loops(ll, tmp_path, 120).read_text()
    bodies = re.findall(r"^define internal [^\n]*\{\n(.*?)^\}", text, re.M | re.S)
    stores = [b for b in bodies if "store float" in b]
    assert len(stores) == 2  # the two loops storing 1.0 became one, the 2.0 loop stays
    assert {"1.000000e+00" in b for b in stores} == {True, False}


def test_the_graph_function_is_inlined_into_its_c_wrapper_before_the_split(tmp_path):
    """The emitter makes the graph's function internal and ``alwaysinline``; extraction inlines it
    into ``_mlir_ciface_neuron_kernel`` (its one caller), so no part keeps a call passing every
    memref unpacked (llc took 4.7 s on that call in ResNet-18's forward graph), and the loops
    extracted from the wrapper do not inherit ``alwaysinline`` beside their ``noinline``."""
    import re

    from neuron_compile.lowering.emit import GRAPH_FUNCTION_ATTRS
    from neuron_compile.target import _extract_loops
    assert "#llvm.linkage<internal>" in GRAPH_FUNCTION_ATTRS and '"alwaysinline"' in GRAPH_FUNCTION_ATTRS
    body = "".join(_LOOP.format(i=i, j=i + 1, v=f"{i}.0") for i in range(2))
    ll = tmp_path / "kernel.ll"
    ll.write_text(f"define internal void @neuron_kernel(ptr %a) #0 {{\nb0:\n{body}  ret void\n}}\n"
                  "define void @_mlir_ciface_neuron_kernel(ptr %a) #0 {\n"
                  "  call void @neuron_kernel(ptr %a)\n  ret void\n}\n"
                  "attributes #0 = { alwaysinline }\n")
    text = _extract_loops(ll, tmp_path, 120).read_text()
    assert "@neuron_kernel(" not in text and "alwaysinline" not in text
    assert len(re.findall(r"^define internal .* noinline", text, re.M)) == 2
