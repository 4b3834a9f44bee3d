from decimal import Decimal

import pytest

from respawn_server.jobs.money.pricebook import PriceBookError, load_price_book, parse_price_book

HEADER = "provider,region,zone,instance_type,accelerator,accelerator_count,market,usd_per_hour,source,as_of\n"


def test_it_ships_on_demand_and_spot_for_every_type_the_traces_and_users_need():
    book = load_price_book()
    for itype in ("g5.xlarge", "p3.2xlarge", "p5.48xlarge", "r5.16xlarge", "a3-highgpu-8g",
                  "c3-highcpu-88", "Standard_ND96isr_H100_v5"):
        assert book.for_instance_type(itype, "on_demand"), itype
        assert book.for_instance_type(itype, "spot"), itype
        assert Decimal("0.25") <= book.spot_ratio(itype) <= Decimal("0.45")


def test_it_prefers_a_zone_row_and_falls_back_to_the_region_row():
    book = load_price_book()
    zoned = book.price(provider="aws", region="us-east-1", zone="us-east-1a",
                       instance_type="p3.2xlarge", market="spot")
    other = book.price(provider="aws", region="us-east-1", zone="us-east-1c",
                       instance_type="p3.2xlarge", market="spot")
    assert zoned.zone == "us-east-1a" and other.zone == "us-east-1c"
    assert zoned.usd_per_hour != other.usd_per_hour
    od = book.price(provider="aws", region="us-east-1", zone="us-east-1f",
                    instance_type="p3.2xlarge", market="on_demand")
    assert od.zone == "" and od.usd_per_hour == Decimal("3.0600")
    assert book.price(provider="aws", region="us-east-1", zone="x", instance_type="nope",
                      market="spot") is None


@pytest.mark.parametrize("line,column", [
    ("aws,us-east-1,,p3.2xlarge,V100,1,spot,cheap,src,2024-01-01", "usd_per_hour"),
    ("aws,us-east-1,,p3.2xlarge,V100,1,spot,-1,src,2024-01-01", "usd_per_hour"),
    ("aws,us-east-1,,p3.2xlarge,V100,1,reserved,1,src,2024-01-01", "market"),
    ("ibm,us-east-1,,p3.2xlarge,V100,1,spot,1,src,2024-01-01", "provider"),
    ("aws,us-east-1,,p3.2xlarge,V100,1,spot,1,src,June", "as_of"),
    ("aws,us-east-1,,p3.2xlarge,,1,spot,1,src,2024-01-01", "accelerator"),
    ("aws,,,p3.2xlarge,V100,1,spot,1,src,2024-01-01", "region"),
])
def test_it_names_the_line_and_column_of_bad_input(line, column):
    with pytest.raises(PriceBookError, match=rf"line 3, column '{column}'"):
        parse_price_book(HEADER + "aws,us-east-1,,g5.xlarge,A10G,1,spot,0.3,src,2024-01-01\n" + line)


def test_it_refuses_a_missing_column_and_a_short_row():
    with pytest.raises(PriceBookError, match="lacks column.*as_of"):
        parse_price_book(HEADER.replace(",as_of", "") + "aws,us-east-1,,g5.xlarge,A10G,1,spot,0.3,src\n")
    with pytest.raises(PriceBookError, match="line 2: expected 10 columns"):
        parse_price_book(HEADER + "aws,us-east-1,,g5.xlarge\n")
