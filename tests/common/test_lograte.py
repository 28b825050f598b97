"""Repeated log lines are rate-limited per (logger, template), with a summary of what was
suppressed; installed by the gateway's and the node's logging set-up (issue 29, review
finding #12). Time is a manual clock."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from common.lograte import RepeatLimit, install


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, Lines, Clock]]:
    clock = Clock()
    handler = Lines()
    handler.addFilter(RepeatLimit(burst=3, interval_s=10.0, clock=clock))
    logger = logging.getLogger("test.lograte")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, handler, clock
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def test_the_first_lines_of_a_template_pass_then_a_summary_says_how_many_were_not(
    logged: tuple[logging.Logger, Lines, Clock],
) -> None:
    logger, handler, clock = logged
    for i in range(1000):
        logger.info("sandbox=%s: watching %s", "sbx", f"/tmp/{i}")
    assert handler.lines == [f"sandbox=sbx: watching /tmp/{i}" for i in range(3)]
    clock.now += 10
    logger.info("sandbox=%s: watching %s", "sbx", "/tmp/next")
    assert handler.lines[3].startswith("997 similar lines suppressed in 10 s")
    assert "watching" in handler.lines[3]
    assert handler.lines[4] == "sandbox=sbx: watching /tmp/next"


def test_templates_are_limited_apart(logged: tuple[logging.Logger, Lines, Clock]) -> None:
    logger, handler, _ = logged
    for _ in range(5):
        logger.info("a %s", 1)
        logger.warning("b %s", 2)
    assert handler.lines.count("a 1") == 3 and handler.lines.count("b 2") == 3


def test_a_flood_that_stops_is_still_summarised_by_the_next_line_of_another(
    logged: tuple[logging.Logger, Lines, Clock],
) -> None:
    logger, handler, clock = logged
    for _ in range(50):
        logger.error("refused: %s", "EMFILE")
    clock.now += 11
    logger.info("something else")
    assert any(line.startswith("47 similar lines suppressed") for line in handler.lines)
    assert handler.lines[-1] == "something else"


def test_the_gateway_and_the_node_install_it() -> None:
    from app.cli.servers import _logging
    from node.agent.__main__ import configure_logging

    root = logging.getLogger()
    chatty = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    for setup in (lambda: _logging("info"), configure_logging):
        saved_handlers, saved_level = root.handlers[:], root.level
        root.handlers = []  # basicConfig adds its handler only to a root without one
        try:
            setup()
            assert root.handlers
            assert all(
                any(isinstance(f, RepeatLimit) for f in handler.filters)
                for handler in root.handlers
            )
        finally:
            for handler in root.handlers:
                handler.close()
            root.handlers = saved_handlers
            root.setLevel(saved_level)
            for name, level in chatty.items():
                logging.getLogger(name).setLevel(level)


def test_install_is_idempotent() -> None:
    handler = Lines()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        install()
        install()
        assert sum(isinstance(f, RepeatLimit) for f in handler.filters) == 1
    finally:
        root.removeHandler(handler)
