"""Without a daemon: the output stream's framing, as src/api/processes.rs
writes it, and what the streams make of it."""

from __future__ import annotations

import base64
import json

from sandboxd._output import OutputState, exit_code_of


def chunk(stream, offset, data: bytes) -> str:
    return json.dumps({"type": stream, "offset": offset, "data": base64.b64encode(data).decode()})


def exit_event(code=0, signal=None) -> str:
    return json.dumps({"type": "exit", "process": {"id": 1, "state": "exited", "exit_code": code, "signal": signal}})


def test_lines_split_per_stream_and_keep_arrival_order():
    s = OutputState()
    s.feed_line(chunk("stdout", 0, b"o1\no"))
    s.feed_line(chunk("stderr", 0, b"e1\n"))
    s.feed_line(chunk("stdout", 4, b"2\n"))
    s.feed_line(chunk("stderr", 3, b"e2"))
    assert s.take_line("stdout") == "o1\n"
    assert s.take_any_line() == ("stderr", "e1\n")
    assert s.take_any_line() == ("stdout", "o2\n")
    # An unfinished line waits for its end or the exit.
    assert s.take_line("stderr") is None and not s.ended
    s.feed_line(exit_event(3))
    assert s.ended and s.take_line("stderr") == "e2" and s.take_line("stderr") is None
    assert exit_code_of(s.exit) == 3
    assert s.params() == {"stdout_offset": 6, "stderr_offset": 5}


def test_read_all_and_combined():
    s = OutputState()
    for i in range(3):
        s.feed_line(chunk("stdout", i * 2, b"%d\n" % i))
        s.feed_line(chunk("stderr", i * 3, b"%d\n" % (i + 10)))
    s.feed_line(exit_event())
    assert s.take_all_combined() == "0\n10\n1\n11\n2\n12\n"
    assert s.take_all("stdout") == b"" and s.take_all("stderr") == b""


def test_multibyte_characters_split_across_chunks():
    s = OutputState()
    text = "héllo wörld ✓\n".encode()
    s.feed_line(chunk("stdout", 0, text[:2]))
    s.feed_line(chunk("stdout", 2, text[2:9]))
    s.feed_line(chunk("stdout", 9, text[9:]))
    assert s.take_line("stdout") == "héllo wörld ✓\n"


def test_resumed_stream_repeats_nothing_and_drops_are_counted():
    s = OutputState()
    s.feed_line(chunk("stdout", 0, b"abc"))
    s.feed_line(chunk("stdout", 0, b"abc"))  # the same chunk again
    s.feed_line(chunk("stdout", 1, b"bcd"))  # overlapping
    assert s.params()["stdout_offset"] == 4
    s.feed_line(json.dumps({"type": "dropped", "stream": "stdout", "bytes": 6}))
    s.feed_line(chunk("stdout", 10, b"\n"))
    assert s.streams["stdout"].dropped == 6
    assert s.take_line("stdout") == "abcd\n"
    s.feed_line("")  # blank lines are nothing
    s.feed_line(exit_event())
    assert s.ended


def test_exit_codes_in_beams_convention():
    assert exit_code_of({"state": "running"}) == -1
    assert exit_code_of({"state": "exited", "exit_code": 0}) == 0
    assert exit_code_of({"state": "exited", "exit_code": None, "signal": 9}) == 137
    assert exit_code_of({"state": "exited", "exit_code": 2, "signal": None}) == 2
