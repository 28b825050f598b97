"""Count the words and lines of a text, and its most common words."""

import collections
import re

WORD = re.compile(r"[\w']+")


def handler(input):
    text = input["text"]
    words = [w.lower() for w in WORD.findall(text)]
    common = collections.Counter(words).most_common(input.get("top", 3))
    print(f"counted {len(words)} words")  # noqa: T201 - prints are the invocation's logs
    return {
        "words": len(words),
        "lines": len(text.splitlines()),
        "top": [[word, count] for word, count in common],
    }
