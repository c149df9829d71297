"""attnops.Mask objects: combination, canonical keys, and at_offset (the view of one block of a
larger problem, as the sequence-parallel operators use it) against the mask it came from."""
import itertools

import attnops
import pytest

M = attnops.Mask


@pytest.mark.parametrize("outer", [M.causal(), M.local(3, 1), M.chunked_causal(4),
                                   M.causal() & M.local(5, 0), M.causal() | M.local(0, 2)])
@pytest.mark.parametrize("q0,k0", [(0, 0), (4, 2), (7, 9)])
def test_at_offset_is_the_outer_mask_at_shifted_positions(outer, q0, k0):
    tq, tk = 16, 20
    block = outer.at_offset(q0, k0, tq, tk)
    assert block.kind == "offset"
    for i, j in itertools.product(range(tq - q0), range(tk - k0)):
        # the block's own (Tq, Tk) do not matter: the outer problem's size is kept in the mask
        assert block.visible(0, i, j, 1, 1) == outer.visible(0, q0 + i, k0 + j, tq, tk), (i, j)


def test_at_offset_rejects_negative_offsets():
    with pytest.raises(attnops.Error, match="offset"):
        M.causal().at_offset(-1, 0, 8, 8)


def test_keys_are_canonical_and_combine():
    m = M.causal() & M.local(32, 0)
    assert m.key == "(causal&local(32,0))"
    assert m == (M.causal() & M.local(32, 0))
    assert m.kind == "all_of" and [c.kind for c in m.children] == ["causal", "local"]
