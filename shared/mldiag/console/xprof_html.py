"""xprof's HTML answers, served sandboxed, and the files its Graph Viewer needs, served here.

Two of xprof's answers are HTML pages: the Graph Viewer's graph (`graph_viewer`, `type=graph`)
and the memory viewer's allocation timeline. The graph page embeds profile text (op and module
names, from the bucket: untrusted) raw in an inline script, as the source of a JavaScript
template literal. Served as it is, on the console's origin, a profile could close that script
and write its own markup (a `<meta http-equiv="refresh">` took a viewer to another site).

So every HTML answer is served with a Content-Security-Policy `sandbox` that never has
`allow-same-origin`: the page gets an opaque origin, and nothing in it runs with the console's
origin (its cookies, its API, its other pages). Only the graph page gets `allow-scripts`, and
only framed (`Sec-Fetch-Dest: iframe`, which a page cannot forge) by the console's own pages
(`frame-ancestors 'self'`), and only after `graph_page` has rebuilt it: the graph's DOT text is
read as the value its template literal had, and written back as an inert JSON string, so no
profile text can close the script or run code in it. A page that is not the template xprof
2.24.2 writes, or whose literal would run code (a backtick, `${`), is served without scripts,
and draws nothing. The page's scripts and fonts, which xprof loads from Google's servers,
are served by the console (`VENDOR`, in `mldiag/web/static/vendor/`, with their licences).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
from importlib import resources

log = logging.getLogger(__name__)

# Where the console serves the vendored files: public (they are open-source libraries and
# fonts), and readable from a sandboxed page's opaque origin (fonts are fetched with CORS).
VENDOR_PATH = "/xprof-vendor/"
VENDOR = {
    "hpcc-js-wasm-graphviz.min.js": "text/javascript; charset=utf-8",
    "svg-pan-zoom.min.js": "text/javascript; charset=utf-8",
    "roboto.css": "text/css; charset=utf-8",
    "roboto-latin-400-normal.woff2": "font/woff2",
    "roboto-latin-700-normal.woff2": "font/woff2",
    "google-sans-code.css": "text/css; charset=utf-8",
    "google-sans-code-latin-400-normal.woff2": "font/woff2",
}
# The font the frontend's component styles import from Google (`@import"https://fonts.
# googleapis.com/css2?family=Google+Sans+Code"`, in its bundle), and the file served instead.
GOOGLE_SANS_CODE = (b"https://fonts.googleapis.com/css2?family=Google+Sans+Code",
                    f"{VENDOR_PATH}google-sans-code.css".encode())

# Non-HTML answers (JSON, text, protobuf) are data: should a browser ever render one, it
# runs nothing, loads nothing and is framed by no one.
DATA_CSP = "sandbox; default-src 'none'; frame-ancestors 'none'"
# An HTML answer that is not a graph page rebuilt by `graph_page`: shown, never run.
INERT_HTML_CSP = ("sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
                  "frame-ancestors 'self'; base-uri 'none'; form-action 'none'")

# xprof 2.24.2's graph page: the two scripts it loads from www.gstatic.com, the font its
# graphs' stylesheet imports, and the template literal that holds the graph's DOT text.
_GSTATIC_SCRIPTS = (
    (re.compile(r'<script src="https://www\.gstatic\.com/external_hosted/hpcc_js_wasm/'
                r'index\.min\.js"[^>]*></script>'), "hpcc-js-wasm-graphviz.min.js"),
    (re.compile(r'<script src="https://www\.gstatic\.com/external_hosted/svg_pan_zoom/'
                r'svg-pan-zoom\.js"[^>]*></script>'), "svg-pan-zoom.min.js"),
)
_ROBOTO = "@import url(https://fonts.googleapis.com/css?family=Roboto:400,700);"
_DATA_START = "const data = `"
_DATA_END = "`;\n    const results = cssregex.exec(data);"
# Where the graph is drawn: the page then tells the console's page (`xprof-page.js`), which
# cannot read the sandboxed frame, that it has.
_DRAWN = "      add_controls(svg);\n"
_DRAWN_MESSAGE = "      parent.postMessage('mldiag:graph-drawn', '*');\n"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S | re.I)


def vendor_file(name: str) -> bytes:
    """A vendored file's bytes (`name` one of VENDOR)."""
    return (resources.files("mldiag.web") / "static" / "vendor" / name).read_bytes()


def _hash_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v",
                   "\n": ""}
_HEX = re.compile(r"[0-9A-Fa-f]+")


def _cooked(source: str) -> str | None:
    """The value of a JavaScript template literal whose source text (between the backticks)
    is `source`, or None when it would not be one plain literal: a backtick would end it and
    `${` would run code, as would an escape JavaScript refuses."""
    text = source.replace("\r\n", "\n").replace("\r", "\n")
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "`" or (c == "$" and text[i + 1:i + 2] == "{"):
            return None
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = text[i + 1:i + 2]
        i += 2
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
        elif e == "0" and not text[i:i + 1].isdigit():
            out.append("\0")
        elif e == "x" and len(pair := text[i:i + 2]) == 2 and _HEX.fullmatch(pair):
            out.append(chr(int(pair, 16)))
            i += 2
        elif e == "u" and text[i:i + 1] == "{":
            end = text.find("}", i)
            digits = text[i + 1:end] if end > 0 else ""
            if not _HEX.fullmatch(digits) or int(digits, 16) > 0x10FFFF:
                return None
            out.append(chr(int(digits, 16)))
            i = end + 1
        elif e == "u" and len(text[i:i + 4]) == 4 and _HEX.fullmatch(text[i:i + 4]):
            out.append(chr(int(text[i:i + 4], 16)))
            i += 4
        elif e == "" or e.isdigit() or e in "xu":
            return None  # a syntax error in JavaScript: the page would not run
        else:
            out.append(e)  # `\\`, `` \` ``, `\$`, and any other character stands for itself
    return "".join(out)


def _inert_literal(value: str) -> str:
    """`value` as a JavaScript string literal that no HTML parser reads markup in: JSON, with
    every `<` escaped (no `</script`, no `<!--`)."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e")


def graph_page(html: str) -> tuple[str, str | None]:
    """xprof's graph page rebuilt to run offline and inert to the profile's text: its scripts
    and font from VENDOR_PATH, its DOT text an inert string. Returns the page and the hash of
    its one inline script, or the page unchanged and None when it is not the page xprof
    writes or its DOT text would run code (it is then served without scripts)."""
    start, end = html.find(_DATA_START), html.rfind(_DATA_END)
    if start < 0 or end < start:
        log.warning("xprof's graph page is not the template this console knows: served "
                    "without scripts")
        return html, None
    head, source, tail = html[:start], html[start + len(_DATA_START):end], html[end + 1:]
    value = _cooked(source)
    if value is None:
        log.warning("a graph page's DOT text would end its script or run code: served "
                    "without scripts")
        return html, None
    for pattern, name in _GSTATIC_SCRIPTS:
        head, found = pattern.subn(f'<script src="{VENDOR_PATH}{name}"></script>', head,
                                  count=1)
        if not found:
            return html, None
    value = value.replace(_ROBOTO, f"@import url({VENDOR_PATH}roboto.css);")
    tail = tail.replace(_DRAWN, _DRAWN + _DRAWN_MESSAGE, 1)
    page = f"{head}const data = {_inert_literal(value)}{tail}"
    inline = _INLINE_SCRIPT.findall(page)
    if len(inline) != 1:
        return html, None
    return page, _hash_source(inline[0])


def graph_csp(script_hash: str | None, *, framed: bool) -> str:
    """The graph page's policy: sandboxed in an opaque origin; its own inline script (by
    `script_hash`), the vendored scripts and WebAssembly only when `framed` by the console's
    own page and rebuilt by `graph_page`."""
    if script_hash is None or not framed:
        return INERT_HTML_CSP
    return ("sandbox allow-scripts; default-src 'none'; "
            f"script-src 'self' {script_hash} 'wasm-unsafe-eval'; "
            "style-src 'self' 'unsafe-inline'; font-src 'self'; img-src data: blob:; "
            "frame-ancestors 'self'; base-uri 'none'; form-action 'none'")
