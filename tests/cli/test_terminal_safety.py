"""Nothing a user stored reaches a terminal raw: the escaping rule, and every listing
rendered with hostile values through the CLIs' own rendering functions."""

from __future__ import annotations

import io
import re
import unicodedata
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.cli import explaintext, gcontrol, listing
from gpusched.cli.output import (
    RICH_MAX_ROWS,
    format_plain_table,
    print_columns,
    print_error,
    print_table,
    print_warning,
)
from gpusched.core.terminal import escape_char, terminal_safe, terminal_safe_cells

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
# An OSC window title, a screen clear, a one-character C1 CSI, a bidi override, an
# isolate, a line separator, rich markup and a lone surrogate (json.loads makes those).
HOSTILE = ("ev\x1b]0;owned\x07il\x1b[2J\x9b31m\u202etxt.sh\u2066[bold red]loud[/]"
           "\u2028\ud800")
HOSTILE_SHOWN = ("ev\\x1b]0;owned\\x07il\\x1b[2J\\x9b31m\\u202etxt.sh\\u2066[bold red]loud[/]"
                 "\\u2028\\ud800")
ESCAPE = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|[tnr])")
# Escape sequences a drawn table may hold: rich's own styles (SGR), nothing else.
SGR = re.compile(r"\x1b\[[0-9;]*m")


def assert_clean(text: str) -> None:
    """No character of ``text`` acts on a terminal (once rich's styles are removed)."""
    bare = SGR.sub("", text)
    bad = [c for c in bare if not c.isprintable() and c != "\n"]
    assert not bad, (bad, text)


# -- the rule ------------------------------------------------------------------------


@pytest.mark.parametrize("code", [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)])
def test_every_c0_c1_control_and_del_is_escaped(code: int) -> None:
    shown = terminal_safe(f"a{chr(code)}b")
    short = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
    escape = short.get(code, "\\x%02x" % code)
    assert shown == f"a{escape}b"


@pytest.mark.parametrize(("char", "escape"), [
    ("\u202a", "\\u202a"), ("\u202b", "\\u202b"), ("\u202c", "\\u202c"),
    ("\u202d", "\\u202d"), ("\u202e", "\\u202e"),  # embeddings and overrides
    ("\u2066", "\\u2066"), ("\u2067", "\\u2067"), ("\u2068", "\\u2068"),
    ("\u2069", "\\u2069"),  # isolates
    ("\u200e", "\\u200e"), ("\u200f", "\\u200f"), ("\u061c", "\\u061c"),  # marks
    ("\u200b", "\\u200b"), ("\u200d", "\\u200d"), ("\ufeff", "\\ufeff"),  # zero width
    ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),  # line and paragraph separators
    ("\ud800", "\\ud800"), ("\udfff", "\\udfff"),  # lone surrogates
    ("\u00a0", "\\xa0"), ("\u3000", "\\u3000"),  # spaces that are not U+0020
    ("\u00ad", "\\xad"),  # soft hyphen
    ("\ue000", "\\ue000"), ("\U000e0001", "\\U000e0001"),  # private use, a tag
    ("\u0378", "\\u0378"), ("\U0010ffff", "\\U0010ffff"),  # unassigned
])
def test_format_separator_surrogate_and_other_unprintable_characters_are_escaped(
        char: str, escape: str) -> None:
    assert terminal_safe(f"x{char}y") == f"x{escape}y"
    assert escape_char(char) == escape


@pytest.mark.parametrize("text", [
    "train", "a b", "résumé", "日本語のジョブ", "😀🚀", "❤️", "naïve-ü", "Ωμέγα", "[bold]x",
    "a\\x1bb", "C:\\jobs", "~!@#$%^&*()_+{}|:\"<>?`-=[];',./",
])
def test_printable_text_is_returned_as_it_is(text: str) -> None:
    assert terminal_safe(text) is text


def test_a_backslash_is_not_doubled() -> None:
    """Backslashes are shown as typed; an escaped ESC and a stored ``\\x1b`` look alike
    (the JSON output tells them apart)."""
    assert terminal_safe("a\\b\x1b") == "a\\b\\x1b"
    assert terminal_safe("\\x1b") == "\\x1b"


def test_columns_of_printable_cells_are_not_copied() -> None:
    column = ["train", "日本", "eval"]
    assert terminal_safe_cells(column) is column
    assert terminal_safe_cells(["ok", "x\x1by"]) == ["ok", "x\\x1by"]
    assert terminal_safe_cells([]) == []


@given(st.text(st.characters(exclude_categories=())))
def test_nothing_unprintable_survives(text: str) -> None:
    shown = terminal_safe(text)
    assert shown.isprintable()
    assert "\x1b" not in shown and "\x9b" not in shown
    assert terminal_safe(text) == shown  # deterministic


@given(st.text(st.characters(exclude_categories=(), exclude_characters="\\")))
def test_only_unprintable_characters_change(text: str) -> None:
    """Remove the escapes and what is left is the input's printable characters, in
    order; every escape stands for one character that was not printable."""
    shown = terminal_safe(text)
    assert ESCAPE.sub("", shown) == "".join(c for c in text if c.isprintable())
    assert len(ESCAPE.findall(shown)) == sum(not c.isprintable() for c in text)


@given(st.text(st.characters(categories=("L", "M", "N", "P", "S"))))
def test_letters_marks_numbers_punctuation_and_symbols_are_kept(text: str) -> None:
    assert all(unicodedata.category(c)[0] in "LMNPS" for c in text)
    assert terminal_safe(text) == text


# -- the listings ---------------------------------------------------------------------


class Terminal(io.StringIO):
    """A stream that says it is a terminal: tables are drawn by rich."""

    def isatty(self) -> bool:
        return True


def hostile_job(**extra: Any) -> dict[str, Any]:
    return {"job_id": 17, "display_id": "17", "partition": "gpu\x1b[8m", "name": HOSTILE,
            "user": "mal\u202elory", "account": "acct\x9b", "qos": "normal\x07",
            "state": "PENDING", "reason": "Priority\x1b]8;;http://x\x07", "gpus": 1,
            "nodes": 1, "start_time": None, "end_time": None, "node": None,
            "node_names": None, "time_limit": 60, **extra}


@pytest.mark.parametrize("stream", [io.StringIO, Terminal], ids=["plain", "rich"])
def test_the_queue_table_escapes_every_cell(stream: type[io.StringIO]) -> None:
    out = stream()
    columns = listing.queue_columns(
        listing.job_columns({"jobs": [hostile_job()]}, listing.TABLE_FIELDS), NOW)
    print_columns(listing.HEADERS, columns, right_aligned=listing.RIGHT_ALIGNED,
                  shrinkable=listing.SHRINKABLE, out=out)
    text = out.getvalue()
    assert_clean(text)
    # (cells cut to fit 80 columns)
    assert "ev\\x1b]0;" in text and "mal\\u202e" in text
    assert "gpu\\x1b[8m" in text and "(Priority\\x1b]" in text


def test_rich_shows_markup_in_a_name_as_it_is() -> None:
    out = Terminal()
    print_table(["NAME"], [["[bold red]loud[/] \\[x]"]], out=out)
    text = SGR.sub("", out.getvalue())
    assert "[bold red]loud[/] \\[x]" in text
    # rich's own styling is only the bold header: the name added no style
    assert SGR.findall(out.getvalue()) == ["\x1b[1m", "\x1b[0m"]


def test_a_long_queue_on_a_terminal_is_escaped_too() -> None:
    out = Terminal()
    row = ["17", "gpu", HOSTILE, "alice", "PD", "0:00", "1", "(Priority)"]
    print_table(listing.HEADERS, [row] * (RICH_MAX_ROWS + 1), out=out)
    text = out.getvalue()
    assert_clean(text)
    assert text.count("ev\\x1b]0;owned") == RICH_MAX_ROWS + 1


def test_widths_are_measured_on_what_is_shown() -> None:
    lines = format_plain_table(["A", "NAME", "B"], [["1", "x\x1b", "end"], ["2", "yy", "end"]])
    assert lines == ["A NAME  B", "1 x\\x1b end", "2 yy    end"]


def test_cut_cells_stay_printable() -> None:
    lines = format_plain_table(["NAME", "USER"], [["\x1b" * 100, "\u202e" * 100]], width=40,
                               shrinkable=frozenset({0, 1}))
    assert all(len(line) <= 40 for line in lines)
    assert_clean("\n".join(lines))
    assert lines[1].startswith("\\x1b\\x1b")


@pytest.mark.parametrize("fmt", ["%i %j %P %u %a %q %R %r %N", "%.5j|%20u|%.30R", "%j"])
def test_format_fields_are_escaped(fmt: str) -> None:
    fields = listing.parse_format(fmt)
    running = hostile_job(state="RUNNING", node="node\x1b01", node_names=None,
                          start_time="2026-11-22T11:00:00+00:00")
    lines = [listing.render_format(fields, job, NOW) for job in (hostile_job(), running)]
    for line in lines:
        assert_clean(line)
    if fmt == "%j":
        assert lines == [HOSTILE_SHOWN, HOSTILE_SHOWN]


def test_format_literal_text_is_the_caller_own() -> None:
    """Text between codes comes from the caller's own command line (a tab separator is
    a feature), not from what anyone stored."""
    fields = listing.parse_format("%i\t%j")
    assert listing.render_format(fields, hostile_job(name="a\x1b"), NOW) == "17\ta\\x1b"


def test_the_start_table_escapes_every_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # rich's width: nothing is cut
    out = Terminal()
    print_table(listing.START_HEADERS, [listing.start_row(hostile_job())], out=out,
                right_aligned=frozenset({0, 6}), shrinkable=frozenset({1, 2, 3, 7}))
    assert HOSTILE_SHOWN in out.getvalue()
    assert_clean(out.getvalue())
    assert "mal\\u202elory" in out.getvalue()


def test_explain_escapes_names_reasons_and_details() -> None:
    answer = {"job": hostile_job(), "reason": "Resources\x1b[2J", "priority": 1.0,
              "position": 1, "queue_length": 1, "would_start": [{"node": "n\u202e1"}],
              "blockers": [{"reason": "QOS\x9b", "detail": "limit \u2066x"}]}
    lines = explaintext.explain_lines(answer)
    assert_clean("\n".join(lines))
    assert HOSTILE_SHOWN in lines[0] and "Resources\\x1b[2J" in lines[0]
    assert any("QOS\\x9b: limit \\u2066x" in line for line in lines)


def test_a_launch_failure_is_the_reason_an_ended_job_shows() -> None:
    failed = hostile_job(state="FAILED", reason="LaunchFailed", node="node01",
                         node_names=["node01"], start_time="2026-11-22T11:00:00+00:00",
                         end_time="2026-11-22T11:00:01+00:00")
    done = {**failed, "state": "COMPLETED", "reason": "None"}
    assert listing.job_row(failed, NOW)[7] == "(LaunchFailed)"
    assert listing.job_row(done, NOW)[7] == "node01"
    assert listing.render_format(listing.parse_format("%N"), failed, NOW) == "node01"


def test_gcontrol_show_escapes_keys_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    record = {"job_id": 17, "name": HOSTILE, "work_dir": "/tmp/\u202ecod.exe",
              "gpu_uuids": ["GPU-\x1b[31m", "GPU-2"], "tres": {"gpu\x9b": 1},
              "comment\x1b": "x"}
    gcontrol._print(record, as_json=False)
    out = capsys.readouterr().out
    assert_clean(out)
    assert f"Name={HOSTILE_SHOWN}" in out
    assert "WorkDir=/tmp/\\u202ecod.exe" in out and "GpuUuids=GPU-\\x1b[31m,GPU-2" in out
    assert "Tres=gpu\\x9b:1" in out and "Comment\\x1b=x" in out


def test_gcontrol_show_json_is_exact_and_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    record = {"name": HOSTILE.replace("\ud800", ""), "work_dir": "/tmp/\u202e"}
    gcontrol._print(record, as_json=True)
    out = capsys.readouterr().out
    assert out.isascii() and "\x1b" not in out and "\\u001b]0;owned" in out
    assert json.loads(out) == record


@pytest.mark.parametrize("printer", [print_error, print_warning])
def test_errors_and_warnings_are_one_escaped_line(
        printer: Any, capsys: pytest.CaptureFixture[str]) -> None:
    printer("gqueue", f"job 17 ({HOSTILE}) not found\nsecond line\r\n  third\u2028\x85")
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert_clean(err)
    assert f"job 17 ({HOSTILE_SHOWN}) not found second line third\\u2028\\x85" in err
