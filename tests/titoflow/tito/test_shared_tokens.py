"""Shared token storage (titoflow/tito/shared_tokens.py) against plain copies: whatever the
order of extensions, forks, retries with the same tail, prefixes (``Chain.before_head``) and
extensions of one parent from several threads at once, every sequence holds exactly the ids a
plain list built the same way holds, and a view taken earlier keeps its ids while the store
grows past it."""

from __future__ import annotations

import threading
from array import array

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from titoflow.tito.shared_tokens import SharedTokens

ids = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40)
# Small ids so that tails often coincide (a retry) or start alike (the partial-reuse path).
small_tails = st.lists(st.integers(0, 2), max_size=6)

extend = st.tuples(st.just("extend"), st.integers(0, 1_000), small_tails | ids)
# A longer tail lets a store grow past the room it keeps: the swap path.
big_ids = st.lists(st.integers(0, 2**31 - 1), min_size=70)
grow = st.tuples(st.just("extend"), st.integers(0, 1_000), big_ids)
prefix = st.tuples(st.just("prefix"), st.integers(0, 1_000), st.integers(0, 1_000))
new = st.tuples(st.just("new"), st.just(0), ids)
view = st.tuples(st.just("view"), st.integers(0, 1_000), st.just(0))
ops = st.lists(st.one_of(extend, extend, grow, prefix, new, view), max_size=60)


def _check(seq: SharedTokens, model: list[int]) -> None:
    assert len(seq) == len(model)
    assert list(seq) == seq.tolist() == model
    assert seq[:] == array("i", model)
    if model:
        assert seq[-1] == model[-1] and seq[0] == model[0]
        assert seq[1:-1:2] == array("i", model[1:-1:2])
    assert seq.starts(array("i", [*model, 7]))
    assert not model or not seq.starts(array("i", [*model[:-1], model[-1] ^ 1]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=ids, ops=ops)
def test_shared_sequences_hold_what_copies_hold(
    first: list[int], ops: list[tuple[str, int, object]]
) -> None:
    pool: list[tuple[SharedTokens, list[int]]] = [(SharedTokens.of(first), list(first))]
    views: list[tuple[np.ndarray, list[int]]] = []
    for op, pick, arg in ops:
        seq, model = pool[pick % len(pool)]
        if op == "extend":
            assert isinstance(arg, list)
            pool.append((seq + arg, model + arg))
        elif op == "prefix":
            assert isinstance(arg, int)
            n = arg % (len(model) + 1)
            pool.append((seq.prefix(n), model[:n]))
        elif op == "new":
            assert isinstance(arg, list)
            pool.append((SharedTokens.of(arg), list(arg)))
        else:  # as the engine client writes a prompt: a numpy view over the store
            views.append((np.frombuffer(seq.view(), dtype=np.int32), list(model)))
        for held, expected in pool:
            _check(held, expected)
        for held_view, expected in views:
            assert held_view.tolist() == expected


@settings(max_examples=40, deadline=None)
@given(base=ids, tails=st.lists(small_tails | ids, min_size=2, max_size=8))
def test_concurrent_extensions_of_one_parent(base: list[int], tails: list[list[int]]) -> None:
    """Threads extend one parent at once (prompts are built in worker threads, two requests
    may continue one chain); each gets its own tail after the parent's ids, the parent keeps
    its own, and a child extended again stays exact."""
    parent = SharedTokens.of(base)
    start = threading.Barrier(len(tails))
    got: dict[int, SharedTokens] = {}

    def run(i: int) -> None:
        start.wait()
        got[i] = parent + tails[i]
        got[i] = got[i] + [i] * 80  # past the store's room: growth under contention

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(tails))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _check(parent, base)
    for i, tail in enumerate(tails):
        _check(got[i], base + tail + [i] * 80)


def test_extending_at_the_end_shares_the_store() -> None:
    """The point of the module: a chain's next prompt and head are written in place, a fork
    copies, and a retry with the same tail reuses what the first wrote."""
    parent = SharedTokens.of(range(1000))
    prompt = parent + array("i", [1, 2, 3])
    head = prompt + array("i", [4, 5])
    retry = parent + array("i", [1, 2, 3])
    fork = parent + array("i", [9])
    assert head.view().obj is prompt.view().obj is parent.view().obj is retry.view().obj
    assert fork.view().obj is not parent.view().obj
    assert list(fork) == [*range(1000), 9] and list(head) == [*range(1000), 1, 2, 3, 4, 5]
