"""GET /openapi.json: quart-schema's document from the pydantic request models, made true to
this server: the limits its flags set, and the API key it asks for. GET /docs: Swagger UI on it,
its script and stylesheet served from here (swagger-ui-py ships them), so it works offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import swagger_ui
from quart import render_template_string, send_from_directory, url_for
from quart_schema import QuartSchema, hide
from quart_schema.openapi import OpenAPIProvider
from werkzeug.exceptions import NotFound

from ..settings import Settings
from .llamacpp.protocol import NativeCompletionRequest
from .protocol import CompletionRequest

SWAGGER_UI_FILES = Path(swagger_ui.__file__).parent / "static"
SWAGGER_UI_ASSETS = frozenset({"swagger-ui.css", "swagger-ui-bundle.js"})
# validatorUrl null: Swagger UI would otherwise send the document's URL to validator.swagger.io.
SWAGGER_UI_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>mlxserve API</title>
  <link rel="stylesheet" href="{{ asset('swagger-ui.css') }}">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{{ asset('swagger-ui-bundle.js') }}"></script>
  <script>
    SwaggerUIBundle({url: "{{ document }}", dom_id: "#swagger-ui", deepLinking: true,
                     validatorUrl: null});
  </script>
</body>
</html>
"""


def install(app, settings: Settings) -> QuartSchema:
    auth = {}
    if settings.api_key:
        auth = {
            "security_schemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
            "security": [{"apiKey": []}],
        }
    schema = QuartSchema(
        app,
        openapi_path="/openapi.json",
        redoc_ui_path=None,  # ReDoc and Scalar load from CDNs: off
        scalar_ui_path=None,
        swagger_ui_path=None,  # quart-schema's page loads Swagger UI from a CDN: ours below
        info={"title": "mlxserve", "version": "0.1.0"},
        openapi_provider_class=_provider(settings),
        **auth,
    )
    app.add_url_rule("/docs", "swagger_ui", swagger_ui_page)
    app.add_url_rule("/docs/static/<name>", "swagger_ui_asset", swagger_ui_asset)
    return schema


@hide
async def swagger_ui_page() -> str:
    return await render_template_string(
        SWAGGER_UI_PAGE,
        asset=lambda name: url_for("swagger_ui_asset", name=name),
        document=url_for("openapi"),
    )


@hide
async def swagger_ui_asset(name: str):
    if name not in SWAGGER_UI_ASSETS:
        raise NotFound()
    return await send_from_directory(SWAGGER_UI_FILES, name)


def _provider(settings: Settings) -> type[OpenAPIProvider]:
    class Provider(OpenAPIProvider):
        def schema(self) -> dict[str, Any]:
            document = super().schema()
            require_bodies(document)
            state_limits(document, settings)
            return document

    return Provider


def limited_names(model: type[CompletionRequest]) -> dict[str, str]:
    """Each accepted name of a model's limited fields (aliases too) -> its Limits attribute."""
    names = {}
    for field, limit in model.limited_fields.items():
        alias = model.model_fields[field].validation_alias
        for name in [field, *(alias.choices if alias else [])]:
            names[name] = limit
    return names


def limited_model(schema: dict[str, Any]) -> type[CompletionRequest]:
    """The request model a body schema documents: llama.cpp's routes have their own limits."""
    native = (NativeCompletionRequest, *NativeCompletionRequest.__subclasses__())
    return next((m for m in native if m.__name__ == schema.get("title")), CompletionRequest)


def require_bodies(document: dict[str, Any]) -> None:
    """Every route that documents a body needs one (OpenAPI's default is optional)."""
    for operations in document["paths"].values():
        for operation in operations.values():
            if "requestBody" in operation:
                operation["requestBody"]["required"] = True


def state_limits(document: dict[str, Any], settings: Settings) -> None:
    """Write each limited field's `maximum` (this server's flag) into every request body."""
    for operations in document["paths"].values():
        for operation in operations.values():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            schema = (body or {}).get("schema", {})
            properties = schema.get("properties", {})
            for name, limit in limited_names(limited_model(schema)).items():
                if name in properties:
                    _set_integer_maximum(properties[name], getattr(settings.limits, limit))


def _set_integer_maximum(schema: dict[str, Any], maximum: int) -> None:
    if schema.get("type") == "integer":
        schema["maximum"] = maximum
    for branch in schema.get("anyOf", []):
        _set_integer_maximum(branch, maximum)
