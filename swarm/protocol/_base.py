"""What every part of the wire contract shares: the API prefix, the body limit, strict requests and the
``refused`` error.
Part of ``swarm.protocol`` (see its docstring)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

API_PREFIX = "/api/v1"
MAX_BODY_BYTES = 4 * 1024 * 1024


def refused(message: str) -> PydanticCustomError:
    """A request option this server will not serve: raised in a validator, answered 400 naming the field."""
    return PydanticCustomError("refused", message)


class _Wire(BaseModel):
    """Requests reject unknown fields so typos fail loudly instead of being ignored."""

    model_config = ConfigDict(extra="forbid")
