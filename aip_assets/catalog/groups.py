"""How a persona's groups are keyed and said, whatever form the persona takes.

An *axis key* names what a set of personas varies on:
- ``gender``: the axis told explicitly ("I am a woman.");
- ``gender@name``: the same axis signalled by a name from the names catalogue (``names.py``);
- ``gender×ethnicity`` (``×`` is U+00D7): two axes combined, values ``woman×Black``;
  ``gender×ethnicity@name`` when a name carries both.

Group keys are ``<axis key>=<value>`` as everywhere else (``gender@name=woman``,
``gender×ethnicity=woman×Black``). ``group_words`` says a group the way a finding does
("Black women", "women (by name)").
"""

from __future__ import annotations

CROSS = "×"
NAME_SUFFIX = "@name"
FORMS = ("explicit", "name")


def form_axis(axis: str, form: str = "explicit") -> str:
    """The axis key of ``axis`` told in ``form`` (explicit or name)."""
    return axis + NAME_SUFFIX if form == "name" else axis


def combo_axis(axes: tuple[str, ...] | list[str], form: str = "explicit") -> str:
    return form_axis(CROSS.join(axes), form)


def combo_value(values: tuple[str, ...] | list[str]) -> str:
    return CROSS.join(values)


def parse_axis(key: str) -> tuple[tuple[str, ...], str]:
    """(the axes an axis key combines, its form): ``gender×ethnicity@name`` -> (("gender", "ethnicity"), "name")."""
    form = "name" if key.endswith(NAME_SUFFIX) else "explicit"
    base = key[: -len(NAME_SUFFIX)] if form == "name" else key
    return tuple(base.split(CROSS)), form


def is_combination(key: str) -> bool:
    # a text key combines axes exactly when it holds the cross (the form's suffix never does); it is
    # asked of every answer of a run
    return CROSS in key if isinstance(key, str) else len(parse_axis(key)[0]) > 1


_PLURAL = {
    "woman": "women",
    "man": "men",
    "non-binary person": "non-binary people",
    "transgender woman": "transgender women",
    "transgender man": "transgender men",
}


def axis_words(key: str) -> str:
    """``gender@name`` -> "gender (by name)"; ``gender×ethnicity`` -> "gender × ethnicity"."""
    axes, form = parse_axis(key)
    return " × ".join(axes) + (" (by name)" if form == "name" else "")


def group_words(key: str, value: str) -> str:
    """A group as a finding says it: ``gender×ethnicity``, ``woman×Black`` -> "Black women";
    ``gender@name``, ``woman`` -> "gender=woman (by name)"; a single explicit axis -> "gender=woman"."""
    axes, form = parse_axis(key)
    values = value.split(CROSS)
    by = " (by name)" if form == "name" else ""
    if len(axes) == 1 or len(values) != len(axes):
        return f"{CROSS.join(axes)}={value}{by}"
    held = dict(zip(axes, values, strict=True))
    if "gender" in held:
        noun = _PLURAL.get(held["gender"], held["gender"])
        rest = [held[a] for a in axes if a != "gender"]
        return " ".join([*rest, noun]) + by
    return " ".join(values) + " personas" + by


def combination_attributes(
    attrs: dict[str, str], intersections: list[list[str]] | list[tuple[str, str]] | tuple = ()
) -> dict[str, str]:
    """A persona's attributes with, per configured intersection whose two axes it holds, the
    combination: ``{"gender": "woman", "ethnicity": "Black"}`` with ``[[gender, ethnicity]]`` adds
    ``"gender×ethnicity": "woman×Black"``. An axis the persona holds by name (``gender@name``) makes
    the combination one by name (``gender×ethnicity@name``); the explicit key wins when both are held."""
    out = dict(attrs or {})
    for pair in intersections or ():
        got: list[str] = []
        by_name = False
        for axis in pair:
            if axis in out:
                got.append(str(out[axis]))
            elif form_axis(axis, "name") in out:
                got.append(str(out[form_axis(axis, "name")]))
                by_name = True
        if len(got) == len(pair):
            out[combo_axis(tuple(pair), "name" if by_name else "explicit")] = combo_value(got)
    return out
