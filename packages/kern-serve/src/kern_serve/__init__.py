"""kern_serve: the OpenAI-compatible HTTP server over one engine, and multi-turn conversations.

`serve(ServeOptions, log)` loads the engine (its factory, tokenizer and sizes checked first,
kern_runtime.loading), starts the engine thread (`kern_runtime.serving.Serving`) and serves the
Starlette app of `kern_serve.app` on uvicorn until SIGINT or SIGTERM; `with_engine` loads the same
engine for another use. The OpenAI wire format does no I/O: `completion_ask` / `chat_ask` check a
body into an `Ask` (or raise `ApiFailure`), `Text` turns generated ids into the text a client sees,
`error_body` is an error's JSON and `metrics_text` the server's Prometheus text. `Conversation`
turns a user's turns into prompts through the model family's chat template (`kern chat`), and
`chat_template` is the template a server renders its requests' messages with. The HTTP stack
(starlette, uvicorn; the `http` extra) is imported only by `kern_serve.app` and `serve`.
"""

from kern_serve._api import MAX_LOGPROBS, MAX_STOPS, Ask, Text, chat_ask, completion_ask, error_body
from kern_serve._conversation import Conversation, Template, chat_template, conversation
from kern_serve._metrics import metrics_text
from kern_serve._server import DEFAULT_BACKEND, GRACE_S, ServeOptions, serve, with_engine
from kern_serve.errors import ApiFailure, KernServeError, StartError

__all__ = [
    "DEFAULT_BACKEND",
    "GRACE_S",
    "MAX_LOGPROBS",
    "MAX_STOPS",
    "ApiFailure",
    "Ask",
    "Conversation",
    "KernServeError",
    "ServeOptions",
    "StartError",
    "Template",
    "Text",
    "chat_ask",
    "chat_template",
    "completion_ask",
    "conversation",
    "error_body",
    "metrics_text",
    "serve",
    "with_engine",
]
