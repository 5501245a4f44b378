"""What reaches an admin's terminal from a user: text with its escape sequences and control characters gone."""

from __future__ import annotations

from gpupool.spawner.printable import printable


def test_colours_titles_and_control_characters_are_removed_and_the_words_kept() -> None:
    assert printable("\x1b[1;31mValueError\x1b[0m: bad input") == "ValueError: bad input"
    assert printable("\x1b]0;pwned title\x07train") == "train"  # a terminal title, set by OSC
    assert printable("\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\") == "link"  # a hyperlink, ended by ST
    assert printable("a\rb\x08c\x00d\te") == "abcde"  # carriage return, backspace, NUL, tab
    assert printable("naïve ✓ 训练") == "naïve ✓ 训练"  # printable text of any script stays
