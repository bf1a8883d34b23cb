"""``grid_sampler_3d``: trilinear / nearest sampling of a volume at grid points, as gathers.

The 3-D counterpart of ``torch._decomp``'s ``grid_sampler_2d`` and of ATen's CPU kernel
(``GridSampler.cpp``): grid coordinates in [-1, 1] are unnormalized to voxel positions
(``align_corners`` as eager), mapped by the padding mode (zeros: out-of-range corners weigh 0;
border: clamped; reflection: reflected about the edges, then clamped), then the 8 surrounding
voxels are blended with trilinear weights, or the nearest voxel (round half to even, as
``nearbyint``) is taken.
"""
from __future__ import annotations

import torch


def _reflect(c, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return torch.zeros_like(c)
    lo, span = twice_low / 2, (twice_high - twice_low) / 2
    c2 = (c - lo).abs()
    extra = torch.fmod(c2, span)
    flips = (c2 / span).floor()
    return torch.where(torch.fmod(flips, 2) == 0, extra + lo, span + lo - extra)


def _source_index(c, size: int, padding_mode: int, align_corners: bool):
    c = c * ((size * 0.5 - 0.5) if align_corners else size * 0.5) + (size * 0.5 - 0.5)
    if padding_mode == 1:  # border
        return c.clamp(0, size - 1)
    if padding_mode == 2:  # reflection
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
        return c.clamp(0, size - 1)
    return c


def grid_sampler_3d(a, grid, interpolation_mode: int = 0, padding_mode: int = 0, align_corners: bool = False):
    """Sample ``a`` (N, C, iD, iH, iW) at ``grid`` (N, oD, oH, oW, 3) holding (x, y, z) in [-1, 1];
    returns (N, C, oD, oH, oW) in a's dtype. ``interpolation_mode`` 0 = trilinear, 1 = nearest
    (bicubic has no 3-D form in ATen either)."""
    if interpolation_mode not in (0, 1):
        raise NotImplementedError(f"grid_sampler_3d interpolation_mode {interpolation_mode}")
    n, c, d_in, h_in, w_in = a.shape
    out_shape = grid.shape[1:4]
    sizes = (w_in, h_in, d_in)
    pos = [_source_index(grid[..., k], sizes[k], padding_mode, align_corners) for k in range(3)]
    flat = a.reshape(n, c, d_in * h_in * w_in)

    def corner(coords, weight):
        """weight × a at integer ``coords`` (x, y, z), each (N, oD, oH, oW); 0 outside the volume."""
        inside = torch.ones_like(coords[0], dtype=torch.bool)
        for k in range(3):
            inside = inside & (coords[k] >= 0) & (coords[k] <= sizes[k] - 1)
        ix, iy, iz = (torch.where(inside, q, 0).to(torch.int64) for q in coords)
        at = ((iz * h_in + iy) * w_in + ix).reshape(n, 1, -1).expand(n, c, -1)
        vals = flat.gather(2, at).reshape(n, c, *out_shape)
        return vals * torch.where(inside, weight, 0).unsqueeze(1)

    if interpolation_mode == 1:
        return corner([p.round() for p in pos], torch.ones_like(pos[0]))
    low = [p.floor() for p in pos]
    total = None
    for bits in range(8):
        coords, weight = [], None
        for k in range(3):
            up = (bits >> k) & 1
            coords.append(low[k] + up)
            w = (pos[k] - low[k]) if up else (low[k] + 1 - pos[k])
            weight = w if weight is None else weight * w
        term = corner(coords, weight)
        total = term if total is None else total + term
    return total
