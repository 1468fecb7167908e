"""Interpreter: rotary embedding layer (rotate-half and interleaved pairs, partial rotary
dimension, with and without position ids)."""

from __future__ import annotations

import numpy as np

from tests.support.interpreter_support import Net, rand

B, N, S, H = 2, 3, 4, 8
P = 16  # positions in the cos/sin tables
ANGLES = np.arange(P)[:, None] * (0.3 ** np.arange(H // 2))[None, :]  # [P, H/2]
COS, SIN = np.cos(ANGLES).astype(np.float32), np.sin(ANGLES).astype(np.float32)
POSITIONS = np.array([[0, 1, 2, 3], [7, 8, 9, 15]], np.int64)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, dim: int, pos=None):
    net = Net()
    layer = net.network.add_rotary_embedding(
        net.input("x", "float32", x.shape),
        net.const(cos),
        net.const(sin),
        interleaved,
        dim,
    )
    feed = {"x": x}
    if pos is not None:
        layer.set_input(3, net.input("pos", "int64", pos.shape))
        feed["pos"] = pos
    net.mark(layer.get_output(0))
    return net.run(feed)["out"]


def test_rotary_rotate_half_pairs_i_with_i_plus_half():
    x = rand(B, N, S, H)
    c, s = COS[POSITIONS][:, None], SIN[POSITIONS][:, None]  # [B, 1, S, H/2]
    x1, x2 = x[..., : H // 2], x[..., H // 2 :]
    expected = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    out = _rope(x, COS, SIN, False, 0, POSITIONS)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_rotary_interleaved_pairs_adjacent_elements():
    x = rand(B, N, S, H)
    c, s = COS[POSITIONS][:, None], SIN[POSITIONS][:, None]
    even, odd = x[..., 0::2], x[..., 1::2]
    expected = np.stack([even * c - odd * s, odd * c + even * s], axis=-1).reshape(x.shape)
    out = _rope(x, COS, SIN, True, 0, POSITIONS)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_rotary_partial_dim_rotates_leading_dims_and_passes_the_rest():
    r = 4
    x = rand(B, N, S, H)
    cos, sin = COS[:, : r // 2].copy(), SIN[:, : r // 2].copy()
    c, s = cos[POSITIONS][:, None], sin[POSITIONS][:, None]
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    expected = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[..., r:]], axis=-1)
    out = _rope(x, cos, sin, False, r, POSITIONS)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_rotary_without_position_ids_reads_one_table_row_per_token():
    x = rand(B, N, S, H)
    cos, sin = COS[POSITIONS], SIN[POSITIONS]  # [B, S, H/2], already per token
    c, s = cos[:, None], sin[:, None]
    x1, x2 = x[..., : H // 2], x[..., H // 2 :]
    expected = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    np.testing.assert_allclose(_rope(x, cos, sin, False, 0), expected, rtol=1e-5, atol=1e-6)
