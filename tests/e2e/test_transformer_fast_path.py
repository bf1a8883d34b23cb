"""``nn.TransformerEncoder`` in ``eval()`` under ``no_grad`` (issue 13, item 7): PyTorch's fast path
(``aten._transformer_encoder_layer_fwd``) compiles and matches a float64 eager run as closely as
float32 eager does, post- and pre-norm, ReLU and GELU, without a mask and with a key-padding mask."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import neuron_compile


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True], ids=["no-mask", "key-padding"])
def test_encoder_fast_path_matches_float64_eager(norm_first, activation, padded):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first,
                                             activation=activation)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 7, 32)
    kw = {}
    if padded:
        pad = torch.zeros(3, 7, dtype=torch.bool)
        pad[0, 4:] = True
        pad[2, 6:] = True
        kw["src_key_padding_mask"] = pad
    torch._dynamo.reset()
    with torch.no_grad():
        got = neuron_compile(enc)(x, **kw)
        eager = enc(x, **kw)
        ref = enc.double()(x.double(), **kw)
    err, err_eager = (got.double() - ref).abs().max().item(), (eager.double() - ref).abs().max().item()
    assert got.shape == eager.shape and err <= 3 * err_eager + 1e-6, (err, err_eager)
