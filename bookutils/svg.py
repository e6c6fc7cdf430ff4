"""A few SVG primitives for the frames of the book's interactive figures.

Hand-written SVG keeps each frame to a few kilobytes of plain text, with no
ids (frames are repeated many times on one page) and real text that a browser
can search and a test can read."""
import math
from html import escape

import matplotlib

FONT = "system-ui, -apple-system, 'Segoe UI', sans-serif"
INK = "#1a1a1a"
MUTED = "#555555"
BLUE, ORANGE, GREEN, RED, GREY = "#1f77b4", "#d95f02", "#1b7837", "#b2182b", "#bdbdbd"
MIN_SCALE = 0.7              # the smallest a drawing is shown, as a share of its width in user units
ORANGE_TEXT = "#a84300"      # ORANGE darkened for text on white: ORANGE itself is 3.8:1, under WCAG's 4.5:1


def blues(value, top=1.0):
    """Hex colour of `value` on matplotlib's Blues map scaled to [0, top]."""
    share = 0.0 if top <= 0 else min(max(value / top, 0.0), 1.0)
    return matplotlib.colors.to_hex(matplotlib.colormaps["Blues"](0.08 + 0.84 * share))


def diverging(value, reach=1.0):
    """Hex colour of a signed `value` on matplotlib's RdBu map (red negative,
    blue positive, white at zero), scaled to [-reach, reach]."""
    share = 0.0 if reach <= 0 else min(max(value / reach, -1.0), 1.0)
    return matplotlib.colors.to_hex(matplotlib.colormaps["RdBu"](0.5 + 0.42 * share))


def luminance(colour):
    """WCAG 2 relative luminance of a colour: its linearised sRGB channels weighted."""
    channels = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
                for c in matplotlib.colors.to_rgb(colour)]
    return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]


def contrast(a, b):
    """WCAG 2 contrast ratio of two colours, from 1 (the same) to 21 (black on white)."""
    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def ink_on(fill):
    """Black or white, whichever has the larger contrast with the fill colour:
    one of them always reaches WCAG's 4.5:1 for text."""
    return max(("#000000", "#ffffff"), key=lambda ink: contrast(ink, fill))


def _n(value):
    """A coordinate with at most one decimal, without a trailing .0."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


class Canvas:
    """An SVG drawing of width x height user units, built shape by shape."""

    def __init__(self, width, height):
        self.width, self.height = width, height
        self.parts = [f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']

    def rect(self, x, y, w, h, fill="none", stroke=None, width=1, dash=None, rx=0):
        extra = f' stroke="{stroke}" stroke-width="{width}"' if stroke else ""
        extra += f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' rx="{rx}"' if rx else ""
        self.parts.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(w)}" height="{_n(h)}" fill="{fill}"{extra}/>')

    def line(self, x1, y1, x2, y2, stroke=INK, width=1, dash=None, arrow=False):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' stroke-width="{width}"' if width != 1 else ""
        self.parts.append(f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" stroke="{stroke}"{extra}/>')
        if arrow:
            self.arrowhead(x1, y1, x2, y2, stroke)

    def arrowhead(self, x1, y1, x2, y2, colour, size=7):
        angle = math.atan2(y2 - y1, x2 - x1)
        left = (x2 - size * math.cos(angle - 0.45), y2 - size * math.sin(angle - 0.45))
        right = (x2 - size * math.cos(angle + 0.45), y2 - size * math.sin(angle + 0.45))
        self.parts.append(f'<polygon points="{_n(x2)},{_n(y2)} {_n(left[0])},{_n(left[1])} '
                          f'{_n(right[0])},{_n(right[1])}" fill="{colour}"/>')

    def circle(self, x, y, r, fill="none", stroke=INK, width=1, dash=None):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        extra += f' stroke-width="{width}"' if width != 1 else ""
        self.parts.append(f'<circle cx="{_n(x)}" cy="{_n(y)}" r="{_n(r)}" fill="{fill}" stroke="{stroke}"{extra}/>')

    def text(self, x, y, words, size=12, anchor="middle", colour=INK, weight=None, italic=False):
        # Size, anchor, colour and baseline default to the <svg> element's (see markup).
        extra = f' font-size="{size}"' if size != 12 else ""
        extra += f' text-anchor="{anchor}"' if anchor != "middle" else ""
        extra += f' fill="{colour}"' if colour != INK else ""
        extra += f' font-weight="{weight}"' if weight else ""
        extra += ' font-style="italic"' if italic else ""
        self.parts.append(f'<text x="{_n(x)}" y="{_n(y)}"{extra}>{escape(str(words))}</text>')

    def markup(self, label):
        """The drawing as an inline <svg> that assistive technology reads as one
        image named by `label`. It shrinks with the page down to MIN_SCALE of its
        size (12-unit text stays at least 8.4 px); narrower than that, it scrolls
        sideways inside its frame instead of shrinking further."""
        return (f'<div style="overflow-x:auto">'
                f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" width="100%" '
                f'style="max-width:{self.width}px;min-width:{round(MIN_SCALE * self.width)}px" role="img" '
                f'aria-label="{escape(label)}" font-family="{FONT}" font-size="12" text-anchor="middle" '
                f'dominant-baseline="central" fill="{INK}">' + "".join(self.parts) + "</svg></div>")
