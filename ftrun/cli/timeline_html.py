"""`ftrun inspect JOB --html FILE`: the timeline as one self-contained page.

The page carries its data as inline JSON and its script (timeline.js, package data) inline;
it loads nothing from anywhere. Everything in it that came from the journal (job and host names,
reasons, exception text) is data, never markup:

- the JSON sits in a `<script type="application/json">` block, with every `<`, `>` and `&`
  written as a JSON `\\u003c`-style escape, so no `</script>` (nor `<!--`) can close or bend the
  block, whatever a job name holds;
- the script reads it with JSON.parse and sets every text with textContent, never innerHTML;
- the page's Content-Security-Policy allows no network at all and only this one script (by its
  hash), so even text that slipped through could run nothing.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from importlib import resources
from typing import Any

from ftrun.jobview.timeline import Timeline

SCRIPT = "timeline.js"

CSS = """
:root { --ink: #1d2733; --muted: #5f6b7a; --line: #d5dbe3; --bg: #ffffff; }
* { box-sizing: border-box; }
body { margin: 0; padding: 18px 24px; font: 14px/1.4 system-ui, -apple-system, "Segoe UI",
  Roboto, "DejaVu Sans", sans-serif; color: var(--ink); background: var(--bg); }
header h1 { font-size: 19px; margin: 0 0 4px 0; font-weight: 600; }
header h1 .name { color: var(--muted); font-weight: 400; margin-left: 8px; }
.state { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
  font-weight: 600; color: #fff; margin-left: 10px; vertical-align: 2px; }
.state-running { background: #1b7fc4; } .state-succeeded { background: #2e8540; }
.state-failed { background: #c0392b; } .state-stopped { background: #b7791f; }
.state-other { background: #5f6b7a; }
.line { color: var(--muted); margin: 2px 0; }
.goodput { color: var(--ink); }
.goodput b { font-weight: 600; }
#legend { display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 10px 0 6px 0;
  font-size: 12.5px; color: var(--muted); }
#legend .item { display: inline-flex; align-items: center; gap: 5px; }
#chart { width: 100%; }
#chart svg { display: block; font-size: 12px; }
#chart text { fill: var(--ink); }
#chart .lane-label { fill: var(--muted); font-size: 12px; }
#chart .axis text { fill: var(--muted); font-size: 11.5px; }
#chart .none { fill: #9aa5b1; font-style: italic; }
#chart .hot:hover { stroke: #1d2733; stroke-width: 1.5px; }
#tip { position: fixed; display: none; pointer-events: none; max-width: 460px; z-index: 10;
  background: #1d2733; color: #f5f7fa; padding: 7px 10px; border-radius: 5px; font-size: 12.5px;
  box-shadow: 0 2px 8px rgba(0,0,0,.25); white-space: pre-wrap; overflow-wrap: anywhere; }
#tip .title { font-weight: 600; margin-bottom: 2px; }
#timeline-error { margin: 12px 0; padding: 10px; border: 1px solid #c0392b; color: #c0392b;
  white-space: pre-wrap; }
noscript { color: #c0392b; }
"""


def render_html(timeline: Timeline) -> str:
    script = resources.files("ftrun.cli").joinpath(SCRIPT).read_text(encoding="utf-8")
    # An invariant of timeline.js, not of the data: the data cannot reach the script block.
    assert "</script" not in script.lower(), f"{SCRIPT} must not contain a closing script tag"
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    csp = (
        "default-src 'none'; "
        f"script-src 'sha256-{digest}'; "
        "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
    )
    title = f"ftrun timeline: {timeline.job_id}" + (f" ({timeline.name})" if timeline.name else "")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n"
        f"<style>{CSS}</style>\n</head>\n<body>\n"
        '<div id="timeline" data-rendered="no">\n'
        '<header><h1 id="title"></h1><div id="summary"></div></header>\n'
        '<div id="legend"></div>\n<div id="chart"></div>\n<div id="tip"></div>\n'
        "<noscript>This page draws the timeline with JavaScript; "
        "`ftrun inspect JOB --png FILE` makes a static image.</noscript>\n"
        "</div>\n"
        f'<script type="application/json" id="timeline-data">{embed_json(timeline.to_json())}'
        "</script>\n"
        f"<script>{script}</script>\n"
        "</body>\n</html>\n"
    )


def embed_json(data: Any) -> str:
    """JSON that is inert inside an HTML `<script>` block: `<`, `>` and `&` only ever occur in
    JSON strings, where their \\u escapes mean the same (so `</` is never there to end it)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, default=str)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )
