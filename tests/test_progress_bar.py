"""The progress bar of long runs (`_progress_bar`): a bar on a terminal, log lines otherwise."""

import io

import structlog

from slashrt._progress_bar import ProgressBar


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_terminal_gets_a_bar_that_ends_with_a_newline():
    out = Tty()
    p = ProgressBar(1000, stream=out, interval=0)
    p(500)
    p(1000)
    text = out.getvalue()
    assert "\r[" in text and " 50.0%" in text and "100.0%" in text
    assert text.endswith("\n")


def test_non_terminal_gets_structured_log_lines():
    with structlog.testing.capture_logs() as logs:
        p = ProgressBar(200, stream=io.StringIO(), interval=0)
        p(100)
        p(200)
    assert [e["percent"] for e in logs if e["event"] == "progress"] == [50.0, 100.0]


def test_draws_at_most_once_per_interval_but_always_the_end():
    out = Tty()
    p = ProgressBar(100, stream=out, interval=3600)
    p(1)  # the first call draws; later ones within the interval do not, except the end
    p(2)
    p(3)
    p(100)
    assert out.getvalue().count("\r[") == 1 + 1  # one early draw and the final one
