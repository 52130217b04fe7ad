"""Reading ingredient lines, and merging a week's recipes into one shopping list.

Each line is read by ingredient-parser-nlp (a model trained on labelled
recipe lines: quantity, unit, food), and its quantity by pint. A list has one
row per food. Its lines are summed by kind of amount: masses, volumes, and
counts (eggs). A sum keeps the unit its lines share (2 tsp and 1 tsp are 3
tsp); lines of one kind in different units are converted to the unit most
of them used. A food measured both ways keeps both ("300 g + 1½ cups
flour"). What no unit sums (a pinch, three cloves, "salt to taste") is
listed as written, on its food's row when it has one. Each row names the
recipes it came from; how amounts and foods are written is
`mealquest.recipes.kitchen`'s.

The parser's model needs NLTK's English part-of-speech tagger. A deployment
that downloaded NLTK's data has it; otherwise the copy shipped beside this
module is used (`nltk_data/`: the tagger NLTK publishes, as the JSON that
NLTK 3.9 and later read). Loading the model costs about 50 MB and a third of
a second, once per process, at the first list it makes.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import pint

from mealquest.recipes import kitchen

logger = logging.getLogger(__name__)

# The most lines one list reads (a hundred recipes of twenty lines), and the
# longest line it reads: what a page's parse stored is bounded, this too.
MAX_LINES = 2_000
MAX_LINE_CHARS = 500
# The model's cost grows faster than a line's tokens: about 2 ms for "2 cups
# flour", 10-15 ms at this many, 150 ms for 500 commas. A line of more (as
# `_too_many_tokens` counts them) is
# listed as written, unread; real lines have well under half as many.
MAX_LINE_TOKENS = 60
# The largest amount summed, in grams, millilitres or a count (a tonne): a
# larger one is no shopping, and sums of them stay finite.
MAX_QUANTITY = 1_000_000.0

_SHIPPED_NLTK_DATA = Path(__file__).resolve().parent / "nltk_data"
# Units a line's first amount may name that hold its second amount: "2 x 400 g
# tins", "1 (14 ounce) can" are 800 g and 14 oz.
_CONTAINERS = frozenset(
    (
        *("can", "cans", "tin", "tins", "jar", "jars", "pack", "packs", "bag", "bags"),
        *("packet", "packets", "package", "packages", "bottle", "bottles"),
        *("carton", "cartons", "box", "boxes"),
    )
)
_METRIC = frozenset(("gram", "kilogram", "milligram", "milliliter", "liter", "centiliter"))
_SPACES = re.compile(r"\s+")


# The kinds of amount a list sums, each apart from the others.
MASS, VOLUME, COUNT = "mass", "volume", "count"
# The units pint converts each kind to, to test that a line's unit is of it.
_BASES = {MASS: "gram", VOLUME: "milliliter"}


@dataclass(frozen=True)
class Reading:
    """One line as read: its food (None: none found), and its amount in the
    unit it was written in (`unit` as a cook names it, None for a count; its
    kind, and pint's unit to convert it), or no amount to sum."""

    text: str
    food: str | None
    quantity: float | None = None
    unit: str | None = None
    summable: bool = False
    kind: str | None = None
    pint_unit: Any = None


@dataclass(frozen=True)
class Amount:
    """One kind of amount of a row: a quantity, in `unit` (None: a count)."""

    quantity: float
    unit: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"quantity": self.quantity, "unit": self.unit}


@dataclass
class Item:
    """One row of the shopping list: a food, its amounts (the kind most of its
    lines used first; none when every line is listed as written), and the
    recipes it came from."""

    food: str
    amounts: list[Amount]
    text: str
    sources: list[str] = field(default_factory=list)

    @property
    def quantity(self) -> float | None:
        return self.amounts[0].quantity if self.amounts else None

    @property
    def unit(self) -> str | None:
        return self.amounts[0].unit if self.amounts else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "food": self.food,
            "quantity": self.quantity,
            "unit": self.unit,
            "amounts": [amount.as_dict() for amount in self.amounts],
            "text": self.text,
            "from": list(self.sources),
        }


@functools.cache
def _parser() -> Any:
    """ingredient-parser's `parse_ingredient`, with NLTK's tagger findable
    (the deployment's own data first, then the shipped copy)."""
    import nltk

    shipped = str(_SHIPPED_NLTK_DATA)
    if shipped not in nltk.data.path:
        nltk.data.path.append(shipped)
    from ingredient_parser import parse_ingredient

    return parse_ingredient


def read_line(line: str) -> Reading:
    """What `line` says: its food, and its amount where it can be summed; a
    line that cannot be read (too many tokens, or one the model fails on,
    such as "2 nan breads" or "1/0 cup milk") is kept as written."""
    text = _SPACES.sub(" ", line).strip()[:MAX_LINE_CHARS]
    if not text or _too_many_tokens(text):
        return Reading(text, None)
    try:
        parsed = _parser()(text)
        food = " and ".join(name.text for name in parsed.name) or None
        amounts = list(parsed.amount)
    except Exception as error:
        # The model is a library reading a stranger's text: whatever it
        # fails with (ValueError for "nan", ZeroDivisionError for "1/0",
        # OverflowError for a 400-digit number), the line is unread.
        logger.info("ingredient line kept as written: the parser raised %s", type(error).__name__)
        return Reading(text, None)
    if food is not None:
        food = food.strip().lower()
    try:
        return _amount(text, food, amounts)
    except (ArithmeticError, ValueError):  # 1e308 kg: past a float in grams
        return Reading(text, food)


def _too_many_tokens(text: str) -> bool:
    """Whether `text` has more than `MAX_LINE_TOKENS`, counting a run of
    letters as one and every other character but a space as one ("½" is a
    number to the model, "250g" three digits and a unit): never fewer than
    the model's own tokens."""
    count = 0
    in_word = False
    for character in text:
        if character.isalpha():
            count += not in_word
            in_word = True
        else:
            count += not character.isspace()
            in_word = False
    return count > MAX_LINE_TOKENS


def _amount(text: str, food: str | None, amounts: list[Any]) -> Reading:
    if not amounts:
        return Reading(text, food)
    first = amounts[0]
    quantity = first.quantity
    multiplier = Fraction(1)
    if (
        isinstance(first.unit, str)
        and (first.unit.lower() in _CONTAINERS or first.MULTIPLIER)
        and len(amounts) > 1
    ):
        # "2 x 400 g tins": the measured amount, as many times as there are.
        multiplier = quantity if isinstance(quantity, Fraction) else Fraction(1)
        first = amounts[1]
        quantity = first.quantity
    elif len(amounts) > 1:
        # "1/2 cup (120 ml)": the metric amount, as written, over a conversion.
        metric = [a for a in amounts if not isinstance(a.unit, str) and str(a.unit) in _METRIC]
        if metric:
            first = metric[0]
            quantity = first.quantity
    if not isinstance(quantity, Fraction | int | float):
        return Reading(text, food)
    value = float(quantity * multiplier)
    unit = first.unit
    if isinstance(unit, str):
        if unit == "":
            return _bounded(Reading(text, food, value, None, True, COUNT), value)
        return Reading(text, food)  # a pinch, three cloves: as written
    for kind, base in _BASES.items():
        try:
            in_base = float((value * unit).to(base).magnitude)
        except pint.errors.PintError:  # another dimension (a mass is no volume)
            continue
        name = kitchen.unit_name(str(unit))
        return _bounded(Reading(text, food, value, name, True, kind, unit), in_base)
    return Reading(text, food)


def _bounded(reading: Reading, in_base: float) -> Reading:
    """`reading`, or the line as written if its amount (`in_base`: in grams,
    millilitres or a count) is not a finite one to shop for."""
    quantity = reading.quantity
    if (
        quantity is not None
        and math.isfinite(quantity)
        and math.isfinite(in_base)
        and 0 <= in_base <= MAX_QUANTITY
    ):
        return reading
    return Reading(reading.text, reading.food)


def merge(recipes: Iterable[tuple[str, Sequence[str]]]) -> list[Item]:
    """One list from `(title, ingredient lines)` of each recipe: a row per
    food, in the order foods first appear (see the module), then the lines
    whose food could not be told, as written."""
    rows: dict[str, _Row] = {}
    unread: list[Item] = []
    read = 0
    for title, lines in recipes:
        for line in lines:
            if read == MAX_LINES:
                break
            read += 1
            reading = read_line(line)
            if not reading.text:
                continue
            if reading.food is None:
                unread.append(Item(reading.text, [], reading.text, [title]))
                continue
            key = kitchen.singular(reading.food)
            row = rows.setdefault(key, _Row(reading.food))
            row.add(reading, title)
    return [row.item() for row in rows.values()] + unread


@dataclass
class _Row:
    """The lines of one food while a list is merged."""

    food: str
    summed: dict[str, list[Reading]] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def add(self, reading: Reading, title: str) -> None:
        if reading.summable and reading.kind is not None:
            self.summed.setdefault(reading.kind, []).append(reading)
        elif reading.text not in self.written:
            self.written.append(reading.text)
        if title not in self.sources:
            self.sources.append(title)

    def item(self) -> Item:
        # The kind most lines used first; a count last in the text, where
        # its food reads as its noun ("300 g + 2 onions").
        kinds = sorted(self.summed, key=lambda kind: -len(self.summed[kind]))
        amounts = [_sum(self.summed[kind]) for kind in kinds]
        food = self.food
        count = next((a for kind, a in zip(kinds, amounts, strict=True) if kind == COUNT), None)
        if count is not None:
            food = kitchen.plural(food) if count.quantity > 1 else kitchen.singular(food)
        ordered = sorted(amounts, key=lambda amount: amount.unit is None)
        parts = [kitchen.amount_text(amount.quantity, amount.unit) for amount in ordered]
        text = f"{' + '.join(parts)} {food}" if parts else "; ".join(self.written)
        if parts and self.written:
            text += f" (also: {'; '.join(self.written)})"
        return Item(food, amounts, text, list(self.sources))


def _sum(readings: list[Reading]) -> Amount:
    """The readings of one kind summed: in the unit they share, or else in
    the unit most of them used (the first such, on a tie), converted; then
    rounded as a kitchen rounds."""
    units = [reading.unit for reading in readings]
    unit = max(dict.fromkeys(units), key=units.count)
    if all(reading.unit == unit for reading in readings):
        total = sum(reading.quantity or 0.0 for reading in readings)
    else:
        target = next(reading.pint_unit for reading in readings if reading.unit == unit)
        total = sum(
            float(((reading.quantity or 0.0) * reading.pint_unit).to(target).magnitude)
            for reading in readings
        )
    if unit is not None:
        total, unit = kitchen.larger_unit(total, unit)
    return Amount(kitchen.rounded(total, unit), unit)
