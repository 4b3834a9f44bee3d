"""One error shape for every API answer: {"detail": ..., "errors": {field: [msg]}}."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc, context):
    exc = _from_django(exc)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ValidationError):
        errors = response.data if isinstance(response.data, dict) else {"non_field_errors": response.data}
        fields = ", ".join(sorted(errors)) or "body"
        return Response({"detail": f"invalid fields: {fields}", "errors": errors}, status=status.HTTP_400_BAD_REQUEST)
    return response


def _from_django(exc):
    """Django's refusals of an oversized request, which it would answer with an HTML
    400 page, as API errors with a JSON body."""
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge(f"Body larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.")
    if isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        return ParseError(str(exc))
    return exc


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


class Unauthorized(APIException):
    """401 from a view that takes credentials in its body (login, agent register):
    DRF would turn AuthenticationFailed into 403 there, having no auth scheme."""

    status_code = status.HTTP_401_UNAUTHORIZED
    default_code = "unauthorized"
