"""The contracts both planes speak, and nothing else.

The control plane (``app``) and the data plane (``runtimes``) each import this package;
it imports neither. Everything that crosses a process boundary between them is defined
here: what an execution asks for and returns (``execution``), the messages on the
dispatch wire (``messages``), the name of every Redis key (``keys``), identifiers
(``ids``), a node's sandbox API (``sandboxes``, ``processes``) and how a node fetches an
image from the control plane (``images``). All of it travels as JSON (an image's files as
a tar), never pickle. Two helpers for the log lines of both planes live here too, so
neither needs the other's: ``logsafe`` (tenant text bounded and escaped) and ``lograte``
(repeated lines rate-limited).
"""
