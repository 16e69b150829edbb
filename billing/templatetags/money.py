"""`{{ cost|money }}`: a cost in the site's currency, as `billing.money` formats it."""

from __future__ import annotations

from decimal import Decimal

from django import template

from billing.money import money_format

register = template.Library()


@register.filter(name="money")
def money(value: Decimal | int | float | str | None) -> str:
    return money_format(value or 0)
