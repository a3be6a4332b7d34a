"""The CRD's patterns and the models' checks (api/kubernetes_rules.py) accept the same values, and the quantity
parser reads what Kubernetes reads."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_autopilot.api import kubernetes_rules as rules

_TEXT = st.text(alphabet=st.sampled_from("aZ09-_./=: \n'[]@"), max_size=70)


@pytest.mark.parametrize(("pattern", "max_length", "problem"), [
    (rules.DNS1035_LABEL, rules.DNS1035_LABEL_MAX, rules.object_name_problem),
    (rules.DNS1123_SUBDOMAIN, rules.DNS1123_SUBDOMAIN_MAX, rules.subdomain_problem),
    (rules.LABEL_VALUE, rules.LABEL_VALUE_MAX, rules.label_value_problem),
    (rules.ENV_VAR_NAME, 10**6, rules.env_var_name_problem),
    (rules.CONFIG_KEY, rules.DNS1123_SUBDOMAIN_MAX, rules.config_key_problem),
    (rules.IMAGE_REFERENCE, rules.IMAGE_MAX, rules.image_problem),
    (rules.QUANTITY, 10**6, rules.quantity_problem),
    (rules.LABEL_KEY, rules.LABEL_KEY_MAX, rules.label_key_problem),
])
@settings(max_examples=300, derandomize=True, database=None)
@given(value=_TEXT)
def test_schema_patterns_agree_with_the_checks(pattern: str, max_length: int, problem: Any, value: str) -> None:
    in_schema = len(value) <= max_length and re.fullmatch(pattern, value) is not None
    if problem is rules.label_key_problem:  # the CRD cannot count the prefix and name parts: the model is stricter
        assert in_schema or problem(value) is not None
    else:
        assert in_schema == (problem(value) is None), value


@pytest.mark.parametrize(("text", "value"), [
    ("24Gi", 24 * 2**30), ("500m", Fraction(1, 2)), ("1.5e3", 1500), ("1.", 1), (".5", Fraction(1, 2)),
    ("1Ei", 2**60), ("1E", 10**18), ("2e-3", Fraction(1, 500)), ("0.5Gi", 2**29), (7, 7), ("0", 0),
])
def test_quantities_are_parsed_exactly(text: int | str, value: Fraction) -> None:
    assert rules.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["-1", "lots", "1K", "1e", "", " 1", "1Gi ", "+1", True, -1, 1.5])
def test_what_is_not_a_non_negative_quantity_is_refused(text: Any) -> None:
    with pytest.raises(ValueError):
        rules.parse_quantity(text)
