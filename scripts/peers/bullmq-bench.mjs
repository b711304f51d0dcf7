// BullMQ measured the way kairos-bench measures kairos (issue 28: a peer benchmark in the
// repository), each on a fresh redis-server of its own run as `kairos serve` runs its own
// (append-only file, appendfsync everysec, hash-max-listpack-value 1024, no RDB saves),
// on a free loopback port:
//   1. Redis bytes per pending delayed job, with the body of kairos-bench's "point booking,
//      small action" as the job's data: used_memory around 100,000 adds (addBulk, batches of
//      1,000) after 2,000 warm-up ones, all due in about a day.
//   2. Redis CPU per fire: 100,000 delayed jobs due within one second, a few seconds after
//      the adds end; a Worker (concurrency 200, a no-op async processor, removeOnComplete
//      and removeOnFail at BullMQ's defaults, unset: every finished job is kept) drains
//      them; used_cpu_sys + used_cpu_user from just before the first due time to 1.5 s
//      after the last completion, and the commands Redis ran for it (commandstats).
//   3. The burst drain, from the same run: the last completion after the first due time.
// Then the storage ceiling of each server (redis-benchmark -t zadd -c 64), and the machine.
// Prints markdown. Run by `scripts/bench peers`, which installs BullMQ (scripts/peers/
// package.json and package-lock.json) into target/peers; PEERS_DIR names another install.
// BULLMQ_BENCH_JOBS=n measures n jobs instead of 100,000 (a quick check of the script).
import { createRequire } from 'node:module';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const peersDir = path.resolve(process.env.PEERS_DIR ?? path.join(here, '../../target/peers'));
const peerRequire = createRequire(path.join(peersDir, 'package.json'));
const { Queue, Worker } = peerRequire('bullmq');
const IORedis = peerRequire('ioredis');
const version = (pkg) =>
  JSON.parse(fs.readFileSync(path.join(peersDir, 'node_modules', pkg, 'package.json'), 'utf8')).version;

const JOBS = Number(process.env.BULLMQ_BENCH_JOBS ?? 100_000);
if (!Number.isInteger(JOBS) || JOBS < 1000 || JOBS > 1_000_000) {
  throw new Error(`BULLMQ_BENCH_JOBS must be a whole number from 1000 to 1000000, not ${process.env.BULLMQ_BENCH_JOBS}`);
}
const WARM_UP = 2_000;
const BATCH = 1_000;
const DAY_MS = 86_400_000;
const CONCURRENCY = 200;
const DRAIN_DEADLINE_MS = 120_000;
const SETTLE_MS = 1_500;
const HOST = '127.0.0.1';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const fmt = (n, digits = 0) =>
  n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits });
const body = (i) => ({ path: '/hook', method: 'POST', body: { n: i } });

// Every redis-server started here, stopped (and its directory removed) however this exits.
const servers = [];
process.on('exit', () => {
  for (const s of servers) {
    try { s.child.kill('SIGKILL'); } catch {}
    try { fs.rmSync(s.dir, { recursive: true, force: true }); } catch {}
  }
});
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => process.exit(130));

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, HOST, () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function cli(port, ...args) {
  const out = spawnSync('redis-cli', ['-h', HOST, '-p', String(port), ...args], { encoding: 'utf8', timeout: 10_000 });
  return out.status === 0 ? out.stdout : '';
}

// A redis-server of this run's own; a port another process took between freePort and the
// bind is given up for a fresh one (5 tries, each waiting at most 5 s for the server).
async function startRedis() {
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kairos-peers-redis-'));
    const child = spawn('redis-server', [
      '--port', String(port), '--bind', HOST, '--save', '', '--appendonly', 'yes',
      '--appendfsync', 'everysec', '--hash-max-listpack-value', '1024', '--dir', dir,
    ], { stdio: 'ignore' });
    const server = { port, dir, child };
    servers.push(server);
    let exited = false;
    child.once('exit', () => { exited = true; });
    for (let i = 0; i < 50 && !exited; i++) {
      await sleep(100);
      const pid = /process_id:(\d+)/.exec(cli(port, 'INFO', 'server'))?.[1];
      if (pid !== undefined) {
        if (Number(pid) === child.pid) return server;
        break; // another process's server answers on this port
      }
    }
    await stopRedis(server);
  }
  throw new Error('redis-server did not start on any of 5 free ports');
}

async function stopRedis(server) {
  if (server.child.exitCode === null && server.child.signalCode === null) {
    const exited = new Promise((r) => server.child.once('exit', r));
    server.child.kill('SIGTERM');
    await Promise.race([exited, sleep(5_000)]);
    if (server.child.exitCode === null && server.child.signalCode === null) server.child.kill('SIGKILL');
  }
  fs.rmSync(server.dir, { recursive: true, force: true });
  servers.splice(servers.indexOf(server), 1);
}

async function info(conn, section) {
  const text = await conn.info(section);
  const fields = {};
  for (const line of text.split('\r\n')) {
    const at = line.indexOf(':');
    if (at > 0) fields[line.slice(0, at)] = line.slice(at + 1);
  }
  return fields;
}
const usedMemory = async (conn) => Number((await info(conn, 'memory')).used_memory);
const usedCpu = async (conn) => {
  const f = await info(conn, 'cpu');
  return Number(f.used_cpu_sys) + Number(f.used_cpu_user);
};

// `redis-benchmark -t zadd -n 100000 -c 64 -q` against the server: ZADD/s.
function ceiling(port) {
  const out = spawnSync('redis-benchmark', ['-h', HOST, '-p', String(port), '-t', 'zadd', '-n', '100000', '-c', '64', '-q'], {
    encoding: 'utf8',
    timeout: 120_000,
  });
  const rate = Number(/ZADD: ([\d.]+) requests per second/.exec(out.stdout ?? '')?.[1]);
  return Number.isFinite(rate) ? rate : NaN;
}

// `count` delayed jobs, the i-th (from `first`) due at dueOf(i), in addBulk batches of 1,000.
async function addDelayed(queue, first, count, dueOf) {
  for (let start = 0; start < count; start += BATCH) {
    const now = Date.now();
    const jobs = [];
    for (let i = start; i < Math.min(start + BATCH, count); i++) {
      jobs.push({ name: 'hook', data: body(first + i), opts: { timestamp: now, delay: Math.max(0, dueOf(first + i) - now) } });
    }
    await queue.addBulk(jobs);
  }
}

const connection = (port) => ({ host: HOST, port });

// 1. Bytes per pending delayed job.
async function memoryRun() {
  const server = await startRedis();
  const conn = new IORedis(connection(server.port));
  const queue = new Queue('bench', { connection: connection(server.port) });
  await queue.waitUntilReady();
  const base = Date.now() + DAY_MS;
  await addDelayed(queue, 0, WARM_UP, (i) => base + i);
  const before = await usedMemory(conn);
  const t0 = performance.now();
  await addDelayed(queue, WARM_UP, JOBS, (i) => base + i);
  const addMs = performance.now() - t0;
  const after = await usedMemory(conn);
  const delayed = await queue.getDelayedCount();
  if (delayed !== WARM_UP + JOBS) throw new Error(`${delayed} delayed jobs, not ${WARM_UP + JOBS}`);
  await queue.close();
  const zadd = ceiling(server.port);
  conn.disconnect();
  await stopRedis(server);
  return { bytes: (after - before) / JOBS, addMs, zadd };
}

// 2 and 3. Redis CPU per fire and the burst drain.
async function fireRun(expectedAddMs) {
  const server = await startRedis();
  const conn = new IORedis(connection(server.port));
  const queue = new Queue('bench', { connection: connection(server.port) });
  await queue.waitUntilReady();
  // The first due time: the adds' expected length (the memory run's, with a quarter more)
  // and 4 s after it; due times spread evenly over the second from there.
  const started = Date.now();
  const firstDue = started + Math.ceil(expectedAddMs * 1.25) + 4_000;
  await addDelayed(queue, 0, JOBS, (i) => firstDue + Math.floor((i * 1000) / JOBS));
  const addsEnded = Date.now();
  if (addsEnded > firstDue - 1_000) {
    throw new Error(`the adds ended ${addsEnded - firstDue + 1_000} ms too late to leave a second before the first due time`);
  }

  let completed = 0;
  let failed = 0;
  let lastAt = 0;
  let early = 0;
  let done;
  const allDone = new Promise((r) => { done = r; });
  const worker = new Worker('bench', async () => {}, { connection: connection(server.port), concurrency: CONCURRENCY });
  worker.on('completed', (job) => {
    const now = Date.now();
    if (now < job.timestamp + (job.opts.delay ?? 0)) early++;
    completed++;
    lastAt = now;
    if (completed + failed >= JOBS) done();
  });
  worker.on('failed', () => {
    failed++;
    if (completed + failed >= JOBS) done();
  });
  worker.on('error', (e) => console.error(`worker error: ${e.message}`));
  await worker.waitUntilReady();

  await sleep(Math.max(0, firstDue - 250 - Date.now()));
  await conn.config('RESETSTAT');
  const cpuBefore = await usedCpu(conn);
  const deadline = firstDue + DRAIN_DEADLINE_MS;
  let timer;
  await Promise.race([allDone, new Promise((r) => { timer = setTimeout(r, Math.max(0, deadline - Date.now())); })]);
  clearTimeout(timer);
  const drainedAt = lastAt;
  await sleep(SETTLE_MS);
  const cpuAfter = await usedCpu(conn);
  const stats = await info(conn, 'commandstats');
  await worker.close();
  await queue.close();
  const zadd = ceiling(server.port);
  conn.disconnect();
  await stopRedis(server);
  if (completed + failed < JOBS) {
    throw new Error(`only ${completed} of ${JOBS} jobs completed (${failed} failed) within ${DRAIN_DEADLINE_MS / 1000} s of the first due time`);
  }
  const commands = Object.entries(stats)
    .filter(([k]) => k.startsWith('cmdstat_'))
    .map(([k, v]) => {
      const f = Object.fromEntries(v.split(',').map((kv) => kv.split('=')));
      return { name: k.slice('cmdstat_'.length), calls: Number(f.calls), usec: Number(f.usec) };
    })
    .sort((a, b) => b.usec - a.usec)
    .slice(0, 6);
  return {
    cpuPerFireUs: ((cpuAfter - cpuBefore) * 1e6) / JOBS,
    drainFromFirstS: (drainedAt - firstDue) / 1000,
    drainFromLastS: (drainedAt - (firstDue + 1000)) / 1000,
    leadS: (firstDue - addsEnded) / 1000,
    completed,
    failed,
    early,
    commands,
    zadd,
  };
}

function machine() {
  const cpu = /^model name\s*:\s*(.*)$/m.exec(fs.readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? 'unknown CPU';
  const memKb = Number(/^MemTotal:\s*(\d+)/m.exec(fs.readFileSync('/proc/meminfo', 'utf8'))?.[1] ?? 0);
  const redis = /v=(\S+)/.exec(spawnSync('redis-server', ['--version'], { encoding: 'utf8' }).stdout ?? '')?.[1] ?? '?';
  return `${cpu}, ${os.availableParallelism()} cores, ${Math.floor(memKb / 1024 / 1024)} GiB RAM, Redis ${redis} (append-only file, appendfsync everysec, hash-max-listpack-value 1024, as \`kairos serve\` runs its own), Node ${process.version}, BullMQ ${version('bullmq')} on ioredis ${version('ioredis')}; Redis and the Node client on this machine`;
}

const mem = await memoryRun();
const fire = await fireRun(mem.addMs);
const n = fmt(JOBS);

console.log(`## BullMQ beside kairos (\`scripts/bench peers\`)\n`);
console.log(`| figure | BullMQ ${version('bullmq')} (Worker concurrency ${CONCURRENCY}, no-op async processor, removeOnComplete/removeOnFail at their defaults: every finished job kept) |`);
console.log('|---|---|');
console.log(`| Redis bytes per pending delayed job, same ~40 B body as "point booking, small action" (${n} added after ${fmt(WARM_UP)}, listpack-value 1024) | ${fmt(mem.bytes)} B |`);
console.log(`| Redis CPU per fire, ${n} jobs due within one second (adds excluded) | ${fmt(fire.cpuPerFireUs, 1)} µs |`);
console.log(`| ${n}-job burst drain: last fire after the first due time | ${fmt(fire.drainFromFirstS, 2)} s |`);
console.log(`| last fire after the last due time | ${fmt(fire.drainFromLastS, 2)} s |`);
console.log(`| adds (addBulk, batches of ${fmt(BATCH)}), memory run | ${fmt(JOBS / (mem.addMs / 1000))} jobs/s |`);
console.log(`| ceiling: \`redis-benchmark -t zadd -n 100000 -c 64\`, memory run's server / fire run's server, after the above | ${fmt(mem.zadd)} / ${fmt(fire.zadd)} ZADD/s |`);
console.log(`\nFire run: ${fmt(fire.completed)} completed, ${fmt(fire.failed)} failed, ${fmt(fire.early)} before their due time; the adds ended ${fmt(fire.leadS, 1)} s before the first due time; Redis CPU read 0.25 s before it and ${SETTLE_MS / 1000} s after the last completion.\n`);
console.log('Redis commands over the drain, top 6 by time (commandstats; commands a Lua script calls are counted on their own as well as in its EVALSHA):\n');
console.log('| command | calls per fire | µs per fire |');
console.log('|---|---|---|');
for (const c of fire.commands) {
  console.log(`| ${c.name} | ${fmt(c.calls / JOBS, 2)} | ${fmt(c.usec / JOBS, 1)} |`);
}
console.log(`\nMachine: ${machine()}.`);
process.exit(0);
