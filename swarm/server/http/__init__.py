"""The server's HTTP layer: the OpenAI-compatible routes (``routes_openai``, with ``streaming`` and
``replyshape`` shaping replies), the episode routes, the control routes, and the ``AppContext``
every route reaches the server through. Routes parse, authenticate and translate; the core below
does the work. ``swarm.server.app`` composes them."""
