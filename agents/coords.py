"""The one explicit coordinate transform between what a model writes and screen pixels.

A model looks at a (possibly resized) screenshot and writes coordinates in *its* space;
the environment executes in *screen* pixels. Every policy, teacher and student alike,
goes through `CoordTransform` (slime's OSWorld example did not, so Qwen's coordinates on
a 1312x736 resized image were executed unchanged on a 1920x1080 VM).

Spaces:

- ``screen``       identity: the model writes screen pixels (scripted teachers, tests).
- ``absolute``     pixels of the resized image the model sees (Qwen2.5-VL): the image is
                   `qwen_smart_resize`d, so ``x_screen = x * screen_w / image_w``.
- ``relative1000`` 0..1000 relative to the image (Qwen3-VL): ``x_screen = x / 1000 * screen_w``.
- ``scaled``       pixels of an image scaled by one factor (Claude's computer-use tool, images
                   scaled to fit `claude_scaled_size`); the arithmetic is that of ``absolute``.

`to_screen` clamps into the screen ([0, w-1] x [0, h-1]); `to_model` does not clamp.
The parser rejects model coordinates outside the model's image before any clamping
(`CoordTransform.in_model_bounds`), so clamping only absorbs rounding at the far edge.

    >>> t = CoordTransform.for_qwen3(1920, 1080)
    >>> t.to_screen(500, 500)
    (960.0, 540.0)
    >>> t.to_model(960, 540)
    (500.0, 500.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

# Coordinate fields of an action, as (x field, y field) pairs.
COORD_PAIRS: tuple[tuple[str, str], ...] = (("x", "y"), ("x1", "y1"), ("x2", "y2"))
COORD_FIELDS: frozenset[str] = frozenset(f for pair in COORD_PAIRS for f in pair)

# Qwen's documented defaults. Qwen2-VL / Qwen2.5-VL: 14 px patches merged 2x2 -> factor 28;
# Qwen3-VL: 16 px patches merged 2x2 -> factor 32. The HF image processors default to
# min_pixels=56*56, max_pixels=28*28*1280 (= 1003520); many agent setups raise max_pixels.
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 1280
# Qwen2.5-VL's shipped preprocessor_config.json: 4..16384 visual tokens (3136..12845056 px).
QWEN25_MAX_PIXELS = 16384 * 28 * 28
QWEN_MAX_RATIO = 200

# Claude (Anthropic vision docs): images larger than 1568 px on the long edge or about
# 1.15 megapixels are downscaled (aspect ratio kept) before the model sees them.
CLAUDE_MAX_LONG_EDGE = 1568
CLAUDE_MAX_PIXELS = 1_150_000


class CoordSpace(str, Enum):
    SCREEN = "screen"
    ABSOLUTE = "absolute"
    RELATIVE1000 = "relative1000"
    SCALED = "scaled"


def _round_by_factor(n: float, factor: int) -> int:
    return round(n / factor) * factor


def _ceil_by_factor(n: float, factor: int) -> int:
    return math.ceil(n / factor) * factor


def _floor_by_factor(n: float, factor: int) -> int:
    return math.floor(n / factor) * factor


def qwen_smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = QWEN_MIN_PIXELS, max_pixels: int = QWEN_MAX_PIXELS
) -> tuple[int, int]:
    """The (height, width) Qwen-VL resizes an image to (Qwen's documented `smart_resize`, as
    implemented by transformers' Qwen2-VL/Qwen3-VL image processors).

    Both sides become multiples of `factor` (28 for Qwen2/2.5-VL, 32 for Qwen3-VL), the pixel
    count lands in [min_pixels, max_pixels], and the aspect ratio is kept as closely as
    possible. Raises ValueError for non-positive sizes or an aspect ratio above 200.

    >>> qwen_smart_resize(1080, 1920, factor=32)   # slime's OSWorld setting
    (736, 1312)
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > QWEN_MAX_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {QWEN_MAX_RATIO}, "
            f"got {max(height, width) / min(height, width)}"
        )
    # transformers' Qwen2-VL image processor (what actually resizes in training and in vLLM);
    # qwen_vl_utils additionally floors these at `factor`, which differs only for sides < factor/2.
    h_bar = _round_by_factor(height, factor)
    w_bar = _round_by_factor(width, factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, _floor_by_factor(height / beta, factor))
        w_bar = max(factor, _floor_by_factor(width / beta, factor))
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = _ceil_by_factor(height * beta, factor)
        w_bar = _ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def claude_scaled_size(
    width: int, height: int, max_long_edge: int = CLAUDE_MAX_LONG_EDGE, max_pixels: int = CLAUDE_MAX_PIXELS
) -> tuple[int, int]:
    """(width, height) of a screenshot downscaled by one factor to fit Claude's image limits."""
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    s = min(1.0, max_long_edge / max(width, height), math.sqrt(max_pixels / (width * height)))
    return max(1, math.floor(width * s)), max(1, math.floor(height * s))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class CoordTransform:
    """Model space <-> screen pixels. `image_w`/`image_h`: the image the model sees (ignored for
    ``screen``; for ``relative1000`` they only matter to the caller, the model's range is 0..1000)."""

    space: CoordSpace
    screen_w: int
    screen_h: int
    image_w: int | None = None
    image_h: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "space", CoordSpace(self.space))
        if self.screen_w <= 0 or self.screen_h <= 0:
            raise ValueError(f"screen size must be positive, got {self.screen_w}x{self.screen_h}")
        if self.space == CoordSpace.SCREEN:
            object.__setattr__(self, "image_w", self.image_w or self.screen_w)
            object.__setattr__(self, "image_h", self.image_h or self.screen_h)
        elif self.space == CoordSpace.RELATIVE1000:
            object.__setattr__(self, "image_w", self.image_w or self.screen_w)
            object.__setattr__(self, "image_h", self.image_h or self.screen_h)
        elif not (self.image_w and self.image_h and self.image_w > 0 and self.image_h > 0):
            raise ValueError(f"{self.space.value} space needs the model image size (image_w, image_h)")

    # ---- constructors for the models we use -------------------------------------------------
    @classmethod
    def identity(cls, screen_w: int, screen_h: int) -> CoordTransform:
        return cls(CoordSpace.SCREEN, screen_w, screen_h)

    @classmethod
    def for_qwen25(
        cls,
        screen_w: int,
        screen_h: int,
        *,
        min_pixels: int = QWEN_MIN_PIXELS,
        max_pixels: int = QWEN25_MAX_PIXELS,
        factor: int = 28,
    ) -> CoordTransform:
        """Qwen2.5-VL: absolute pixels of the smart-resized screenshot.

        Pass the processor's actual `min_pixels`/`max_pixels` (the defaults are those of the
        released Qwen2.5-VL preprocessor config; many setups lower max_pixels, e.g. 1280*28*28),
        or build ``CoordTransform(ABSOLUTE, sw, sh, image_w, image_h)`` from the processed size."""
        h, w = qwen_smart_resize(screen_h, screen_w, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        return cls(CoordSpace.ABSOLUTE, screen_w, screen_h, w, h)

    @classmethod
    def for_qwen3(cls, screen_w: int, screen_h: int) -> CoordTransform:
        """Qwen3-VL: 0..1000 relative coordinates (independent of the resize)."""
        return cls(CoordSpace.RELATIVE1000, screen_w, screen_h)

    @classmethod
    def for_unit(cls, screen_w: int, screen_h: int) -> CoordTransform:
        """Coordinates normalised to 0..1 of the screen (OpenCUA's AgentNet): the ``absolute`` arithmetic on a
        1x1 image, so ``x_screen = x * screen_w``."""
        return cls(CoordSpace.ABSOLUTE, screen_w, screen_h, 1, 1)

    @classmethod
    def for_claude(cls, screen_w: int, screen_h: int, **kw: int) -> CoordTransform:
        """Claude computer use: pixels of the screenshot downscaled by `claude_scaled_size`."""
        w, h = claude_scaled_size(screen_w, screen_h, **kw)
        return cls(CoordSpace.SCALED, screen_w, screen_h, w, h)

    # ---- the transform ----------------------------------------------------------------------
    @property
    def model_w(self) -> float:
        """Width of the model's coordinate range (1000 for relative1000)."""
        return 1000.0 if self.space == CoordSpace.RELATIVE1000 else float(self.image_w)  # type: ignore[arg-type]

    @property
    def model_h(self) -> float:
        return 1000.0 if self.space == CoordSpace.RELATIVE1000 else float(self.image_h)  # type: ignore[arg-type]

    def _screen_xy(self, x: float, y: float) -> tuple[float, float]:
        if self.space == CoordSpace.SCREEN:
            return float(x), float(y)
        return float(x) * self.screen_w / self.model_w, float(y) * self.screen_h / self.model_h

    def to_screen(self, x: float, y: float) -> tuple[float, float]:
        """Model coords -> screen pixels, clamped to [0, w-1] x [0, h-1]."""
        xs, ys = self._screen_xy(x, y)
        return min(max(xs, 0.0), self.screen_w - 1.0), min(max(ys, 0.0), self.screen_h - 1.0)

    def to_model(self, x: float, y: float) -> tuple[float, float]:
        """Screen pixels -> model coords (not clamped)."""
        if self.space == CoordSpace.SCREEN:
            return float(x), float(y)
        return float(x) * self.model_w / self.screen_w, float(y) * self.model_h / self.screen_h

    def in_model_bounds(self, x: float, y: float) -> bool:
        """Whether a model-space point lies on the model's image ([0, W] x [0, H], edges included)."""
        return 0.0 <= x <= self.model_w and 0.0 <= y <= self.model_h

    def would_clamp(self, x: float, y: float) -> bool:
        """Whether `to_screen` had to clamp this model-space point (for logging)."""
        xs, ys = self._screen_xy(x, y)
        return not (0.0 <= xs <= self.screen_w - 1.0 and 0.0 <= ys <= self.screen_h - 1.0)

    def action_to_screen(self, raw_args: dict) -> dict:
        """A copy of an action's argument dict with every coordinate pair mapped to screen space.

        Pairs whose values are not both numbers are left as they are (validation reports them).
        """
        out = dict(raw_args)
        for fx, fy in COORD_PAIRS:
            if fx in out and fy in out and _is_number(out[fx]) and _is_number(out[fy]):
                out[fx], out[fy] = self.to_screen(out[fx], out[fy])
        return out

    def action_to_model(self, action: Any) -> dict:
        """An Action (or its dict) as a plain dict with coordinates in model space (floats)."""
        d = dict(action) if isinstance(action, dict) else action.model_dump()
        for fx, fy in COORD_PAIRS:
            if fx in d and fy in d and _is_number(d[fx]) and _is_number(d[fy]):
                d[fx], d[fy] = self.to_model(d[fx], d[fy])
        return d
