"""`python-forward`: sends a JSON body to a URL and returns the status (the Python
twin of plugins/http-forward).

Input: ``{"url": "https://...", "method"?: "POST", "headers"?: {"name": "value"},
"body": any}``. Output: ``{"status": 200}``. A 408, 429 or 5xx answer, or no answer,
is a retryable error (the action's ``retry_count`` decides how often); another non-2xx
answer fails the Plan. The input's JSON Schema comes from ``Input``, so kairos refuses
a booking whose input does not fit (400 ``invalid_input``).
"""

from dataclasses import dataclass, field
from typing import Any, Dict

from kairos_guest import Context, Error, export_action, http, log, schema_of


@dataclass
class Input:
    url: str
    method: str = "POST"
    headers: Dict[str, str] = field(default_factory=dict)
    body: Any = None


@dataclass
class Output:
    status: int


def run(ctx: Context, input: Input) -> Output:
    headers = {
        "x-kairos-life": ctx.life_id,
        "idempotency-key": f"{ctx.life_id}:{ctx.scheduled_at_ms}",
        **input.headers,
    }
    response = http.request(input.method, input.url, headers=headers, json=input.body)
    log.info(f"{input.method} {input.url} -> {response.status}")
    if response.ok:
        return Output(status=response.status)
    if response.status in (408, 429) or response.status >= 500:
        raise Error.retryable(f"{input.url} answered {response.status}")
    raise Error.fatal(f"{input.url} answered {response.status}")


WitWorld = export_action(run, input_schema=schema_of(Input))
