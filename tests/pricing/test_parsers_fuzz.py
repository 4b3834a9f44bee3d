"""The parsers of outside price data never crash on garbage: a malformed row is
skipped (and logged), a page that is not JSON at all is a PriceRefreshError, and
whatever they do return fits PriceQuote."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from respawn_server.jobs.money.refreshers import PriceRefreshError, aws, azure, gcp
from respawn_server.jobs.money.prices import Quote
from respawn_server.jobs.money.refreshers.quotes import decode_json_object, store_quotes
from tests.emulators.azure_prices import meter_row
from tests.emulators.gcp_billing import sku

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=60),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
# Aware datetimes at offsets that push year 1 or 9999 out of range in UTC.
OFFSETS = st.sampled_from([dt.timezone(dt.timedelta(hours=h)) for h in (-12, 0, 1, 14)])
outside_values = (
    json_values | st.datetimes() | st.datetimes(timezones=OFFSETS) | st.datetimes(timezones=OFFSETS).map(str)
    | st.sampled_from(["", " ", "nan", "-1", "1e400", "0.0000001", "99999999", "x" * 80, "us-east-1a\x00",
                       "2026-13-01T00:00:00Z", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
)

AZURE_ROW = meter_row("Standard_NC24ads_A100_v4", "eastus", "NC24ads A100 v4 Spot",
                      "Virtual Machines NCadsA100v4 Series", 1.2855, "Consumption", "2026-11-01T00:00:00Z")
GCP_SKU = sku("Nvidia Tesla A100 GPU running in Americas", "GPU", "OnDemand", ["us-central1"], "h", 2.93,
              "2026-11-01T00:00:00Z")
AWS_ROW = {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
           "SpotPrice": "0.3320", "Timestamp": dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)}


@st.composite
def mutated(draw, row: dict):
    """A real row with some fields replaced by garbage or removed, nested ones too."""
    row = json.loads(json.dumps(row, default=str)) if not any(isinstance(v, dt.datetime) for v in row.values()) \
        else dict(row)
    for _ in range(draw(st.integers(1, 3))):
        target, key = _pick(draw, row)
        if target is None:
            continue
        if draw(st.booleans()):
            del target[key]
        else:
            target[key] = draw(outside_values)
    return row


def _pick(draw, row):
    target = row
    while True:
        keys = list(target) if isinstance(target, dict) else list(range(len(target))) if isinstance(target, list) else []
        if not keys:
            return None, None
        key = draw(st.sampled_from(keys))
        if isinstance(target[key], (dict, list)) and target[key] and draw(st.booleans()):
            target = target[key]
            continue
        return target, key


def assert_fits_price_quote(quotes):
    for quote in quotes:
        assert isinstance(quote, Quote)
        assert Decimal(0) < quote.usd_per_hour < Decimal(10) ** 5
        assert quote.usd_per_hour == quote.usd_per_hour.quantize(Decimal("0.00001"))
        assert quote.observed_at.utcoffset() == dt.timedelta(0)
        assert quote.market in ("spot", "on_demand")


@pytest.mark.parametrize("text", ["<html><body>502 Bad Gateway</body></html>", "", "Items: []", "{'Items': []}"])
def test_a_page_that_is_not_json_is_a_price_refresh_error_naming_what_came(text):
    with pytest.raises(PriceRefreshError, match="not JSON"):
        decode_json_object(text, "azure retail prices")


@FUZZ
@given(text=st.text(max_size=200) | json_values.map(json.dumps))
@example(text='{"Items": "none"}')
@example(text='{"skus": {"a": 1}}')
@example(text="[1, 2]")
def test_any_text_as_a_page_is_quotes_or_a_price_refresh_error(text):
    try:
        page = decode_json_object(text, "fuzz")
        azure_quotes = list(azure.parse_page(page))
        gcp_parts = list(gcp.parse_page(page, {"us-central1"}))
    except PriceRefreshError:
        return
    assert_fits_price_quote(azure_quotes)
    assert all(p.usd_per_unit.is_finite() for p in gcp_parts)


@FUZZ
@given(items=st.lists(mutated(AZURE_ROW) | outside_values, max_size=5))
def test_azure_items_with_garbage_never_raise(items):
    assert_fits_price_quote(azure.parse_page({"Items": items}))


@FUZZ
@given(skus=st.lists(mutated(GCP_SKU) | outside_values, max_size=5))
def test_gcp_skus_with_garbage_never_raise(skus):
    parts = {(p.region, p.market, p.part): p for p in gcp.parse_page({"skus": skus}, {"us-central1"})}
    for part in (("core", "A2"), ("ram", "A2")):
        parts[("us-central1", "on_demand", part)] = gcp.PartPrice("us-central1", "on_demand", part, Decimal("0.03"),
                                                                   dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc))
    assert_fits_price_quote(gcp.compose("us-central1", "a2-highgpu-1g", parts))


@FUZZ
@given(rows=st.lists(mutated(AWS_ROW) | outside_values, max_size=5))
def test_aws_history_rows_with_garbage_never_raise(rows):
    assert_fits_price_quote(aws.parse_page({"SpotPriceHistory": rows}, "us-east-1"))


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(mutated(AZURE_ROW), min_size=1, max_size=4))
def test_whatever_a_parser_accepts_the_database_stores(items):
    store_quotes(azure.parse_page({"Items": items}))


NASTY = ["", " ", "nan", "-1", "1e400", "0.0000001", "99999999", "x" * 80, "us-east-1a\x00", "2026-13-01T00:00:00Z",
         "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", None, True, 0, -1.5, float("nan"), float("inf"),
         [], {}, dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))), dt.datetime(2026, 11, 1)]


def test_each_field_of_a_real_row_set_to_each_nasty_value_is_skipped_or_still_fits():
    """Deterministic companion to the fuzzing: every field × every value known to hurt."""
    for real, parse in ((AZURE_ROW, lambda r: azure.parse_page({"Items": [r]})),
                        (AWS_ROW, lambda r: aws.parse_page({"SpotPriceHistory": [r]}, "us-east-1"))):
        for name in real:
            for value in NASTY:
                assert_fits_price_quote(parse({**real, name: value}))
    for name in ("description", "serviceRegions", "pricingInfo"):
        for value in NASTY:
            list(gcp.parse_page({"skus": [{**GCP_SKU, name: value}]}, {"us-central1"}))
    info = GCP_SKU["pricingInfo"][0]
    for value in NASTY:
        broken = {**GCP_SKU, "pricingInfo": [{**info, "effectiveTime": value}]}
        list(gcp.parse_page({"skus": [broken]}, {"us-central1"}))
