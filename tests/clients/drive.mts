// Drives kairos through a TypeScript client made from its /openapi.json: the types by
// openapi-typescript (schema.d.ts, generated beside this file's copy), the calls by
// openapi-fetch. Run by scripts/generated_clients.py, which compiles it with
// `tsc --strict` first: every path, parameter, body and answer below is typed by the
// generated types, with no casts. Usage: node drive.mjs BASE_URL ADMIN_TOKEN

import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Schemas = components["schemas"];

const [base, token] = process.argv.slice(2);
const client = createClient<paths>({
  baseUrl: base,
  headers: { Authorization: `Bearer ${token}` },
});

function fail(what: string, got: unknown): never {
  throw new Error(`${what}: ${JSON.stringify(got)}`);
}

function at(secondsAhead: number): string {
  return new Date(Date.now() + secondsAhead * 1000).toISOString();
}

// The README's first booking, as written there: the action bodies are any JSON.
const readme: Schemas["BookingCreate"] = {
  life_uuid: "ts-term",
  schedule_type: "term",
  resource_id: "conn-42",
  term: { birth_time: at(3600), death_time: at(7200) },
  birth: { path: "/tasks", method: "POST", body: { id: "a0", method: "activate" } },
  death: { path: "/tasks", method: "POST", body: { id: "a0", method: "deactivate" } },
};
const term = await client.POST("/schedules", { body: readme });
if (!term.data) fail("book a term", term.error);
const booked: Schemas["Booked"] = term.data;
if (booked.life_uuid !== "ts-term" || booked.resource_id !== "conn-42") fail("booked", booked);

const bodies: Schemas["Action"]["body"][] = ["plain text", [1, 2, 3], { n: 1 }, 7, null];
for (const [i, body] of bodies.entries()) {
  const point = await client.POST("/schedules", {
    body: { life_uuid: `ts-point-${i}`, birth_time: at(3600 + i), birth: { path: "/hook", method: "POST", body } },
  });
  if (!point.data) fail(`book point ${i}`, point.error);
}

// A clash on the resource: the error body, typed.
const clash = await client.POST("/schedules", {
  body: {
    schedule_type: "term",
    resource_id: "conn-42",
    term: { birth_time: at(3700), death_time: at(4000) },
    birth: { path: "/tasks", method: "POST" },
    death: { path: "/tasks", method: "POST" },
  },
});
if (clash.response.status !== 409 || !clash.error) fail("a clash", clash.data);
const refused: Schemas["ErrorBody"] = clash.error;
if (refused.error.code.length === 0) fail("a clash's code", refused);

const page = await client.GET("/schedules", { params: { query: { limit: 10 } } });
if (!page.data) fail("list", page.error);
const listed = page.data.items.map((l) => l.life_uuid);
if (!listed.includes("ts-term")) fail("listed", listed);
const inexistent = await client.GET("/schedules", { params: { query: { state: "Inexistent" } } });
if (!inexistent.data || inexistent.data.items.some((l) => l.state !== "Inexistent")) {
  fail("filter by state", inexistent.data);
}

const shown = await client.GET("/schedules/{life_uuid}", { params: { path: { life_uuid: "ts-term" } } });
if (!shown.data || shown.data.plans.length !== 2) fail("show", shown.data ?? shown.error);
const moved = await client.PATCH("/schedules/{life_uuid}", {
  params: { path: { life_uuid: "ts-term" } },
  body: { birth_time: at(1800) },
});
if (!moved.data || moved.data.birth_time === shown.data.birth_time) fail("patch", moved.data ?? moved.error);
const cancelled = await client.DELETE("/schedules/{life_uuid}", { params: { path: { life_uuid: "ts-point-0" } } });
if (cancelled.data?.state !== "Stillbirth") fail("cancel", cancelled.data ?? cancelled.error);
// The cancelled Life's outcome, filtered on, newest first; and the failures list.
const gone = await client.GET("/schedules", {
  params: { query: { outcome: "cancelled", order: "desc", limit: 10 } },
});
const goneLife: Schemas["LifeSummary"] | undefined = gone.data?.items.find((l) => l.life_uuid === "ts-point-0");
if (goneLife?.outcome !== "cancelled") fail("filter by outcome", gone.data ?? gone.error);
const failures = await client.GET("/failures", { params: { query: { outcome: "birth_failed", limit: 5 } } });
if (!failures.data || failures.data.total !== null || failures.data.items.length !== 0) {
  fail("failures", failures.data ?? failures.error);
}
const missing = await client.GET("/schedules/{life_uuid}", { params: { path: { life_uuid: "no-such-life" } } });
if (missing.response.status !== 404 || missing.error?.error.code !== "not_found") fail("a 404", missing.error);

const batch = await client.POST("/schedules/batch", {
  body: {
    bookings: [0, 1, 2].map((i) => ({
      life_uuid: `ts-batch-${i}`,
      birth_time: at(4000 + i),
      birth: { path: "/hook", method: "POST" as const },
    })),
  },
});
if (!batch.data || batch.data.booked !== 3) fail("batch", batch.data ?? batch.error);

// /defer's JSON form: the path is a field, sent as written, never percent-encoded.
const deferred = await client.POST("/defer", {
  body: { path: "/orders/42/confirm", method: "POST", at: at(3600), body: { ok: true } },
});
if (!deferred.data) fail("defer", deferred.error);
const deferredLife = await client.GET("/schedules/{life_uuid}", {
  params: { path: { life_uuid: deferred.data.life_uuid } },
});
const deferredAction = deferredLife.data?.plans[0]?.action;
if (!deferredAction || !JSON.stringify(deferredAction).includes("/orders/42/confirm")) {
  fail("the deferred request", deferredLife.data);
}

const timer = await client.POST("/timers", {
  body: {
    name: "ts-nightly",
    schedule: "0 3 * * *",
    timezone: "Europe/Paris",
    action: { path: "/report", method: "POST", body: ["any", "json"] },
  },
});
if (!timer.data || !timer.data.active) fail("create a timer", timer.data ?? timer.error);
const timerChanged = await client.PATCH("/timers/{name}", {
  params: { path: { name: "ts-nightly" } },
  body: { schedule: "30 4 * * *", overlap: "cancel_running" },
});
if (timerChanged.data?.schedule !== "30 4 * * *") fail("patch a timer", timerChanged.data ?? timerChanged.error);
const runs = await client.GET("/timers/{name}/runs", { params: { path: { name: "ts-nightly" } } });
if (!runs.data || runs.data.items.length !== 0) fail("timer runs", runs.data ?? runs.error);
await client.DELETE("/timers/{name}", { params: { path: { name: "ts-nightly" } } });

const queue = await client.PUT("/queues/{name}", {
  params: { path: { name: "ts-mail" } },
  body: { rate: 2, max_concurrent: 1, retry: { limit: 3 } },
});
if (!queue.data) fail("a queue", queue.error);
const tasks: Schemas["TaskBody"][] = [0, 1].map((i) => ({
  name: `t${i}`,
  countdown: "1h",
  action: { path: "/send", method: "POST", body: { i } },
}));
const added = await client.POST("/queues/{name}/tasks", { params: { path: { name: "ts-mail" } }, body: tasks });
if (!added.data || !("tasks" in added.data) || added.data.tasks.length !== 2) fail("add tasks", added.data ?? added.error);
const one = await client.POST("/queues/{name}/tasks", {
  params: { path: { name: "ts-mail" } },
  body: { name: "t2", countdown: "1h", action: { path: "/send", method: "POST" } },
});
if (!one.data || !("name" in one.data) || one.data.name !== "t2") fail("add a task", one.data ?? one.error);
const queueShown = await client.GET("/queues/{name}", { params: { path: { name: "ts-mail" } } });
if (queueShown.data?.tasks.pending !== 3) fail("show a queue", queueShown.data ?? queueShown.error);

await client.PUT("/queues/{name}", { params: { path: { name: "ts-pull" } }, body: { mode: "pull" } });
await client.POST("/queues/{name}/tasks", {
  params: { path: { name: "ts-pull" } },
  body: { tasks: [{ name: "p1", payload: [1, "two"] }] },
});
const leased = await client.POST("/queues/{name}/lease", {
  params: { path: { name: "ts-pull" } },
  body: { count: 5, lease_seconds: 30 },
});
const lease = leased.data?.tasks[0];
if (!lease || lease.name !== "p1" || JSON.stringify(lease.payload) !== '[1,"two"]') fail("lease", leased.data ?? leased.error);
const acked = await client.POST("/queues/{name}/tasks/{task}/ack", {
  params: { path: { name: "ts-pull", task: "p1" } },
  body: { lease_id: lease.lease_id },
});
if (!acked.data) fail("ack", acked.error);

console.log("generated TypeScript client: every route answered as its types say");
