"""Reading ingredient lines, and merging a week's recipes into one shopping list.

Each line is read by ingredient-parser-nlp (a model trained on labelled
recipe lines: quantity, unit, food), and its quantity by pint: lines of the
same food are summed where their units convert, by mass (grams) or by volume
(millilitres), and counted where they have no unit (eggs); the rest (a
pinch, three cloves, "salt to taste") is listed as written. Each item names
the recipes it came from.

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


@dataclass(frozen=True)
class Reading:
    """One line as read: its food (None: none found), and its amount in grams,
    millilitres or a count (`unit` "g", "ml" or None), or no amount to sum."""

    text: str
    food: str | None
    quantity: float | None = None
    unit: str | None = None
    summable: bool = False


@dataclass
class Item:
    """One line of the shopping list."""

    food: str
    quantity: float | None
    unit: str | None
    text: str
    sources: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "food": self.food,
            "quantity": self.quantity,
            "unit": self.unit,
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
            return _bounded(Reading(text, food, value, None, summable=True))
        return Reading(text, food)  # a pinch, three cloves: as written
    for target, name in (("gram", "g"), ("milliliter", "ml")):
        try:
            converted = (value * unit).to(target).magnitude
        except pint.errors.PintError:  # another dimension (a mass is no volume)
            continue
        return _bounded(Reading(text, food, float(converted), name, summable=True))
    return Reading(text, food)


def _bounded(reading: Reading) -> Reading:
    """`reading`, or the line as written if its amount is not a finite one to shop for."""
    quantity = reading.quantity
    if quantity is None or (math.isfinite(quantity) and 0 <= quantity <= MAX_QUANTITY):
        return reading
    return Reading(reading.text, reading.food)


def _key(food: str) -> str:
    """The food as lines of it are grouped: "eggs" and "egg" together."""
    if len(food) > 3 and food.endswith("s") and not food.endswith("ss"):
        return food[:-1]
    return food


def merge(recipes: Iterable[tuple[str, Sequence[str]]]) -> list[Item]:
    """One list from `(title, ingredient lines)` of each recipe: the lines of
    one food summed in each unit they convert to (see the module), the rest
    listed as written; in the order foods first appear."""
    items: dict[tuple[str, str | None], Item] = {}
    written: list[Item] = []
    read = 0
    for title, lines in recipes:
        for line in lines:
            if read == MAX_LINES:
                break
            read += 1
            reading = read_line(line)
            if not reading.text:
                continue
            if reading.food is None or not reading.summable or reading.quantity is None:
                written.append(
                    Item(reading.food or reading.text, None, None, reading.text, [title])
                )
                continue
            key = (_key(reading.food), reading.unit)
            item = items.get(key)
            if item is None:
                items[key] = Item(reading.food, reading.quantity, reading.unit, "", [title])
            else:
                item.quantity = (item.quantity or 0.0) + reading.quantity
                if title not in item.sources:
                    item.sources.append(title)
    summed = list(items.values())
    for item in summed:
        quantity = item.quantity or 0.0
        # Whole grams and millilitres; hundredths below ten (a quarter onion).
        item.quantity = float(round(quantity)) if quantity >= 10 else round(quantity, 2)
        amount = f"{item.quantity:g}"
        item.text = f"{amount} {item.unit} {item.food}" if item.unit else f"{amount} {item.food}"
    return summed + written
