"""The shared caches and the collector pause (app.services.cache)."""

from __future__ import annotations

import gc
import threading

import pytest

from app.services.cache import LruCache, collector_paused


def test_lru_evicts_least_recently_used() -> None:
    cache: LruCache[str, int] = LruCache(size=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)


def test_collector_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: still off when the inner one leaves
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_collector_restored_after_an_exception() -> None:
    with pytest.raises(ValueError, match="inside"), collector_paused():
        raise ValueError("inside")
    assert gc.isenabled()


def test_collector_left_off_when_it_was_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def _paused_in_another_thread(release: threading.Event) -> threading.Thread:
    """A thread inside ``collector_paused()`` until ``release`` is set (started, entered)."""
    entered = threading.Event()

    def hold() -> None:
        with collector_paused():
            entered.set()
            release.wait(5)

    other = threading.Thread(target=hold)
    other.start()
    entered.wait(5)
    return other


def test_collector_stays_off_until_the_last_thread_leaves() -> None:
    release = threading.Event()
    other = _paused_in_another_thread(release)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread is still inside
    release.set()
    other.join(5)
    assert gc.isenabled()


def test_overlapping_callers_cannot_keep_the_collector_off_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller leaving while another is still inside collects once the pause is too long."""
    import app.services.cache as cache

    collections: list[int] = []

    def collect(*args: int) -> int:
        collections.append(1)
        return 0

    monkeypatch.setattr(gc, "collect", collect)
    release = threading.Event()
    other = _paused_in_another_thread(release)
    monkeypatch.setattr(cache, "MAX_PAUSE_S", 3600.0)
    with collector_paused():
        pass
    assert collections == []  # a short overlap: no collection
    monkeypatch.setattr(cache, "MAX_PAUSE_S", 0.0)
    with collector_paused():
        pass
    assert collections == [1]  # the pause outlived its bound: this caller collected
    assert not gc.isenabled()  # the other thread is still inside
    release.set()
    other.join(5)
    assert gc.isenabled()
