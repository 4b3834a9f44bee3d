"""An API client signed in as one of the test people."""

from rest_framework.test import APIClient


def client_for(person) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {person.token}")
    return client
