"""Synthetic GUI tasks `synth/<kind>`: random pages in MiniWoB's format, run by `MiniWobEnv` unchanged.

    from envs import synth
    synth.TASK_IDS                      # ('synth/click', 'synth/type', ..., 'synth/search')
    synth.is_synth("synth/form")        # True
    synth.page_url("synth/form")        # file:///tmp/gui-flywheel-synth-<uid>/<hash>/synth-form.html
    env = MiniWobEnv(); obs = env.reset("synth/click", seed=7)   # obs.extra["fields"]: kind, target, ...

Two uses: a mid-training corpus of base skills (point at an element named by its text, read the text
of a marked element, type the quoted text into the named field, short sequences "fill these two
fields then press X") with scripted-teacher demos (agents/teacher_synth.py), and RL tasks whose
reward the page computes from its own DOM, on unlimited fresh instances (one per seed).

Kinds (the page says which fields `core.getUtterance()` returns; the teacher reads only those and the DOM):
    click   Click the button "Qazor". / Follow the link "vemu 42".           fields: role, target
    type    Enter "Xqvofe" into the City field and press Save.                 field_1, text_1, button
    form    Enter "Ab12" as City and "Pelu" as Name, then press Go.           field_i, text_i (i=1,2), button
    read    Type the text of the marked item into the Answer field and press OK.   field_1, button
    option  Select "Pelu" and press Submit. / Check "a" and "b", then press Go.    widget, target_i, button
    tabs    Open the "Vemu" tab and click the link "rano 7".                   tab, target
    search  Find the link "rano 7" on one of the tabs and click it.           target
            (any tab starts active; one or two near-copies such as "rano 1" or "ramo 7" sit on the tabs;
            half the pages are paragraphs with inline links, where the target word may stand as plain
            text on a tab, most often the open one, while its link is on another)
Success is raw reward +1 (the target clicked; the named fields hold exactly the quoted text, the other
fields empty, when the named button is pressed; exactly the named options selected). Pressing a button
or link the instruction did not name, or pressing the button with wrong field contents, ends the
episode at once with -1 and a one-line reason (the lake's feedback).

Pages: one generator (synth.js) over MiniWoB's own core.js. Elements (buttons, links, text, labelled
text inputs with DOM ids derived from their field names, e.g. `input_text#city`, radios/checkboxes with
labels, tabs) are scattered at uniform random positions over the 160x160 area with overlaps rejected
(getBoundingClientRect), or, a quarter of the time, flowed in wrapping rows at a random height and
alignment. Labels, field names and values come from a seeded generator (syllable words, mixed-case
letter strings, letters+digits, numbers, two-word labels), unique on a page. A quarter of the click, tabs
and search pages draw every label from one numbered series ("Ko #12", "Ko #11", "Ko #5"), so the target
differs from its neighbours only in its digits. All randomness is
Math.random after the env's Math.seedrandom(seed): the same seed gives the same page, pixel for pixel.

Why this corpus cannot leak a scored MiniWoB task's solution:
- the HTML and generator are this repo's own (template.html, synth.js); no MiniWoB task page, and none
  of MiniWoB's word lists (ui_utils.FIFTY_NAMES, ...) or data is loaded: only core.js/core.css, the
  episode plumbing every MiniWoB page shares (seeding, timer, DOM snapshot, endEpisode);
- labels, names and values are generated strings (a short list of common button verbs is the only fixed
  vocabulary), so no MiniWoB utterance or answer string is a target here except by chance;
- search's paragraphs are generated syllable words with some of them links (`a`), a layout any wiki page
  has; no MiniWoB text (its lorem ipsum), template or instruction wording is used;
- the ids `synth/<kind>` are disjoint from MiniWoB's task ids (which never contain "/"), so a synth
  episode can never be scored, curated or split as a MiniWoB task, and the seed splits are per task id;
- a solution is instance-specific: coordinates and labels of a randomly laid-out synthetic page. What
  transfers is the skill (find the text, read it, type it, press the named button), which is the point.

The pages are materialized (written once per generator version) into a cache folder beside a symlink
`core -> <miniwob>/html/core`, so `core/core.js` resolves under file://; see `materialize`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

PREFIX = "synth/"
KINDS: tuple[str, ...] = ("click", "type", "form", "read", "option", "tabs", "search")
TASK_IDS: tuple[str, ...] = tuple(PREFIX + k for k in KINDS)
_HERE = Path(__file__).resolve().parent


def is_synth(task_id: object) -> bool:
    """A registered synthetic task id (`synth/<kind>`)."""
    return isinstance(task_id, str) and task_id in TASK_IDS


def kind_of(task_id: str) -> str:
    if not is_synth(task_id):
        raise ValueError(f"not a synth task id: {task_id!r}; known: {', '.join(TASK_IDS)}")
    return task_id[len(PREFIX) :]


def safe_name(task_id: str) -> str:
    """A task id as a file/folder name: `synth/click` -> `synth-click` (MiniWoB ids pass unchanged)."""
    return task_id.replace("/", "-")


def miniwob_core_dir() -> Path:
    """miniwob's html/core folder (core.js, core.css), found without importing miniwob."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the miniwob package is not installed (pip install miniwob==1.1.0)")
    core = Path(list(spec.submodule_search_locations)[0]) / "html" / "core"
    if not (core / "core.js").is_file():
        raise RuntimeError(f"miniwob's core.js not found under {core}")
    return core


def page_html(kind: str) -> str:
    """The full HTML of one kind's page (template + generator inlined)."""
    if kind not in KINDS:
        raise ValueError(f"unknown synth kind {kind!r}; known: {', '.join(KINDS)}")
    template = (_HERE / "template.html").read_text()
    script = (_HERE / "synth.js").read_text()
    return template.replace("{{KIND}}", kind).replace("{{SCRIPT}}", script)


def version() -> str:
    """A short hash of the generator (template + script): a changed generator draws other pages per seed."""
    h = hashlib.sha1((_HERE / "template.html").read_bytes() + b"\0" + (_HERE / "synth.js").read_bytes())
    return h.hexdigest()[:12]


def default_root() -> Path:
    """$FLYWHEEL_SYNTH_DIR, else a per-user folder in the temp dir."""
    env = os.environ.get("FLYWHEEL_SYNTH_DIR")
    if env:
        return Path(env)
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"gui-flywheel-synth-{uid}"


def materialize(root: str | Path | None = None) -> Path:
    """Write every kind's page and the `core` symlink into `<root>/<version hash>/`; return that folder.

    Deterministic (the folder name hashes the pages and the core path, so a changed generator gets a new
    folder and never mixes with an old one), idempotent (a complete folder is left alone) and safe with
    several processes at once (each file is written to a unique temp name and os.replace'd into place).
    """
    core = miniwob_core_dir()
    pages = {f"synth-{k}.html": page_html(k) for k in KINDS}
    h = hashlib.sha1(str(core).encode())
    for name in sorted(pages):
        h.update(name.encode() + b"\0" + pages[name].encode() + b"\0")
    out = Path(root or default_root()) / h.hexdigest()[:12]
    link = out / "core"
    if link.is_symlink() and os.readlink(link) == str(core) and all((out / n).is_file() for n in pages):
        return out
    out.mkdir(parents=True, exist_ok=True)
    tag = f".{os.getpid()}.{os.urandom(4).hex()}.tmp"
    for name, text in pages.items():
        tmp = out / (name + tag)
        tmp.write_text(text)
        os.replace(tmp, out / name)
    tmp_link = out / ("core" + tag)
    os.symlink(core, tmp_link, target_is_directory=True)
    os.replace(tmp_link, link)
    return out


def page_url(task_id: str, root: str | Path | None = None) -> str:
    """The file:// URL of a synth task's page (materializing the pages if needed)."""
    kind = kind_of(task_id)
    return (materialize(root) / f"synth-{kind}.html").as_uri()
