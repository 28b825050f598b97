"""The node's own process limits."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import resource
from node.agent.limits import raise_open_files_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
raised = raise_open_files_limit()
print(raised, *resource.getrlimit(resource.RLIMIT_NOFILE), hard)
"""


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True
    ).stdout.split()
    raised, soft, hard, original_hard = map(int, out)
    assert hard == original_hard  # never touched
    assert raised == soft > 64
    assert soft == min(hard, 1 << 20) or hard == -1
