"""Costs as the pages show them: the site's currency, and as many decimals as the amount needs."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.template import Context, Template

from billing.money import money_format, money_json


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        ("0", "$0.00"),
        ("0.000000", "$0.00"),  # the ledger's zero is not "0.000000"
        ("0.0012", "$0.0012"),
        ("0.001234", "$0.0012"),  # two significant figures under one unit
        ("0.000300", "$0.0003"),  # no trailing zeros past the cents
        ("0.000001", "$0.000001"),  # the ledger's smallest amount still shows
        ("0.0000004", "< $0.000001"),  # never shown as free when it is not
        ("0.0123", "$0.012"),
        ("0.099999", "$0.10"),
        ("0.5", "$0.50"),
        ("1", "$1.00"),
        ("1234.5", "$1,234.50"),
        ("-0.0012", "-$0.0012"),
    ],
)
def test_a_cost_reads_with_its_currency_and_sensible_precision(amount, shown):
    assert money_format(Decimal(amount)) == shown


def test_a_currency_without_a_symbol_follows_the_amount_and_the_setting_picks_the_currency(settings):
    assert money_format(Decimal("0.0012"), currency="CHF") == "0.0012 CHF"
    settings.BILLING_CURRENCY = "EUR"
    assert money_format(Decimal("2.5")) == "€2.50"
    assert money_json(Decimal("0.0012")) == {"amount": 0.0012, "currency": "EUR", "text": "€0.0012"}


def test_templates_show_costs_through_the_money_filter():
    rendered = Template("{% load money %}{{ cost|money }}").render(Context({"cost": Decimal("0.000800")}))
    assert rendered == "$0.0008"
