"""Interactive figures that work on the static site.

Every state a reader can reach is computed when the page is built, by the
page's own code, and written into the page as a frame: an SVG drawing, the same
content in words and numbers (the text alternative), and the numbers again as
data attributes that the browser tests read. The controls are native HTML
(buttons, range sliders, check boxes), so the keyboard works as everywhere
else; a script of about seventy lines (stepper.js, shipped inline with the figure,
no library and no request) shows the frame that the controls select and
announces it to screen readers. Without the script the first frame is shown
and the controls stay disabled."""
import json
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from IPython.display import HTML

HERE = Path(__file__).resolve().parent


@dataclass
class Steps:
    """Previous and next buttons and a slider over numbered steps."""
    name: str
    labels: list


@dataclass
class Slider:
    """A slider over a list of values, labelled by `labels`."""
    name: str
    label: str
    labels: list
    start: int = 0


@dataclass
class Toggle:
    """A check box that switches one thing on or off."""
    name: str
    label: str
    start: bool = False


@dataclass
class Frame:
    """One state of a figure. `key` holds the control values that select it, in
    the order of the figure's controls (an index for Steps and Slider, 0 or 1
    for Toggle); `text` says in words what the drawing shows; `data` holds the
    numbers drawn, for tests and for anyone who inspects the page."""
    key: tuple
    svg: str
    text: str
    data: dict = field(default_factory=dict)
    table: str = ""


def _key(values):
    return "|".join(str(int(v)) for v in values)


def _data_attributes(data):
    parts = []
    for name, value in data.items():
        encoded = value if isinstance(value, str) else json.dumps(value)
        parts.append(f' data-{name}="{escape(encoded)}"')
    return "".join(parts)


def _control(control):
    if isinstance(control, Steps):
        last = len(control.labels) - 1
        return (f'<button type="button" data-move="-1" data-target="{control.name}" disabled>'
                f'<span aria-hidden="true">&#9664;</span> Previous step</button>'
                f'<button type="button" data-move="1" data-target="{control.name}" disabled>'
                f'Next step <span aria-hidden="true">&#9654;</span></button>'
                f'<label class="cf-range">Step <input type="range" data-control="{control.name}" min="0" '
                f'max="{last}" step="1" value="0" disabled data-labels="{escape(json.dumps(control.labels))}">'
                f'</label><span class="cf-value" data-output="{control.name}">'
                f'{escape(control.labels[0])}</span>')
    if isinstance(control, Slider):
        return (f'<label class="cf-range">{escape(control.label)} <input type="range" '
                f'data-control="{control.name}" min="0" max="{len(control.labels) - 1}" step="1" '
                f'value="{control.start}" disabled data-labels="{escape(json.dumps(control.labels))}">'
                f'</label><span class="cf-value" data-output="{control.name}">'
                f'{escape(control.labels[control.start])}</span>')
    checked = " checked" if control.start else ""
    return (f'<label class="cf-toggle"><input type="checkbox" data-control="{control.name}"{checked} disabled> '
            f'{escape(control.label)}</label>')


def _start(control):
    if isinstance(control, Steps):
        return 0
    return int(control.start)


def stepper_html(name, title, controls, frames, caption):
    """The markup of one interactive figure: controls, one element per frame,
    a live region, the caption, and the script and style (once per page is
    enough; repeats are harmless). The caption is plain text: the page's math
    renderer does not read cell outputs."""
    frames = list(frames)
    keys = [_key(f.key) for f in frames]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{name}: two frames share a key")
    for f in frames:
        if len(f.key) != len(controls):
            raise ValueError(f"{name}: frame key {f.key} does not have one value per control")
    start = _key(_start(c) for c in controls)
    if start not in keys:
        raise ValueError(f"{name}: no frame for the starting position {start}")
    parts = [f'<figure class="cf-figure"><div class="cf-stepper" data-figure="{escape(name)}">',
             f'<div class="cf-controls" role="group" aria-label="{escape(title)}: controls">',
             "".join(f'<div class="cf-control">{_control(c)}</div>' for c in controls), "</div>"]
    for key, f in zip(keys, frames):
        hidden = "" if key == start else " hidden"
        parts.append(f'<div class="cf-frame" data-key="{key}" data-summary="{escape(f.text)}"'
                     f'{_data_attributes(f.data)}{hidden}>{f.svg}<p class="cf-text">{escape(f.text)}</p>'
                     f'{f.table}</div>')
    parts.append('<p class="cf-live" aria-live="polite"></p>')
    parts.append("<noscript><p>The controls need JavaScript; without it the first state is shown.</p></noscript>")
    parts.append(f"</div><figcaption>{escape(caption)}</figcaption></figure>")
    parts.append(f"<style>{(HERE / 'stepper.css').read_text()}</style>")
    parts.append(f"<script>{(HERE / 'stepper.js').read_text()}</script>")
    return "".join(parts)


def stepper(name, title, controls, frames, caption):
    """The figure for a notebook cell's output (rendered as it is on the site)."""
    return HTML(stepper_html(name, title, controls, frames, caption))


def table(header, rows):
    """A small HTML table: the numbers of a frame, readable without the drawing."""
    head = "".join(f'<th scope="col">{escape(str(h))}</th>' for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="cf-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
