"""A small OpenAI-compatible chat-completions server, for offline development and tests.

    server = LocalModelServer(responder).start()      # 127.0.0.1, a free port
    os.environ["DURABLE_LLM_BASE_URL"] = server.base_url
    ...
    server.answered          # requests it answered, in order (the parsed JSON bodies)
    server.stop()

It answers ``POST /v1/chat/completions`` with what a ``ScriptedClient`` responder says, as plain
JSON or, when the request asks ``"stream": true``, as server-sent events split into several
chunks (content and tool-call arguments in pieces, usage in the last chunk), as hosted APIs do.
``fail_next(429, retry_after=0.1)`` makes the next request fail, to exercise retries.
``before_answer`` is called with each body before the answer is sent; returning ``False`` drops
the request unanswered (tests use it to SIGKILL a worker in the middle of a model call).

Run it by hand: ``python -m examples.local_llm_server 8765`` then
``DURABLE_LLM_BASE_URL=http://127.0.0.1:8765/v1 make demo``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from journal.primitives.llm_clients import Responder, ScriptedClient


class LocalModelServer:
    def __init__(self, responder: Responder | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 before_answer: Callable[[dict], bool | None] | None = None):
        self.client = ScriptedClient(responder)
        self.received: list[dict] = []  # every request body, including refused ones
        self.answered: list[dict] = []  # bodies it sent a successful answer for
        self.before_answer = before_answer
        self._failures: list[tuple[int, float | None]] = []
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def fail_next(self, status: int, retry_after: float | None = None, times: int = 1) -> None:
        with self._lock:
            self._failures.extend([(status, retry_after)] * times)

    def start(self) -> LocalModelServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="local-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the protocol ------------------------------------------------------------------
    def answer(self, body: dict) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not body.get("model"):
            raise ValueError("a chat completion needs 'model' and a list of 'messages'")
        params = {k: v for k, v in body.items() if k not in ("model", "messages", "tools", "stream", "stream_options")}
        return self.client.complete(messages, model=body["model"], tools=body.get("tools"), **params)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _json(self, status: int, payload: dict, headers: dict | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._json(400, {"error": {"message": "malformed JSON"}})
                    return
                with server._lock:
                    server.received.append(body)
                    failure = server._failures.pop(0) if server._failures else None
                if failure is not None:
                    status, retry_after = failure
                    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
                    self._json(status, {"error": {"message": f"injected {status}"}}, headers)
                    return
                try:
                    reply = server.answer(body)
                except (ValueError, KeyError, TypeError) as exc:
                    self._json(400, {"error": {"message": str(exc)}})
                    return
                if server.before_answer and server.before_answer(body) is False:
                    self.close_connection = True  # dropped unanswered, as a crashed peer would see it
                    return
                with server._lock:  # before sending: a client may act on the answer before we return
                    server.answered.append(body)
                if body.get("stream"):
                    self._stream(reply)
                else:
                    self._json(200, _completion(reply))

            def _stream(self, reply: dict) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in _chunks(reply):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler


def _wire_calls(reply: dict) -> list[dict]:
    return [{"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], sort_keys=True)}}
            for c in reply["tool_calls"]]


def _completion(reply: dict) -> dict:
    message: dict = {"role": "assistant", "content": reply["content"] or None}
    if reply["tool_calls"]:
        message["tool_calls"] = _wire_calls(reply)
    return {"id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion", "model": reply["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": reply["finish_reason"]}],
            "usage": {**reply["usage"], "total_tokens": sum(reply["usage"].values())}}


def _chunks(reply: dict) -> list[dict]:
    base = {"id": "chatcmpl-stream", "object": "chat.completion.chunk", "model": reply["model"]}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}]
    text = reply["content"]
    for i in range(0, len(text), 16):
        chunks.append({**base, "choices": [{"index": 0, "delta": {"content": text[i:i + 16]}, "finish_reason": None}]})
    for n, call in enumerate(_wire_calls(reply)):
        args = call["function"]["arguments"]
        chunks.append({**base, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": n, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"],
                                                                             "arguments": args[:5]}}]}}]})
        chunks.append({**base, "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
            {"index": n, "function": {"arguments": args[5:]}}]}}]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reply["finish_reason"]}]})
    chunks.append({**base, "choices": [], "usage": {**reply["usage"], "total_tokens": sum(reply["usage"].values())}})
    return chunks


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    from examples.llm import demo_responder

    srv = LocalModelServer(demo_responder, port=port).start()
    print(f"OpenAI-compatible server on {srv.base_url} (Ctrl-C to stop)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()
