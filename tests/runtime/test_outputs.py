"""ListSnapshot: an O(1), frozen, list-like view of an append-only list's first n items."""

import pytest

from graphllm.runtime.outputs import ListSnapshot


def test_reads_like_the_list_it_was_taken_of():
    items = [10, 11, 12, 13, 14]
    snap = ListSnapshot(items)
    assert len(snap) == 5 and snap == items and items == snap and snap != items[:4]
    assert snap[0] == 10 and snap[-1] == 14 and snap[1:3] == [11, 12] and snap[::-2] == [14, 12, 10]
    assert snap[3:] == [13, 14] and snap[:-1] == items[:-1] and snap[7:] == []
    assert list(snap) == items and 12 in snap and snap.index(13) == 3 and bool(ListSnapshot([])) is False
    assert [1] + snap == [1, *items] and snap + [1] == [*items, 1] and repr(snap) == repr(items)
    with pytest.raises(IndexError):
        snap[5]
    with pytest.raises(TypeError):
        hash(snap)


def test_later_appends_do_not_show():
    items = [1, 2, 3]
    snap = ListSnapshot(items)
    items += [4, 5]
    assert snap == [1, 2, 3] and len(snap) == 3 and snap[-1] == 3 and snap[:] == [1, 2, 3]
    assert ListSnapshot(items, 4) == [1, 2, 3, 4] and ListSnapshot(items) == ListSnapshot(items[:])
    with pytest.raises(IndexError):
        snap[3]
