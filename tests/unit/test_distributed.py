"""pipeline.distributed without processes: how a list of work is shared and put back together, and `alone`. The
processes themselves: tests/e2e/test_processes.py."""

from __future__ import annotations

import pytest

from attnscope import settings
from attnscope.analyses.compare import Compare
from attnscope.analyses.report import Report
from attnscope.errors import AttnscopeError
from attnscope.pipeline import distributed

TORCHRUN_ENV = {"WORLD_SIZE": "3", "RANK": "2", "LOCAL_RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.parametrize("count", [0, 1, 2, 5, 7])
def test_every_item_goes_to_one_process_and_comes_back_in_order(size, count):
    items = [f"item{k}" for k in range(count)]
    parts = [distributed.share(items, rank, size) for rank in range(size)]
    assert sorted(item for part in parts for item in part) == sorted(items)  # each item once
    assert all(len(part) - len(parts[-1]) in (0, 1) for part in parts)  # as even as it can be
    assert distributed.reassemble(parts) == items


def test_a_share_cut_short_ends_the_reassembled_list_where_its_first_missing_item_was():
    parts = [["a0", "a2", "a4"], ["a1"]]  # process 1 stopped after item 1 (at an error, reported by item 1)
    assert distributed.reassemble(parts) == ["a0", "a1", "a2"]


def test_run_shared_in_one_process_raises_the_first_error_in_order(monkeypatch):
    ran = []

    def work(item: int) -> int:
        ran.append(item)
        if item in (2, 3):
            raise AttnscopeError(f"item {item} failed")
        return item * 10

    assert distributed.run_shared([0, 1], work) == [0, 10]
    with pytest.raises(AttnscopeError, match="^item 2 failed$"):
        distributed.run_shared([0, 1, 2, 3, 4], work)
    assert ran == [0, 1, 0, 1, 2]  # it stopped where one process stops


@pytest.mark.parametrize("size", [2, 3])
def test_in_rounds_works_every_item_on_its_process_and_hands_back_every_result_in_order(monkeypatch, size):
    """Each process of `size` run in turn (their gathers stubbed to hand back what the processes worked on in that
    round): process r works on items r, r + N, ... alone, and every process yields every item's result in order;
    an error ends every process's stream at the first failing item, as one process's."""
    items = [f"item{k}" for k in range(7)]

    def run(rank: int, failing: str | None = None) -> tuple[list[str], list[str], str | None]:
        worked: list[str] = []
        seen: list[str] = []  # what this process has yielded: every earlier round's results

        def work(item: str) -> str:
            worked.append(item)
            if item == failing:
                raise AttnscopeError(f"{item} failed")
            return item.upper()

        def gather(mine):  # the round's outcomes, as every process would have them
            round_items = items[len(seen) : len(seen) + size]
            outcomes = [(False, f"{x} failed") if x == failing else (True, x.upper()) for x in round_items]
            assert mine == ([outcomes[rank]] if rank < len(round_items) else [])  # this process's own
            return outcomes

        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setattr(distributed, "gather", gather)
        try:
            for value in distributed.in_rounds(iter(items), work):
                seen.append(value)
        except AttnscopeError as error:
            return worked, seen, str(error)
        return worked, seen, None

    for name, value in {**TORCHRUN_ENV, "WORLD_SIZE": str(size)}.items():
        monkeypatch.setenv(name, value)
    for rank in range(size):
        worked, seen, error = run(rank)
        assert worked == items[rank::size] and seen == [item.upper() for item in items] and error is None
        worked, seen, error = run(rank, failing="item4")
        assert seen == [item.upper() for item in items[:4]] and error == "item4 failed"
    with distributed.alone():  # one process: every item, as it comes
        assert list(distributed.in_rounds(iter(items), str.upper)) == [item.upper() for item in items]


def test_alone_makes_this_process_the_only_one(monkeypatch):
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert (distributed.working().rank, distributed.working().size) == (2, 3)
    with distributed.alone():
        assert (distributed.working().rank, distributed.working().size) == (0, 1)
        assert distributed.run_shared([1, 2, 3], lambda item: -item) == [-1, -2, -3]  # nothing shared, all here
    assert distributed.world().size == 3  # the place itself is untouched: only rank 0 prints


def test_the_wait_for_the_other_processes_is_two_minutes_or_the_seconds_the_environment_gives(monkeypatch):
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(distributed.RENDEZVOUS_TIMEOUT, raising=False)
    assert distributed.world().rendezvous_seconds == distributed.DEFAULT_RENDEZVOUS_SECONDS == 120
    monkeypatch.setenv(distributed.RENDEZVOUS_TIMEOUT, " 2.5 ")
    assert distributed.world().rendezvous_seconds == 2.5
    monkeypatch.setenv(distributed.RENDEZVOUS_TIMEOUT, "1e7")
    assert distributed.world().rendezvous_seconds == 10**7
    for wrong in ("0", "-3", "nan", "inf", "2s", "10000001"):
        monkeypatch.setenv(distributed.RENDEZVOUS_TIMEOUT, wrong)
        with pytest.raises(AttnscopeError, match=rf"^ATTNSCOPE_RENDEZVOUS_TIMEOUT={wrong}: how long .*120 when unset"):
            distributed.world()
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process waits for no one: the variable is not read
    assert distributed.world().size == 1


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_compare_opens_each_model_once_per_piece_and_keeps_two_models_rows_together(processes):
    for count in (2, 3):
        pieces = Compare(divergence=False).pieces(count, False, processes)
        opened = sorted(index for piece in pieces for index, scored, loss in piece if scored and loss)
        assert opened == list(range(count))  # each model scored and its loss measured, while loaded once
    pieces = Compare().pieces(2, True, processes)
    scored = [piece for piece in pieces if any(scored for _, scored, _ in piece)]
    assert scored == [[(0, True, processes == 1), (1, True, processes == 1)]]  # both models' rows on one process
    assert sorted((index, loss) for piece in pieces for index, _, loss in piece if loss) == [(0, True), (1, True)]
    assert Compare(loss=False).pieces(2, True, processes) == [[(0, True, False), (1, True, False)]]


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_report_opens_every_model_once_and_the_last_on_the_first_process(processes):
    pieces = Report().pieces(4, processes)
    assert sorted(index for piece in pieces for index in piece) == [0, 1, 2, 3]
    assert 3 in pieces[0]  # the page's own model, the costliest, on process 0 (and its result stays there)
    assert len(pieces) == (1 if processes == 1 else 4)


def test_the_settings_say_what_is_shared():
    assert settings.Circuit.torchrun and settings.Compare.torchrun and settings.Report.torchrun
    assert settings.Ablate.torchrun and settings.Patch.torchrun  # their passes, their patched runs
    assert not settings.Kvplan.torchrun and not settings.Bench.torchrun
