"""What a person sees in the terminal: `evo run`'s live display and quiet log lines, and
`evo leaderboard`'s table of only what differs between members."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from evo.cli import main
from evo.display import RunDisplay, format_duration


def board(*rows: tuple[int, float]) -> list[dict]:
    return [{"index": i, "score": s, "fitness": s, "train_metrics": {}} for i, s in rows]


def rendered(display: RunDisplay) -> str:
    console = Console(file=io.StringIO(), width=140, force_terminal=False)
    console.print(display._render())
    return console.file.getvalue()


def test_live_view_shows_member_states_best_score_throughput_and_eta() -> None:
    d = RunDisplay("demo", generations=4, population=3, backend="inline", steps_per_generation=500)
    d.generation_started(0, [0, 1, 2])
    d.member_event(0, "training", {})
    d.member_event(1, "training", {})
    d.member_event(1, "evaluating", {})
    d.member_event(2, "retried", {"error": "worker lost"})
    view = rendered(d)
    assert "generation 1/4" in view and "best score so far -" in view
    assert all(state in view for state in ("training", "evaluating", "retried"))
    d.member_event(1, "done", {"fitness": -0.25, "wall_s": 2.0})
    d.member_event(2, "failed", {"error": "diverged: loss is nan"})
    view = rendered(d)
    assert "-0.25" in view and "250" in view  # member 1: 500 steps in 2 s
    assert "1 done" in view and "1 failed" in view and "steps/s" in view
    t0 = d._generation_t0
    d.generation_done(0, board((1, -0.25), (0, -0.5), (2, float("-inf"))))
    assert d.best == -0.25 and d.best_index == 1
    walls = d._generation_walls
    # three generations left, each as long as the first one was
    assert d.eta_s(now=d._generation_t0) == pytest.approx(3 * walls[0])
    assert d.eta_s(now=d._generation_t0 + walls[0]) == pytest.approx(2 * walls[0])
    assert d._generation_t0 >= t0


def test_quiet_mode_prints_one_line_per_generation_and_each_failure(capsys: pytest.CaptureFixture) -> None:
    d = RunDisplay("demo", generations=2, population=2, backend="inline", steps_per_generation=100, quiet=True)
    with d:
        d.generation_started(0, [0, 1])
        d.member_event(0, "training", {})
        d.member_event(0, "done", {"fitness": 1.0, "wall_s": 0.5})
        d.member_event(1, "failed", {"error": "error: boom"})
        d.generation_done(0, board((0, 1.0), (1, float("-inf"))))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "run demo: 2 generations of 2 members on the inline backend"
    assert lines[1] == "generation 1: member 1 failed: error: boom"
    assert lines[2].startswith("generation 1/2: elite member 0 score 1; best so far 1; ")
    assert "steps/s" in lines[2] and "1 failed" in lines[2] and "eta " in lines[2]
    assert len(lines) == 3  # nothing per member unless it fails


def test_format_duration() -> None:
    assert [format_duration(s) for s in (None, float("nan"), 0.4, 42, 185, 3725)] == ["-", "-", "0s", "42s", "3m05s", "1h02m"]


def test_leaderboard_shows_what_varies_and_all_on_request(toy_runs: Path, capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(toy_runs.parent)
    assert main(["leaderboard", "toy"]) == 0
    default = capsys.readouterr().out
    assert main(["leaderboard", "toy", "--all"]) == 0
    everything = capsys.readouterr().out
    rows = lambda text: [line for line in text.splitlines() if line.startswith("│")]
    # weight_decay is fixed in toy.toml: said once under the table, not on every row
    assert not any("weight_decay" in r for r in rows(default)) and "same in every member" in default
    assert "weight_decay=0" in default.split("same in every member")[1]
    assert everything.count("weight_decay=0") == 4 and "same in every member" not in everything  # one per member
    assert "min_" not in everything and "node_step" not in everything  # mutation bounds are never a column
    assert len(default.splitlines()) <= len(everything.splitlines())
    assert main(["leaderboard", "toy", "--top", "1"]) == 0
    assert capsys.readouterr().out.count("\n│ 1 ") == 1


def test_header_lines_break_between_phrases_for_the_terminal_width() -> None:
    """The live view's headline never wraps mid-phrase ("58 steps/s · 2 queued · 1 training" then
    "· 1 done" alone, at 160 columns, before): it is packed into lines of whole phrases."""
    from evo.display import pack_phrases

    d = RunDisplay("a_rather_long_run_name", generations=12, population=5, backend="ray", steps_per_generation=640)
    d.generation_started(3, [0, 1, 2, 3, 4])
    d.member_event(0, "training", {})
    d.member_event(1, "done", {"fitness": 412.5, "wall_s": 11.0})
    d.best, d.best_index = 487.25, 17
    d.steps_per_s = lambda now=None: 58.2  # the rate depends on the clock; the layout must not
    phrases = d._phrases()
    assert phrases == ["generation 4/12", "best score so far 487.2 (member 17)", "58 steps/s", "3 queued", "1 training",
                       "1 done"]
    for width in (40, 60, 100, 160):
        lines = d.header_lines(width)
        assert all(len(line) <= width for line in lines)
        assert [p for line in lines for p in line.split(" · ")] == phrases  # whole phrases, in order
        view = Console(file=io.StringIO(), width=width, force_terminal=False)
        view.print(d._render(width))
        text = view.file.getvalue()
        assert all(line in text.splitlines() for line in lines)  # rendered as laid out, one row each
    assert len(d.header_lines(160)) == 1 and len(d.header_lines(40)) > 1
    assert pack_phrases(["a" * 30, "b"], 10) == ["a" * 30, "b"]  # a phrase wider than the line stands alone
