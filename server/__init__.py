"""`gym-tf serve`: a drop-in OpenAI-compatible endpoint that puts a learned experience library into every prompt.

Apps keep their `openai` client and change the base URL. Requests are forwarded to the upstream (any
OpenAI-compatible server, or the embedded model) with every field untouched except the messages, where the library
is merged first into the system message, rendered exactly as during optimization.
"""

from server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
