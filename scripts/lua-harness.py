#!/usr/bin/env python3
"""Redis time a fire costs in each firing script, measured without a host.

Runs the real claim.lua, start_run.lua and finish_life.lua (each with the helpers kairos
prepends, the same selection as store/lua_prelude.rs) against a redis-server of its own:
N point Lives written by the booking helpers, then claimed, started and finished in
batches the size a busy host uses, with the arguments a host sends. SLOWLOG at 0 gives
each call's execution time; the figure is the best of --reps runs, in µs a fire.

    scripts/lua-harness.py [--n 20000] [--reps 3] [--listpack-value 1024]
                           [--scripts host/src/store/scripts] [--keep-redis]

To weigh a change to a script before building kairos, copy the scripts directory, edit
the copy and pass it with --scripts. It needs python3 and redis-server, nothing else,
and runs on a free port of loopback. The arguments it sends follow the scripts' headers;
when one changes, change it here too (the harness checks each reply).
"""
import argparse, hashlib, os, re, socket, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))

def identifiers(text):
    return [w for w in re.split(r'[^A-Za-z0-9_]', text) if w and (w[0].isalpha() or w[0] == '_')]

def definitions(common):
    out = []
    for line in common.split('\n'):
        if line.startswith('local ') or line.startswith('function '):
            rest = line[6:] if line.startswith('local ') else line
            names = identifiers(rest[9:])[:1] if rest.startswith('function ') else identifiers(rest.split('=')[0])
            out.append([names, line + '\n'])
        elif line.lstrip().startswith('--') or not line.strip():
            pass
        elif out:
            out[-1][1] += line + '\n'
    return out

def script_text(scripts, body):
    """The body with the helpers it names prepended (store/lua_prelude.rs)."""
    common = ''.join(open(os.path.join(scripts, f)).read()
                     for f in ('record_bucket.lua', 'common.lua', 'task_records.lua'))
    defs, needed, included = definitions(common), set(identifiers(body)), set()
    while True:
        before = len(included)
        for i, (names, text) in enumerate(defs):
            if i not in included and any(n in needed for n in names):
                included.add(i)
                needed.update(identifiers(text))
        if len(included) == before:
            break
    prelude = ''.join(defs[i][1] for i in sorted(included))
    if body.startswith('#!lua'):
        flags, rest = body[5:].split('\n', 1)
        return '#!lua' + flags + '\n' + prelude + '\n' + rest
    return prelude + '\n' + body

SETUP = """#!lua flags=allow-oom
-- N point Lives: records and due tree members. ARGV: 1 prefix, 2 n, 3 first, 4 record, 5 fire ms
local n, first, rec, fire = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
for i = first, first + n - 1 do
  local id = string.format('0190a1b2-c3d4-7e5f-8a6b-%012d', i)
  put_new_record(id, rec, true)
  tree_add(PREFIX .. 'due', string.format('%d', fire + i), id .. ':birth')
end
return 1
"""

class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(('127.0.0.1', port))
        self.file = self.sock.makefile('rb')

    def __call__(self, *args):
        out = [b'*%d\r\n' % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b'$%d\r\n%s\r\n' % (len(a), a))
        self.sock.sendall(b''.join(out))
        return self.read()

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b'+':
            return rest.decode()
        if kind == b'-':
            raise RuntimeError(rest.decode())
        if kind == b':':
            return int(rest)
        if kind == b'$':
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2].decode()
        if kind == b'*':
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f'unexpected reply {line!r}')

def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port

def one_run(r, scripts, n, claim_batch, start_batch, finish_batch, listpack_value):
    prefix, host = 'k:{0}:', 'host-0190a1b2c3d4'
    pending = ('{"b":%d,"c":1764300000000,"a":{"u":"http://127.0.0.1:9/hook","m":"POST",'
               '"h":{"content-type":"application/json"},"body":"{\\"n\\":12345,\\"pad\\":\\"'
               + 'x' * 90 + '\\"}"}}')
    r('FLUSHALL')
    r('CONFIG', 'SET', 'hash-max-listpack-value', listpack_value)
    now = int(time.time() * 1000)
    r('HSET', prefix + 'owner', 'host', host, 'gen', '1', 'until', now + 3_600_000)
    setup = r('SCRIPT', 'LOAD', script_text(scripts, SETUP))
    for first in range(0, n, 5000):
        r('EVALSHA', setup, 0, prefix, min(5000, n - first), first, pending % (now + 1000), now - 10_000)
    sha = {name: r('SCRIPT', 'LOAD', script_text(scripts, open(os.path.join(scripts, name + '.lua')).read()))
           for name in ('claim', 'start_run', 'finish_life')}
    names = {v: k for k, v in sha.items()}
    r('SLOWLOG', 'RESET')
    claimed = []
    keys = [prefix + k for k in ('due', 'held', 'owner', 'due_tasks', 'claim_seq', 'timers_due', 'inflight')]
    while True:
        reply = r('EVALSHA', sha['claim'], len(keys), *keys, prefix, host, 1, now + 10**9, claim_batch, now, 0)
        assert reply[0] == 'ok', reply
        lives = reply[1]
        claimed += [(lives[i], lives[i + 1], lives[i + 2]) for i in range(0, len(lives), 3)]
        if len(lives) < claim_batch * 3:
            break
    assert len(claimed) == n, f'claimed {len(claimed)} of {n}'
    for i in range(0, n, start_batch):
        batch = claimed[i:i + start_batch]
        args = ['', host, 10**12, 1000, prefix, 1, len(batch)]
        for plan_id, _, claim in batch:
            args += [plan_id, claim, 1, '']
        out = r('EVALSHA', sha['start_run'], 1, prefix + 'inflight', *args)
        assert all(o == 'run:1' for o in out), out[:3]
    done = (pending.replace('{"b"', '{"s":"Dead","b"')[:-1]
            + ',"r":[{"p":"b","a":1,"s":%d,"ms":3,"o":"done","st":200}],"db":"%s#CLAIM"}' % (now, host))
    for i in range(0, n, finish_batch):
        batch = claimed[i:i + finish_batch]
        args = ['', host, now, 0, 1000, prefix, len(batch)]
        for plan_id, fire, claim in batch:
            uuid = plan_id[:-6]
            h = int(hashlib.sha1(uuid.encode()).hexdigest()[:8], 16)
            args += [plan_id, claim, (done % int(fire)).replace('CLAIM', claim), '1ID', h]
        out = r('EVALSHA', sha['finish_life'], 1, prefix + 'inflight', *args)
        assert all(o == 'ok' for o in out), out[:3]
    assert r('HLEN', prefix + 'inflight') == 0
    spent = {}
    for entry in r('SLOWLOG', 'GET', -1):
        args = entry[3]
        if args[0].lower() == 'evalsha' and args[1] in names:
            spent[names[args[1]]] = spent.get(names[args[1]], 0) + entry[2]
    return spent

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--n', type=int, default=20000)
    p.add_argument('--reps', type=int, default=3)
    p.add_argument('--claim-batch', type=int, default=50)
    p.add_argument('--start-batch', type=int, default=110)
    p.add_argument('--finish-batch', type=int, default=255)
    p.add_argument('--listpack-value', default='1024')
    p.add_argument('--scripts', default=os.path.join(HERE, '..', 'host', 'src', 'store', 'scripts'))
    a = p.parse_args()
    port = free_port()
    data = tempfile.mkdtemp(prefix='kairos-lua-harness-')
    server = subprocess.Popen(['redis-server', '--port', str(port), '--bind', '127.0.0.1', '--save', '',
                               '--appendonly', 'yes', '--appendfsync', 'everysec', '--dir', data,
                               '--slowlog-log-slower-than', '0', '--slowlog-max-len', '1000000'],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            try:
                r = Redis(port)
                r('PING')
                break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit('redis-server did not start')
        best = {}
        for _ in range(a.reps):
            for name, usec in one_run(r, a.scripts, a.n, a.claim_batch, a.start_batch,
                                      a.finish_batch, a.listpack_value).items():
                best[name] = min(best.get(name, float('inf')), usec)
        parts = [f'{name} {usec / a.n:.2f}' for name, usec in sorted(best.items())]
        print(' / '.join(parts) + f' µs a fire, {sum(best.values()) / a.n:.2f} in all'
              f' (script execution, SLOWLOG; best of {a.reps} runs of {a.n})')
    finally:
        server.terminate()
        server.wait()

if __name__ == '__main__':
    main()
