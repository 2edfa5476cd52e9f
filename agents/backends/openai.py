"""The OpenAI-compatible backend: the student served by `vllm serve` (or SGLang), called over HTTP.

    backend = OpenAIBackend("http://gpu-1:8000/v1", "student-lora")  # served name or LoRA module name
    backend.health()        # ["Qwen/Qwen3-VL-2B-Instruct", "student-lora"]: the ids the server serves
    gens = backend.generate([prompt_a, prompt_b], Sampling(temperature=1.0, max_new_tokens=96))
    gens[0].text, gens[0].token_ids, gens[0].logprobs, gens[0].finish_reason

One POST /v1/chat/completions per prompt, at most `concurrency` in flight (threads; the results come
back in prompt order). Each {"type": "image"} placeholder becomes an image_url part holding the next
screenshot as a base64 PNG data URL. The request asks for what RL needs: the logprob of every sampled
token, with vLLM's `return_tokens_as_token_ids` so each logprob entry names its token id
("token_id:1234"), special tokens kept in the text, and the stop text kept (the reply ends with
`</tool_call>`). A server that ignores those extras still works: token ids then come from the choice's
`token_ids` field when present, else they are None.

Every failure is one BackendError line: server unreachable, unknown model (with the served ids), a
rejected request (the server's message), a timeout, a malformed reply. 429, 5xx and dropped connections
are retried with exponential backoff and jitter first. The API key (argument, or the environment
variables FLYWHEEL_OPENAI_API_KEY then OPENAI_API_KEY) goes out as a Bearer header and nowhere else:
not in reprs, logs or error messages. docs/VLLM.md says how to serve a checkpoint.
"""

from __future__ import annotations

import base64
import logging
import os
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx

from agents.backends.base import Backend, BackendError, Generation, Sampling

if TYPE_CHECKING:
    from agents.prompts import Prompt

log = logging.getLogger(__name__)

API_KEY_ENV = ("FLYWHEEL_OPENAI_API_KEY", "OPENAI_API_KEY")  # first set wins
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")  # vLLM's form with return_tokens_as_token_ids
_RETRY_AFTER_CAP_S = 30.0  # a server asking for a longer pause is not coming back soon
_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)  # resets, closed without reply

# Hints for the 400 messages a GUI-agent prompt typically hits (vLLM wording), naming the serve flag.
_HINTS = (
    ("image(s) may be provided", "restart `vllm serve` with a larger --limit-mm-per-prompt '{\"image\": K}'"),
    ("maximum context length", "raise `vllm serve --max-model-len`, or send fewer screenshots / tokens"),
)


class _Secret:
    """Holds the API key. Its repr is masked, so a debugger, a log of vars() or a traceback shows '***'."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__


def api_root(base_url: str) -> str:
    """Normalise a server URL to its /v1 root: 'http://h:8000', 'http://h:8000/' and 'http://h:8000/v1'
    all give 'http://h:8000/v1' (the config example carries /v1; people also paste the bare host)."""
    url = base_url.strip().rstrip("/")
    if not re.match(r"^https?://[^/]", url):
        raise ValueError(f"base_url must look like http://host:8000/v1, got {base_url!r}")
    return url if url.endswith("/v1") else url + "/v1"


def png_data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def to_openai_messages(prompt: "Prompt") -> list[dict[str, Any]]:
    """HF-style messages with {"type": "image"} placeholders -> OpenAI chat messages whose image parts
    carry the prompt's PNGs in placeholder order. Raises ValueError if placeholders and images differ
    in number (a prompt-builder bug: fail before anything is sent)."""
    images = list(prompt.images)
    used = 0
    out: list[dict[str, Any]] = []
    for msg in prompt.messages:
        content = msg.get("content")
        if isinstance(content, list):
            parts: list[dict[str, Any]] = []
            for item in content:
                if item.get("type") == "image":
                    if used >= len(images):
                        raise ValueError(f"prompt has more image placeholders than images ({len(images)})")
                    parts.append({"type": "image_url", "image_url": {"url": png_data_url(images[used])}})
                    used += 1
                elif item.get("type") == "text":
                    parts.append({"type": "text", "text": item["text"]})
                else:
                    parts.append(dict(item))
            content = parts
        out.append({**msg, "content": content})
    if used != len(images):
        raise ValueError(f"prompt has {used} image placeholders but {len(images)} images")
    return out


def error_message(resp: httpx.Response) -> str:
    """The server's error text on one line: vLLM's {"error": {"message": ...}}, the older flat
    {"message": ...}, FastAPI's {"detail": ...}, else the start of the body."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    msg: Any = None
    if isinstance(data, dict):
        err = data.get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        msg = msg or data.get("message") or data.get("detail")
    text = str(msg) if msg else (resp.text or resp.reason_phrase or "(empty body)")
    text = " ".join(text.split())
    return text[:300] + ("..." if len(text) > 300 else "")


def parse_completion(data: Any) -> Generation:
    """A /v1/chat/completions JSON body -> Generation (latency filled by the caller). Raises ValueError
    when the body is not a chat completion."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        keys = sorted(data)[:8] if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"no choices in the reply (got {keys})")
    choice = data["choices"][0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise ValueError("choices[0] has no message")
    token_ids, logprobs = _token_logprobs(choice)
    usage = data.get("usage") or {}
    return Generation(
        text=message.get("content") or "",
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        finish_reason=choice.get("finish_reason"),
        extra={"id": data.get("id"), "stop_reason": choice.get("stop_reason")},
    )


def _token_logprobs(choice: dict[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    fallback_ids = choice.get("token_ids")  # vLLM (return_token_ids) and SGLang can send ids here
    content = (choice.get("logprobs") or {}).get("content")
    if content is None:
        return (list(fallback_ids) if fallback_ids else None), None
    try:
        logprobs = [float(entry["logprob"]) for entry in content]
        matches = [_TOKEN_ID.match(str(entry.get("token", ""))) for entry in content]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"bad logprobs entry ({type(e).__name__}: {e})") from None
    if all(matches):
        return [int(m.group(1)) for m in matches if m], logprobs
    # Tokens came back as text: the server ignored return_tokens_as_token_ids.
    return (list(fallback_ids) if fallback_ids else None), logprobs


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        concurrency: int = 64,
    ):
        if concurrency < 1 or max_retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError("need concurrency >= 1, max_retries >= 0, timeout_s > 0, backoff_s >= 0")
        self.base_url = api_root(base_url)
        self.model = self.model_id = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        key = api_key or next((os.environ[v] for v in API_KEY_ENV if os.environ.get(v)), None)
        self._key = _Secret(key) if key else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        # One pooled client shared by the worker threads (httpx.Client is thread-safe); httpx masks
        # the Authorization header in its own reprs.
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s), limits=limits)

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r}, "
            f"api_key={'***' if self._key else None}, concurrency={self.concurrency})"
        )

    def __enter__(self) -> "OpenAIBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    # ---- public API -------------------------------------------------------------------------

    def request_body(self, prompt: "Prompt", sampling: Sampling) -> dict[str, Any]:
        """The JSON sent for one prompt (vLLM's extra parameters sit at the top level of the body)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(prompt),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "logprobs": True,
            "top_logprobs": 0,  # the sampled token's logprob only; alternatives are not needed
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def generate(self, prompts: list["Prompt"], sampling: Sampling) -> list[Generation]:
        bodies = [self.request_body(p, sampling) for p in prompts]  # prompt errors surface before any I/O
        if len(bodies) <= 1:
            return [self._complete(b) for b in bodies]
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies)), thread_name_prefix="openai-backend")
        try:
            futures = [pool.submit(self._complete, b) for b in bodies]
            return [f.result() for f in futures]
        finally:
            # On the first failure, requests not yet started are dropped rather than sent.
            pool.shutdown(wait=True, cancel_futures=True)

    def health(self) -> list[str]:
        """GET /v1/models: the ids the server serves (base model names and LoRA module names)."""
        url = f"{self.base_url}/models"
        resp, _ = self._send("GET", url)
        if resp.status_code != 200:
            raise self._http_error(resp, url)
        try:
            return [str(m["id"]) for m in resp.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise self._fail(
                f'malformed response from {url}: expected {{"data": [{{"id": ...}}]}}, got {_snippet(resp.text)}'
            ) from None

    # ---- internals --------------------------------------------------------------------------

    def _complete(self, body: dict[str, Any]) -> Generation:
        url = f"{self.base_url}/chat/completions"
        t0 = time.perf_counter()
        resp, attempts = self._send("POST", url, body)
        if resp.status_code != 200:
            raise self._http_error(resp, url)
        try:
            data = resp.json()
        except ValueError:
            raise self._fail(f"malformed response from {url}: not JSON: {_snippet(resp.text)}") from None
        try:
            gen = parse_completion(data)
        except ValueError as e:
            raise self._fail(f"malformed response from {url}: {e}") from None
        gen.latency_ms = (time.perf_counter() - t0) * 1000.0  # includes retries: what the rollout waited
        gen.extra["attempts"] = attempts
        return gen

    def _send(self, method: str, url: str, body: dict[str, Any] | None = None) -> tuple[httpx.Response, int]:
        """One request, retried on 429 / 5xx / refused or dropped connections. Returns the first
        response that is not retryable, with the number of attempts; raises BackendError."""
        last = ""
        unreachable = False
        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                resp = self._client.request(method, url, json=body)
            except httpx.TimeoutException:
                # Not retried: a server this slow will not be faster a second time, and retrying would
                # multiply the wait by max_retries.
                raise self._fail(
                    f"{method} {url} timed out after {self.timeout_s:g}s "
                    "(server overloaded or generation too long? raise timeout_s)"
                ) from None
            except httpx.ConnectError as e:
                unreachable, last = True, f"{type(e).__name__}: {e}"
            except _DROPPED as e:
                unreachable, last = False, f"connection dropped ({type(e).__name__}: {e})"
            else:
                if resp.status_code != 429 and resp.status_code < 500:
                    return resp, attempt + 1
                unreachable, last = False, f"HTTP {resp.status_code}: {error_message(resp)}"
                retry_after = _retry_after(resp)
            if attempt < self.max_retries:
                delay = self._delay(attempt, retry_after)
                log.warning(
                    self._scrub(f"{method} {url}: {last}; retry {attempt + 1}/{self.max_retries} in {delay:.2f}s")
                )
                time.sleep(delay)
        tries = f"{self.max_retries + 1} attempt{'s' if self.max_retries else ''}"
        if unreachable:
            raise self._fail(
                f"cannot reach the model server at {self.base_url} (is `vllm serve` running?) [{last}; {tries}]"
            )
        raise self._fail(f"the model server at {self.base_url} kept failing: {last} (gave up after {tries})")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        # Exponential backoff with jitter (x0.5..1.5) so parallel workers do not retry in lockstep.
        delay = self.backoff_s * (2**attempt) * (0.5 + random.random())
        if retry_after is not None:
            delay = max(delay, min(retry_after, _RETRY_AFTER_CAP_S))
        return delay

    def _http_error(self, resp: httpx.Response, url: str) -> BackendError:
        code, msg = resp.status_code, error_message(resp)
        if code == 404 and ("does not exist" in msg or "model" in msg.lower()):
            return self._model_not_found(msg)
        if code == 404:
            return self._fail(f"HTTP 404 at {url} ({msg}): is base_url the server's /v1 root?")
        if code in (401, 403):
            return self._fail(
                f"the model server at {self.base_url} refused the request (HTTP {code}: {msg}); "
                f"set {API_KEY_ENV[0]} to the key given to `vllm serve --api-key`"
            )
        hint = next((f" [{h}]" for needle, h in _HINTS if needle in msg), "")
        return self._fail(f"the model server rejected the request (HTTP {code}): {msg}{hint}")

    def _model_not_found(self, msg: str) -> BackendError:
        try:
            served = self.health()
            listing = f"served models: {', '.join(served)}" if served else "the server lists no models"
        except BackendError as e:
            listing = f"could not list the served models ({e})"
        return self._fail(
            f"model {self.model!r} is not served at {self.base_url} ({msg}); {listing}. "
            "Use a --served-model-name or a --lora-modules name as the model."
        )

    def _scrub(self, text: str) -> str:
        """Mask the API key wherever it could have crept in (a server echoing headers, say)."""
        if self._key:
            text = text.replace(self._key.reveal(), "***")
        return text

    def _fail(self, message: str) -> BackendError:
        return BackendError(self._scrub(message))


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return max(0.0, float(resp.headers["retry-after"]))
    except (KeyError, ValueError):
        return None  # absent, or an HTTP date: backoff alone decides


def _snippet(text: str, n: int = 80) -> str:
    text = " ".join(text.split())
    return repr(text[:n] + ("..." if len(text) > n else ""))
