"""Money as people read it, the same on the dashboard and in the CLI (so no Django
here): US dollars to the cent, an amount under a cent to its first significant digit
("$0.004", not "$0.00"), and savings with the share of the on-demand baseline they are."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")
FINEST = Decimal("0.00000001")  # the ledger's quantum: nothing finer is known


def usd(amount: str | Decimal) -> str:
    """'$1,234.50', '-$1.01', '$0.004', '$0.00' (never '$-0.00')."""
    value = Decimal(amount)
    shown = value.quantize(CENT, rounding=ROUND_HALF_UP)
    if shown == 0 and value.quantize(FINEST, rounding=ROUND_HALF_UP) != 0:
        shown = value.quantize(Decimal(1).scaleb(value.adjusted()), rounding=ROUND_HALF_UP)
        if abs(shown) >= CENT:  # 0.0096 rounds up to a cent
            shown = value.quantize(CENT, rounding=ROUND_HALF_UP)
    shown = abs(shown) if shown == 0 else shown
    return f"-${-shown:,f}" if shown < 0 else f"${shown:,f}"


def saved_share(savings: str | Decimal, baseline: str | Decimal) -> str | None:
    """Savings as a share of what on-demand would have cost ('58%', '0.4%', '-12%'); None
    while there is no baseline to compare with."""
    baseline = Decimal(baseline)
    if baseline <= 0:
        return None
    percent = Decimal(savings) * 100 / baseline
    places = Decimal("0.1") if abs(percent) < 1 else Decimal(1)
    shown = percent.quantize(places, rounding=ROUND_HALF_UP)
    return "0%" if shown == 0 else f"{shown}%"


def savings_text(savings: str | Decimal, baseline: str | Decimal) -> str:
    """'$0.53 (23%)': the dollars saved and their share of the on-demand baseline."""
    share = saved_share(savings, baseline)
    return f"{usd(savings)} ({share})" if share else usd(savings)
