"""Runtime.time_calls' host side: steps grouped into calls by position (a call of several launches
is one timed entry)."""

from __future__ import annotations

from kern_runtime._program import Step
from kern_runtime._timing import _calls


def test_steps_group_by_call_position() -> None:
    ran: list[str] = []
    steps = [Step(0, "embed", lambda: ran.append("e")), Step(1, "argmax", lambda: ran.append("a1")),
             Step(1, "argmax", lambda: ran.append("a2")), Step(2, "advance", lambda: ran.append("v"))]
    calls = _calls(steps)
    assert [(label, len(ss)) for label, ss in calls] == [("embed", 1), ("argmax", 2), ("advance", 1)]
    for _label, ss in calls:
        for s in ss:
            s.run()
    assert ran == ["e", "a1", "a2", "v"]
