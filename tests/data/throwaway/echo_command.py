"""A throwaway command, written as docs/development.md's recipe says a new command is written: its settings, its
analysis with its result and view, and one record for attnscope.registry (tests/e2e/test_registry.py adds it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from attnscope import options, registry
from attnscope.analyses.result import Result
from attnscope.output.documents import document
from attnscope.output.views import View
from attnscope.settings import NONE, Settings, setting


@dataclass(frozen=True, kw_only=True)
class EchoSettings(Settings):
    """`attnscope echo`: says a number back, `times` times."""

    models: ClassVar[str] = NONE
    reads_texts: ClassVar[bool] = False
    draws: ClassVar[bool] = False

    times: int = setting(options.TRIALS, 2, "How many times to say it.", metavar="N")


class EchoView(View):
    command = "echo"

    def document(self) -> dict:
        return document("echo", {}, {}, {"times": self.result.times}, self.result.notes, said=self.result.said)

    def records(self) -> list[dict]:
        return [{"said": value} for value in self.result.said]

    def terminal(self, written):
        return [" ".join(map(str, self.result.said))]


@dataclass(repr=False)
class EchoResult(Result):
    view_class = EchoView
    times: int
    said: list[int]
    notes: list[str] = field(default_factory=list)


class Echo(EchoSettings):
    def run(self) -> EchoResult:
        return EchoResult(self.times, [7] * self.times)


RECORD = registry.Command(
    "echo",
    EchoSettings,
    "echo_command.Echo",
    "echo_command.EchoResult",
    doc="Say 7 back, `times` times (`attnscope echo`).",
    help="""
    Say 7 back.

    Example: attnscope echo --times 3
    """,
    page="commands/echo.md",
    summary="says 7 back",
    picture="",
)
