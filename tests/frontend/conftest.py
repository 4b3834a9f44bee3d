import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def empty_cache():
    # The dashboard caches settled money per process: no test may see another's.
    cache.clear()
    yield
    cache.clear()
