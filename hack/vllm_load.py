#!/usr/bin/env python3
"""Load for a real vLLM's OpenAI API: N clients, each sending one completion after another.

Prompts are token-id lists (the completions API takes them), so a tiny model's tokenizer does not limit
their length; ``ignore_eos`` makes every request generate ``max_tokens``. Used by the end-to-end tests
(overload: many long requests into a small KV cache; busy but healthy: a few short ones) and by
``hack/record_vllm_traces.py``. Standard library only.

    python3 hack/vllm_load.py URL MODEL --clients 24 --prompt-tokens 1500 --max-tokens 2000 --seconds 60
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import random
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field


@dataclass
class LoadResult:
    completed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


class Load:
    """Clients in daemon threads until ``stop()`` (or ``seconds``); ``result`` counts what came back."""

    def __init__(self, url: str, model: str, *, clients: int, prompt_tokens: int, max_tokens: int,
                 vocab: int = 500, timeout: float = 600.0, seed: int = 0) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.model, self.clients = model, clients
        self.prompt_tokens, self.max_tokens, self.vocab, self.timeout = prompt_tokens, max_tokens, vocab, timeout
        self.result = LoadResult()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._threads: list[threading.Thread] = []
        self._connections: set[http.client.HTTPConnection] = set()

    def _prompt(self) -> list[int]:
        with self._lock:  # distinct prompts: no prefix-cache hits make the load lighter than it looks
            return [self._random.randrange(3, self.vocab) for _ in range(self.prompt_tokens)]

    def _client(self) -> None:
        while not self._stop.is_set():
            body = json.dumps({"model": self.model, "prompt": self._prompt(), "max_tokens": self.max_tokens,
                               "ignore_eos": True, "temperature": 1.0})
            connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            with self._lock:
                self._connections.add(connection)
            try:
                connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                ok = 200 <= response.status < 300
                with self._lock:
                    self.result.completed += ok
                    self.result.failed += not ok
            except OSError as exc:
                with self._lock:
                    self.result.failed += 1
                    if len(self.result.errors) < 10:
                        self.result.errors.append(str(exc)[:200])
                self._stop.wait(1.0)  # the server is restarting or gone: do not spin
            finally:
                with self._lock:
                    self._connections.discard(connection)
                connection.close()

    def start(self) -> Load:
        for i in range(self.clients):
            thread = threading.Thread(target=self._client, name=f"load-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> LoadResult:
        """Stop sending and hang up on the requests in flight: vLLM aborts a request whose client is gone,
        so the load ends here rather than when the last long request would have finished."""
        self._stop.set()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            if connection.sock is not None:
                with contextlib.suppress(OSError):
                    connection.sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)
        return self.result

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("model")
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    load = Load(args.url, args.model, clients=args.clients, prompt_tokens=args.prompt_tokens,
                max_tokens=args.max_tokens).start()
    time.sleep(args.seconds)
    result = load.stop()
    print(json.dumps({"completed": result.completed, "failed": result.failed, "errors": result.errors}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
