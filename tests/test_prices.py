import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from respawn_server.jobs.models import PriceQuote
from respawn_server.jobs.money.pricebook import load_price_book
from respawn_server.jobs.money.seed_prices import seed_price_book
from tests.factories import make_team_with_members


@pytest.mark.django_db
def test_migrate_seeds_the_shipped_price_book_and_reloading_adds_nothing():
    book = load_price_book()
    assert PriceQuote.objects.count() == len(book.entries)
    assert seed_price_book() == 0
    call_command("load_pricebook")
    assert PriceQuote.objects.count() == len(book.entries)


@pytest.mark.django_db
def test_price_book_covers_the_common_gpu_types_on_both_markets():
    for provider, instance_type in [("aws", "p4d.24xlarge"), ("aws", "g5.xlarge"), ("gcp", "a2-highgpu-1g"),
                                    ("azure", "Standard_NC24ads_A100_v4")]:
        markets = set(PriceQuote.objects.filter(provider=provider, instance_type=instance_type)
                      .values_list("market", flat=True))
        assert markets == {"spot", "on_demand"}, (provider, instance_type)
    assert not PriceQuote.objects.filter(source="").exists()


@pytest.mark.django_db
def test_prices_are_readable_and_filterable_by_any_signed_in_person():
    setup = make_team_with_members()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.people['outsider'].token}")
    rows = client.get("/api/v1/prices/?provider=aws&instance_type=p5.48xlarge&market=on_demand").json()["results"]
    assert rows and all(r["instance_type"] == "p5.48xlarge" and r["market"] == "on_demand" for r in rows)
