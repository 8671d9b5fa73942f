"""The HTTP routes of the OpenAI-compatible server (`lib.serve.server.Server`), as one Starlette application:
`/v1/completions` and `/v1/chat/completions` (JSON or server-sent events), `/v1/models[/name]`, vLLM's `/tokenize` and
`/detokenize`, `/health`, `/metrics`; OpenAI's error object for a bad request, a 404 route or a missing API key. The
routes only translate HTTP to the `Server`'s methods and back; what a request means lives there."""
from __future__ import annotations

import hmac
import json
from lib.serve.openai_api import RequestError, check_fields


def build_app(server):
    """The Starlette application serving `server` (a `lib.serve.server.Server`, which imports this module: not
    imported here); the engine thread starts and stops with it."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def error(e: RequestError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def completions(request: Request, chat: bool):
        try:
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(f"the request body is not valid JSON: {e}") from None
            subs, opts = server.parse(body, chat)
            if opts["stream"]:
                return StreamingResponse(server.stream(subs, opts), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            return JSONResponse(await server.complete(subs, opts, request.is_disconnected))
        except RequestError as e:
            return error(e)

    def card(name: str) -> dict:  # a LoRA adapter's card names the base model as its parent, as vLLM's does
        return {"id": name, "object": "model", "created": server.created, "owned_by": "inference-lab",
                "max_model_len": server.max_len, "parent": server.model_name if name in server.adapters else None}

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [card(n) for n in [server.model_name, *server.adapters]]})

    async def model(request: Request):
        try:
            check_fields({"model": request.path_params["name"]}, False, [server.model_name, *server.adapters])
        except RequestError as e:
            return error(e)
        return JSONResponse(card(request.path_params["name"]))

    async def json_body(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    async def tokenize(request: Request):
        """vLLM's /tokenize: {"prompt": text} or {"messages": [...]} (the chat template applied) -> the ids."""
        try:
            ids = server.tokenize(await json_body(request))
        except RequestError as e:
            return error(e)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": server.max_len})

    async def detokenize(request: Request):
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
        try:
            ids = (await json_body(request)).get("tokens")
            vocab = server.engine.config.vocab_size
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                                    for t in ids):
                raise RequestError(f"'tokens' must be a list of token ids (0 to {vocab - 1})", param="tokens")
        except RequestError as e:
            return error(e)
        return JSONResponse({"prompt": server.tok.decode(ids)})

    async def health(request: Request):
        ok = server.loop.alive
        return JSONResponse({"status": "ok" if ok else "engine thread stopped"}, status_code=200 if ok else 503)

    async def metrics(request: Request):
        return PlainTextResponse(server.loop.metrics(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc):
        return error(RequestError(f"no route {request.method} {request.url.path}", status=404, code="not_found"))

    @asynccontextmanager
    async def lifespan(app):
        server.loop.start()
        try:
            yield
        finally:
            server.loop.stop()

    async def text_completions(request: Request):
        return await completions(request, chat=False)

    async def chat_completions(request: Request):
        return await completions(request, chat=True)

    routes = [Route("/v1/completions", text_completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models), Route("/v1/models/{name:path}", model), Route("/health", health),
              Route("/metrics", metrics), Route("/tokenize", tokenize, methods=["POST"]),
              Route("/detokenize", detokenize, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})
    if server.api_key is None:
        return app

    async def with_key(scope, receive, send):  # --api-key: every /v1 route needs "Authorization: Bearer KEY"
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given, f"Bearer {server.api_key}"):
                response = error(RequestError("a valid API key is required: send 'Authorization: Bearer KEY' (the "
                                              "server's --api-key)", status=401, code="invalid_api_key"))
                return await response(scope, receive, send)
        return await app(scope, receive, send)

    return with_key
