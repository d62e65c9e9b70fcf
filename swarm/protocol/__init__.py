"""The wire contract: every model that crosses a process boundary, shared by server and client.

The server validates requests with these models, the client parses responses with them, and the
researcher logs them. Depends on pydantic only. Field names follow OpenAI's chat API (and vLLM's
``prompt_token_ids`` / ``token_ids`` extras) so any OpenAI SDK works unchanged.

One package, one module a concern (``errors``, ``chat``, ``responses``, ``episodes``, ``status``,
``control``), and every name importable from ``swarm.protocol`` itself, so a reader of one request's
shape opens one short file and a user of the contract imports from one place. The Responses API
(``swarm.protocol.responses``) is imported where it is served, not here.
"""

from swarm.protocol._base import API_PREFIX as API_PREFIX
from swarm.protocol._base import MAX_BODY_BYTES as MAX_BODY_BYTES
from swarm.protocol._base import refused as refused
from swarm.protocol.chat import *  # noqa: F403
from swarm.protocol.control import *  # noqa: F403
from swarm.protocol.episodes import *  # noqa: F403
from swarm.protocol.errors import *  # noqa: F403
from swarm.protocol.status import *  # noqa: F403
