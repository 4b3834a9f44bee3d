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
    return _dollars(shown)


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


def money_figures(spent: str | Decimal, savings: str | Decimal, baseline: str | Decimal) -> dict[str, str]:
    """Spent, on-demand and saved as read side by side, so that spent + saved = on-demand
    to the last digit shown: all three at one precision (cents; for a figure under a dollar
    too small for cents to tell apart, its first two significant digits), saved shown as
    on-demand less spent at that precision. Keys: spent, on_demand_baseline, savings (with
    its share of on-demand, from the exact figures)."""
    exact = [Decimal(spent), Decimal(baseline)]
    step = CENT
    for value in (*exact, Decimal(savings)):
        if value != 0 and abs(value) < Decimal("0.1"):
            step = min(step, max(FINEST, Decimal(1).scaleb(value.adjusted() - 1)))
    shown_spent, shown_baseline = (v.quantize(step, rounding=ROUND_HALF_UP) for v in exact)
    saved = shown_baseline - shown_spent
    share = saved_share(savings, baseline)
    return {"spent": _dollars(shown_spent), "on_demand_baseline": _dollars(shown_baseline),
            "savings": f"{_dollars(saved)} ({share})" if share else _dollars(saved)}


def _dollars(shown: Decimal) -> str:
    shown = abs(shown) if shown == 0 else shown
    return f"-${-shown:,f}" if shown < 0 else f"${shown:,f}"
