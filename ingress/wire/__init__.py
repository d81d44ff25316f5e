"""The HTTP edge: one adapter per API (OpenAI chat, Anthropic messages, OpenAI Responses,
the token API), the routes, bounded JSON bodies, SSE and each API's error shapes. Wire shapes
become :class:`~ingress.turns.turn.ChatTurn` here and nowhere else."""
