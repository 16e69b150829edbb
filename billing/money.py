"""Costs as people read them: in the site's currency (`BILLING_CURRENCY`), with as many decimals as
the amount needs. The ledger keeps six decimal places, and most answers cost a fraction of a cent,
so a fixed two places would show nearly every answer as free, and a fixed six reads as noise."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings

# Codes shown as a symbol before the amount; any other code follows it ("0.0012 CHF").
SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "CNY": "¥", "INR": "₹"}
LEDGER_PLACES = 6  # the ledger's own precision (UsageRecord.cost)
SIGNIFICANT = 2  # figures kept of an amount under one unit


def money_places(amount: Decimal) -> int:
    """Decimal places to show `amount` with: two from one unit up (cents), and under one unit enough
    for two significant figures, at least two and at most the ledger's six."""
    amount = abs(amount)
    if amount >= 1 or amount == 0:
        return 2
    # adjusted(): the exponent of the first significant figure (0.0012 → -3).
    return max(2, min(LEDGER_PLACES, -amount.adjusted() + SIGNIFICANT - 1))


def money_format(amount: Decimal | int | float | str, *, currency: str | None = None) -> str:
    """`amount` in `currency` (default: the site's), e.g. `$0.0012`, `$1,234.50`, `0.50 CHF`.

    An amount that rounds away to nothing at the ledger's precision but is not nothing reads
    "< $0.000001", never as free."""
    code = (currency or settings.BILLING_CURRENCY).upper()
    value = Decimal(str(amount))
    places = money_places(value)
    shown = value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    smallest = Decimal(1).scaleb(-LEDGER_PLACES)
    below = value != 0 and abs(value) < smallest
    if below:
        shown = smallest
    # Trailing zeros past the cents say nothing ($0.0003, not $0.00030).
    exponent = shown.normalize().as_tuple().exponent
    if isinstance(exponent, int):  # not NaN or infinity
        places = max(2, min(places, -exponent))
    sign = "-" if shown < 0 and not below else ""
    number = f"{abs(shown):,.{places}f}"
    symbol = SYMBOLS.get(code)
    text = f"{sign}{symbol}{number}" if symbol else f"{sign}{number} {code}"
    return f"< {text}" if below else text


def money_json(amount: Decimal) -> dict[str, object]:
    """A cost as a socket frame carries it: the number, its currency, and how the page shows it."""
    return {"amount": float(amount), "currency": settings.BILLING_CURRENCY, "text": money_format(amount)}
