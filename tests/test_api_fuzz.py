"""Schemathesis over the service's whole OpenAPI document, as a user and as an administrator: no request, valid
or not, gets a 5xx, and every answer keeps the document's promises (status codes, content types, headers,
bodies). The service as ``assemble`` builds it on the demo pool, over ASGI, with a stand-in hub for tokens.

Bounded to fit CI: ``EXAMPLES`` cases per operation, each sent with both tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_telemetry_api import USERS, Service
from token_hub import token_hub

from gpupool.spawner.service.api.app import API_ROUTERS

EXAMPLES = 10
TOKENS = ("alice-token", "admin-token")  # a user and an administrator
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
sent: dict[str, int] = {"requests": 0}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with token_hub(USERS) as hub_api:
        yield Service(tmp_path_factory.mktemp("fuzz"), hub_api)  # alice, bob and carol hold leases


@pytest.fixture(scope="module")
def api_schema(service: Service) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi(f"{service.parts.api_base}/openapi.json", service.app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx_or_an_answer_the_document_does_not_promise(case: schemathesis.Case) -> None:
    for token in TOKENS:
        case.call_and_validate(headers={"Authorization": f"token {token}"}, checks=CHECKS)
        sent["requests"] += 1


def test_the_fuzzing_covered_every_route_of_the_api(
    service: Service, api_schema: schemathesis.BaseSchema
) -> None:
    documented = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    base = service.parts.api_base
    routes = {
        (method, base + route.path)
        for router in API_ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    assert documented == routes
    assert sent["requests"] >= len(routes) * len(TOKENS)
    print(f"schemathesis: {sent['requests']} requests over {len(routes)} operations")
