"""llama.cpp's POST /infill, as llama.vim and llama.vscode send it: the prefix, suffix and other
files' chunks become the model's fill-in-the-middle prompt; the answer is /completion's."""

from __future__ import annotations

from quart import Blueprint
from quart_schema import document_request

from ..parsing import read_completion_request
from .completion import respond
from .protocol import InfillRequest

blueprint = Blueprint("llamacpp_infill", __name__)


@blueprint.post("/infill")
@document_request(InfillRequest)
async def infill():
    return await respond(await read_completion_request(InfillRequest))
