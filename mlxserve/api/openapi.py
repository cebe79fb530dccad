"""GET /openapi.json: quart-schema's document from the pydantic request models, made true to
this server: the limits its flags set, and the API key it asks for."""

from __future__ import annotations

from typing import Any

from quart_schema import QuartSchema
from quart_schema.openapi import OpenAPIProvider

from ..settings import Settings
from .llamacpp.protocol import NativeCompletionRequest
from .protocol import LIMITED_FIELDS, CompletionRequest


def install(app, settings: Settings) -> QuartSchema:
    auth = {}
    if settings.api_key:
        auth = {
            "security_schemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
            "security": [{"apiKey": []}],
        }
    return QuartSchema(
        app,
        openapi_path="/openapi.json",
        redoc_ui_path=None,
        scalar_ui_path=None,
        swagger_ui_path="/docs",
        info={"title": "mlxserve", "version": "0.1.0"},
        openapi_provider_class=_provider(settings),
        **auth,
    )


def _provider(settings: Settings) -> type[OpenAPIProvider]:
    class Provider(OpenAPIProvider):
        def schema(self) -> dict[str, Any]:
            document = super().schema()
            require_bodies(document)
            state_limits(document, settings)
            return document

    return Provider


def limited_names() -> dict[str, str]:
    """Each accepted name of a limited field (aliases too) -> its Limits attribute."""
    names = {}
    for model in (CompletionRequest, NativeCompletionRequest):
        for field, limit in LIMITED_FIELDS.items():
            alias = model.model_fields[field].validation_alias
            for name in [field, *(alias.choices if alias else [])]:
                names[name] = limit
    return names


def require_bodies(document: dict[str, Any]) -> None:
    """Every route that documents a body needs one (OpenAPI's default is optional)."""
    for operations in document["paths"].values():
        for operation in operations.values():
            if "requestBody" in operation:
                operation["requestBody"]["required"] = True


def state_limits(document: dict[str, Any], settings: Settings) -> None:
    """Write each limited field's `maximum` (this server's flag) into every request body."""
    names = limited_names()
    for operations in document["paths"].values():
        for operation in operations.values():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            properties = (body or {}).get("schema", {}).get("properties", {})
            for name, limit in names.items():
                if name in properties:
                    _set_integer_maximum(properties[name], getattr(settings.limits, limit))


def _set_integer_maximum(schema: dict[str, Any], maximum: int) -> None:
    if schema.get("type") == "integer":
        schema["maximum"] = maximum
    for branch in schema.get("anyOf", []):
        _set_integer_maximum(branch, maximum)
