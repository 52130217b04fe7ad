"""How a shopping list writes amounts and foods: as a cook reads them.

A list is read in a shop, so its amounts are in the units a cook measures
with (2 tsp, not 9.86 ml), rounded as a kitchen rounds (1½ cups, ⅓ onion,
whole grams past ten), and a food counted more than once is plural
(3 onions). These are the list's words only: what is summed, and how, is
`mealquest.recipes.ingredients`'.
"""

from __future__ import annotations

import math

# pint's names of the units lines use, as a cook writes them. A unit not
# named here is written as pint names it.
UNIT_NAMES = {
    "gram": "g",
    "kilogram": "kg",
    "milligram": "mg",
    "milliliter": "ml",
    "liter": "l",
    "centiliter": "cl",
    "deciliter": "dl",
    "teaspoon": "tsp",
    "tablespoon": "tbsp",
    "cup": "cup",
    "fluid_ounce": "fl oz",
    "ounce": "oz",
    "pound": "lb",
    "pint": "pint",
    "quart": "quart",
    "gallon": "gallon",
}
# Units written plural past one (the abbreviations never are).
_PLURAL_UNITS = frozenset(("cup", "pint", "quart", "gallon"))
# Metric units, rounded to whole numbers past ten; the rest in kitchen fractions.
_METRIC = frozenset(("g", "kg", "mg", "ml", "l", "cl", "dl"))
# A metric sum past a thousand of these reads better in the larger unit.
_LARGER = {"g": ("kg", 1000.0), "ml": ("l", 1000.0)}
# The fractions a kitchen measures with (quarters and thirds), and how they are written.
_FRACTIONS = {
    0.25: "¼",
    1 / 3: "⅓",
    0.5: "½",
    2 / 3: "⅔",
    0.75: "¾",
}
# Past this, a kitchen amount is a whole number.
_WHOLE_FROM = 10.0

# Foods whose plural is not the word and an s.
_IRREGULAR_PLURALS = {
    "tomato": "tomatoes",
    "potato": "potatoes",
    "mango": "mangoes",
    "leaf": "leaves",
    "loaf": "loaves",
    "half": "halves",
    "knife": "knives",
}
_IRREGULAR_SINGULARS = {plural: singular for singular, plural in _IRREGULAR_PLURALS.items()}


def unit_name(pint_name: str) -> str:
    """The kitchen's name of a unit pint names `pint_name`."""
    return UNIT_NAMES.get(pint_name, pint_name.replace("_", " "))


def larger_unit(quantity: float, unit: str) -> tuple[float, str]:
    """`quantity` of `unit` in the larger metric unit when it is past a
    thousand (2,500 g is 2.5 kg); otherwise as it is."""
    larger = _LARGER.get(unit)
    if larger is not None and quantity >= larger[1]:
        return quantity / larger[1], larger[0]
    return quantity, unit


def rounded(quantity: float, unit: str | None) -> float:
    """`quantity` as the list gives it: metric amounts whole past ten and to a
    tenth below (2.5 g of yeast); spoons, cups, ounces and counts to the
    nearest quarter or third below ten, whole above."""
    if unit in _METRIC:
        if unit in ("kg", "l"):
            return round(quantity, 2)
        return float(round(quantity)) if quantity >= _WHOLE_FROM else round(quantity, 1)
    if quantity >= _WHOLE_FROM:
        return float(round(quantity))
    whole = math.floor(quantity)
    part = quantity - whole
    candidates = [0.0, 1.0, *_FRACTIONS]
    nearest = min(candidates, key=lambda fraction: abs(part - fraction))
    if whole + nearest == 0:
        # Never "0 onion": the smallest kitchen fraction.
        nearest = 0.25
    return round(whole + nearest, 3)


def amount_text(quantity: float, unit: str | None) -> str:
    """`quantity` (as `rounded` gives it) written for a cook: "1½", "¾ cup",
    "2 cups", "250 g"."""
    if unit in _METRIC or quantity >= _WHOLE_FROM:
        number = f"{quantity:g}"
    else:
        whole = math.floor(quantity)
        part = quantity - whole
        symbol = next(
            (text for fraction, text in _FRACTIONS.items() if abs(part - fraction) < 0.01), None
        )
        if symbol is None:
            number = f"{quantity:g}"
        elif whole:
            number = f"{whole}{symbol}"
        else:
            number = symbol
    if unit is None:
        return number
    if unit in _PLURAL_UNITS and quantity > 1:
        unit += "s"
    return f"{number} {unit}"


def singular(food: str) -> str:
    """`food` with its last word singular ("eggs" -> "egg", "cherry
    tomatoes" -> "cherry tomato"): how lines of one food are grouped."""
    head, _, last = food.rpartition(" ")
    if last in _IRREGULAR_SINGULARS:
        word = _IRREGULAR_SINGULARS[last]
    elif len(last) > 4 and last.endswith("ies"):
        word = last[:-3] + "y"
    elif len(last) > 4 and last.endswith(("ches", "shes", "xes")):
        word = last[:-2]
    elif len(last) > 3 and last.endswith("s") and not last.endswith(("ss", "us", "is")):
        word = last[:-1]
    else:
        word = last
    return f"{head} {word}" if head else word


def plural(food: str) -> str:
    """`food` with its last word plural ("onion" -> "onions", "cherry" ->
    "cherries"); a word already plural stays as it is."""
    head, _, last = food.rpartition(" ")
    if singular(last) != last:
        word = last
    elif last in _IRREGULAR_PLURALS:
        word = _IRREGULAR_PLURALS[last]
    elif last.endswith("y") and len(last) > 1 and last[-2] not in "aeiou":
        word = last[:-1] + "ies"
    elif last.endswith(("s", "x", "z", "ch", "sh")):
        word = last + "es"
    else:
        word = last + "s"
    return f"{head} {word}" if head else word
