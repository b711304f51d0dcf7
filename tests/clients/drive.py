"""Drives kairos through a client generated from its /openapi.json by openapi-python-client.

Run by scripts/generated_clients.py, which generates the client into a package named
`kairos_client` beside this file's copy and checks both with `mypy --strict` before it
runs this against a live host: every call below is typed by the generated code, with no
hand edits. Usage: drive.py BASE_URL ADMIN_TOKEN [COMPONENT.wasm]
"""

import sys
import time
from typing import TypeVar

from kairos_client import AuthenticatedClient
from kairos_client.api.defer import defer_json
from kairos_client.api.plugins import show_plugin, upload_plugin
from kairos_client.api.queues import (
    ack_task,
    add_tasks,
    lease_tasks,
    list_tasks,
    put_queue,
    show_queue,
)
from kairos_client.api.schedules import (
    cancel_schedule,
    create_schedule,
    create_schedules_batch,
    list_failures,
    list_schedules,
    patch_schedule,
    show_schedule,
)
from kairos_client.api.timers import create_timer, delete_timer, patch_timer, show_timer, timer_runs
from kairos_client.models import (
    BatchRequest,
    BatchResult,
    Booked,
    BookingChange,
    BookingCreate,
    Cancelled,
    DeferBody,
    Deferred,
    ErrorBody,
    FailurePage,
    LeaseAnswer,
    LeaseBody,
    LeaseChanged,
    Leased,
    LifeOutcome,
    LifePage,
    LifeState,
    LifeView,
    NewTaskList,
    PluginMeta,
    PluginView,
    QueueBody,
    QueueView,
    SortOrder,
    TaskBody,
    TaskList,
    TasksAdded,
    TimerChange,
    TimerCreate,
    TimerRuns,
    TimerView,
)
from kairos_client.types import File

T = TypeVar("T")


def expect(kind: type[T], answer: object, what: str) -> T:
    """The answer as the type the route's success has, or the script fails saying why."""
    if not isinstance(answer, kind):
        raise SystemExit(f"{what}: expected {kind.__name__}, got {answer!r}")
    return answer


def at(seconds_ahead: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds_ahead))


def main() -> None:
    base, token = sys.argv[1], sys.argv[2]
    component = sys.argv[3] if len(sys.argv) > 3 else None
    client = AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True)

    # The README's first booking: a term Life of a resource, times in the host's zone.
    readme = BookingCreate.from_dict(
        {
            "life_uuid": "py-term",
            "schedule_type": "term",
            "resource_id": "conn-42",
            "term": {"birth_time": at(3600), "death_time": at(7200)},
            "birth": {"path": "/tasks", "method": "POST", "body": {"id": "a0", "method": "activate"}},
            "death": {"path": "/tasks", "method": "POST", "body": {"id": "a0", "method": "deactivate"}},
        }
    )
    term = expect(Booked, create_schedule.sync(client=client, body=readme), "book a term")
    assert term.life_uuid == "py-term" and term.resource_id == "conn-42", term
    # Free-form bodies are any JSON: a string and a list are bodies as much as an object.
    for i, body in enumerate(["plain text", [1, 2, 3], {"n": 1}]):
        point = BookingCreate.from_dict(
            {"life_uuid": f"py-point-{i}", "birth_time": at(3600 + i),
             "birth": {"path": "/hook", "method": "POST", "body": body}}
        )
        expect(Booked, create_schedule.sync(client=client, body=point), f"book point {i}")
    # Overlapping the term on its resource: a 409 with the error body.
    clash = BookingCreate.from_dict(
        {"schedule_type": "term", "resource_id": "conn-42",
         "term": {"birth_time": at(3700), "death_time": at(4000)},
         "birth": {"path": "/tasks", "method": "POST"}, "death": {"path": "/tasks", "method": "POST"}}
    )
    answer = create_schedule.sync_detailed(client=client, body=clash)
    refused = expect(ErrorBody, answer.parsed, "a clash")
    assert answer.status_code == 409 and refused.error.code, (answer.status_code, refused)

    page = expect(LifePage, list_schedules.sync(client=client, limit=10), "list")
    listed = {life.life_uuid for life in page.items}
    assert {"py-term", "py-point-0"} <= listed, listed
    pending = expect(LifePage, list_schedules.sync(client=client, state=LifeState.INEXISTENT), "filter")
    assert all(life.state == LifeState.INEXISTENT for life in pending.items), pending

    life = expect(LifeView, show_schedule.sync("py-term", client=client), "show")
    assert len(life.plans) == 2, life
    change = BookingChange.from_dict({"birth_time": at(1800)})
    moved = expect(LifeView, patch_schedule.sync("py-term", client=client, body=change), "patch")
    assert moved.birth_time is not None and moved.birth_time != life.birth_time, moved
    cancelled = expect(Cancelled, cancel_schedule.sync("py-point-0", client=client), "cancel")
    assert cancelled.state == "Stillbirth", cancelled
    # The cancelled Life's outcome, filtered on, newest first; and the failures list.
    gone = expect(
        LifePage,
        list_schedules.sync(client=client, outcome=LifeOutcome.CANCELLED, order=SortOrder.DESC),
        "filter by outcome",
    )
    assert any(
        life.life_uuid == "py-point-0" and life.outcome == LifeOutcome.CANCELLED for life in gone.items
    ), gone
    failures = expect(FailurePage, list_failures.sync(client=client, limit=5), "failures")
    assert failures.total == 0 and not failures.items, failures
    missing = expect(ErrorBody, show_schedule.sync("no-such-life", client=client), "a 404")
    assert missing.error.code == "not_found", missing

    batch = BatchRequest.from_dict(
        {"bookings": [{"life_uuid": f"py-batch-{i}", "birth_time": at(4000 + i),
                       "birth": {"path": "/hook", "method": "POST"}} for i in range(3)]
         + [{"birth": {"path": "/hook"}}]}
    )
    result = expect(BatchResult, create_schedules_batch.sync(client=client, body=batch), "batch")
    assert (result.booked, result.refused) == (3, 1), result
    assert [item.status for item in result.items] == [200, 200, 200, 400], result

    deferred = expect(
        Deferred,
        defer_json.sync(client=client, body=DeferBody.from_dict(
            {"path": "/orders/42/confirm", "method": "POST", "at": at(3600), "body": {"ok": True}})),
        "defer",
    )
    deferred_life = expect(LifeView, show_schedule.sync(deferred.life_uuid, client=client), "deferred")
    assert deferred_life.plans[0].action is not None

    timer = TimerCreate.from_dict(
        {"name": "py-nightly", "schedule": "0 3 * * *", "timezone": "Europe/Paris",
         "action": {"path": "/report", "method": "POST", "body": ["any", "json"]}}
    )
    made = expect(TimerView, create_timer.sync(client=client, body=timer), "create a timer")
    assert made.active and made.next_run, made
    changed = expect(
        TimerView,
        patch_timer.sync("py-nightly", client=client, body=TimerChange.from_dict({"schedule": "30 4 * * *"})),
        "patch a timer",
    )
    assert changed.schedule == "30 4 * * *", changed
    expect(TimerView, show_timer.sync("py-nightly", client=client), "show a timer")
    runs = expect(TimerRuns, timer_runs.sync("py-nightly", client=client), "timer runs")
    assert runs.items == [], runs
    delete_timer.sync("py-nightly", client=client)

    queue = expect(QueueView, put_queue.sync("py-mail", client=client,
                                            body=QueueBody.from_dict({"rate": 2, "max_concurrent": 1})), "queue")
    assert queue.name == "py-mail", queue
    # Bulk tasks in both of the many-task shapes.
    listed_tasks = [TaskBody.from_dict({"name": f"t{i}", "countdown": "1h",
                                        "action": {"path": "/send", "method": "POST", "body": {"i": i}}})
                    for i in range(2)]
    added = expect(TasksAdded, add_tasks.sync("py-mail", client=client, body=listed_tasks), "tasks")
    assert [t.name for t in added.tasks] == ["t0", "t1"], added
    wrapped = NewTaskList.from_dict({"tasks": [{"name": "t2", "countdown": "1h", "action": {"path": "/send", "method": "POST"}}]})
    expect(TasksAdded, add_tasks.sync("py-mail", client=client, body=wrapped), "{tasks}")
    tasks = expect(TaskList, list_tasks.sync("py-mail", client=client), "list tasks")
    assert {t.name for t in tasks.items} == {"t0", "t1", "t2"}, tasks
    shown = expect(QueueView, show_queue.sync("py-mail", client=client), "show a queue")
    assert shown.tasks.pending == 3, shown

    expect(QueueView, put_queue.sync("py-pull", client=client, body=QueueBody.from_dict({"mode": "pull"})), "pull")
    expect(TasksAdded, add_tasks.sync("py-pull", client=client,
                                      body=[TaskBody.from_dict({"name": "p1", "payload": [1, "two"]})]), "pull task")
    leased = expect(Leased, lease_tasks.sync("py-pull", client=client,
                                             body=LeaseBody.from_dict({"count": 5, "lease_seconds": 30})), "lease")
    assert [t.name for t in leased.tasks] == ["p1"] and leased.tasks[0].payload == [1, "two"], leased
    acked = ack_task.sync("py-pull", "p1", client=client,
                          body=LeaseAnswer.from_dict({"lease_id": leased.tasks[0].lease_id}))
    expect(LeaseChanged, acked, "ack")

    if component:
        with open(component, "rb") as f:
            wasm = File(payload=f, file_name="plugin.wasm", mime_type="application/wasm")
            meta = expect(PluginMeta, upload_plugin.sync("py-noop", client=client, body=wasm), "upload")
        assert meta.version == 1 and meta.digest, meta
        shown_plugin = expect(PluginView, show_plugin.sync("py-noop", client=client), "show a plugin")
        assert [v.version for v in shown_plugin.versions] == [1], shown_plugin
    print("generated Python client: every route answered as its types say")


if __name__ == "__main__":
    main()
