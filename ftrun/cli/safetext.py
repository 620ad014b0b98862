"""Untrusted text on a terminal: the one place that decides how it is shown.

Job names, host names, rank log lines, exception text, tracebacks and paths come from users, from
their programs and from the journal on disk; none of them is trusted. Two things can go wrong:

- rich markup: `[/]x` raises MarkupError, `[bold]` or `[link=file:///etc/passwd]` restyles the
  listing, `[hang]` disappears. Every console ftrun makes has markup (and emoji codes, and
  highlighting) off, so a string is always shown as written; styled output is built from `Text`
  pieces, where the style is ftrun's and the text is data.
- terminal control characters: rich keeps ESC in a `Text`, so `\\x1b[2J` in a log line would
  clear the screen, and OSC 8 or OSC 52 sequences could forge links or set the clipboard.
  `clean` shows every control character (C0 but newline and tab, DEL, C1) and the Unicode bidi
  overrides as a visible escape, `\\x1b`. The console cleans each string it is given and, as the
  last guard, every segment it renders, so a renderable built elsewhere cannot slip one through.

Rank output streamed live by `ftrun launch` is the program's own stdout (torchrun passes it
through, `\\r` progress bars included) and does not go through here.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

# C0 controls but \t and \n, DEL, C1 controls, and the bidi embeddings/overrides/isolates that
# reorder what a terminal shows (the "trojan source" characters).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: object) -> str:
    """`text` as a string that a terminal shows as written: control characters escaped."""
    return _UNSAFE.sub(_escape, str(text))


def plain(text: object, style: str | Style = "") -> Text:
    """Untrusted text as a renderable: no markup is parsed, control characters are escaped."""
    return Text(clean(text), style=style)


class SafeConsole(Console):
    """A rich Console for untrusted text: markup, emoji codes and highlighting off; strings and
    rendered segments cleaned of control characters (rich's own cursor controls are kept)."""

    def render_str(self, text: str, **kwargs: object) -> Text:
        return super().render_str(clean(text), **kwargs)  # type: ignore[arg-type]

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _UNSAFE.search(segment.text):
                yield Segment(clean(segment.text), segment.style)
            else:
                yield segment


def make_console(*, stderr: bool = False) -> Console:
    """A console that wraps at the terminal's width, or at 160 columns when piped (rich's
    default of 80 would fold the tables)."""
    stream = sys.stderr if stderr else sys.stdout
    return SafeConsole(
        stderr=stderr,
        markup=False,
        emoji=False,
        highlight=False,
        width=None if stream.isatty() else 160,
    )
