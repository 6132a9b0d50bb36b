"""Regexes of numbers on one side of a decimal bound agree with Decimal comparison."""

from __future__ import annotations

import re
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from structspec.automata.decimal_bounds import number_at_least, number_at_most

bounds = st.decimals(min_value=-1000, max_value=1000, places=3, allow_nan=False)
numbers = st.builds(
    lambda neg, i, f: ("-" if neg else "") + str(i) + (f".{f}" if f is not None else ""),
    st.booleans(), st.integers(0, 2000),
    st.none() | st.text(alphabet="0123456789", min_size=1, max_size=4),
)


@given(bound=bounds, text=numbers, strict=st.booleans())
@settings(max_examples=3000, deadline=None)
def test_sides_agree_with_decimal(bound, text, strict):
    value = Decimal(text)
    low = re.fullmatch(number_at_least(bound, strict), text) is not None
    high = re.fullmatch(number_at_most(bound, strict), text) is not None
    assert low == (value > bound if strict else value >= bound), (bound, text, strict)
    assert high == (value < bound if strict else value <= bound), (bound, text, strict)
