/**
 * The official RocketMQ 5 Node client (rocketmq-client-nodejs 1.0.8) against
 * `delaywheel serve`.
 *
 * Starts its own server (a fresh store in a temp dir, ports the server picks
 * and reports), then with one Producer, one SimpleConsumer and one
 * PushConsumer (each its own consumer group, same topic) checks:
 *  - the producer's 200 normal sends and 200 timed sends (due 1-4 s ahead) are
 *    answered; two more timed ones (due in 1 h and in 5 s) are recalled, the
 *    recall answered OK with the sent message id, and the 1-hour timer gone
 *    from /pending;
 *  - the settings the server answers the PushConsumer: receive batch 128,
 *    long polling 20 s, backoff 1 s, 5 s, 10 s, 30 s, ...;
 *  - the SimpleConsumer receives exactly the 400 (never a recalled one), none
 *    corrupted (body digest), no timed one before its delivery timestamp (no
 *    tolerance: our clock when the receive returns against the timestamp we
 *    sent), each with the delivery timestamp it was sent with; it acks all but
 *    5, and those 5 come back once, as delivery attempt 2, not before their
 *    3 s invisible duration ended; every acked one came once, as attempt 1;
 *  - the PushConsumer's listener gets exactly the 400, none early; it fails 5
 *    once each, and each of those is consumed again exactly once, as delivery
 *    attempt 2, not before the duration its nack asked for ended (0: the
 *    client ignores the server's customized backoff, see below); every other
 *    one is consumed once, as attempt 1; no ack or nack is refused;
 *  - the clients shut down, and SIGTERM stops the server with exit 0.
 * Everything runs under a 90 s limit; the server is killed on any way out.
 * Exit 0 only when every check holds.
 *
 * Usage: node test_serve.mjs path/to/delaywheel [--tls]
 *   --tls (or DELAYWHEEL_TLS=1): make a self-signed certificate for localhost
 *   and 127.0.0.1 with openssl, start the server with --tls-cert/--tls-key,
 *   and have the client (sslEnabled) trust that certificate.
 *   ROCKETMQ_NODE_MODULES: the folder holding node_modules (default
 *   target/rocketmq-node, where install.sh puts it).
 */

import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

const TOPIC = 'NodeOrders';
const SIMPLE_GROUP = 'NodeSimpleService';
const PUSH_GROUP = 'NodePushService';
const N = 200;
const INVISIBLE_MS = 3000;
const LIMIT_MS = 90_000;
const HOUR_MS = 3600_000;
const OK = 20000; // apache.rocketmq.v2.Code.OK
// The SimpleConsumer leaves these un-acked; the PushConsumer fails these once.
const SIMPLE_UNACKED = new Set(['normal-0', 'normal-50', 'normal-199', 'timed-10', 'timed-150']);
const PUSH_FAILED = new Set(['normal-1', 'normal-99', 'normal-150', 'timed-20', 'timed-199']);

const args = process.argv.slice(2);
const tls = args.includes('--tls') || process.env.DELAYWHEEL_TLS === '1';
const binary = args.find(a => !a.startsWith('--'));
if (!binary) {
  console.error('usage: node test_serve.mjs path/to/delaywheel [--tls]');
  process.exit(2);
}
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const modules = process.env.ROCKETMQ_NODE_MODULES ?? path.join(repo, 'target/rocketmq-node');
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'delaywheel-node-client-test-'));
// The client's consume service logs to ~/logs/rocketmq whatever logger it is
// given: keep that file in our temp dir.
process.env.HOME = work;

const started = Date.now();
const elapsed = () => `${((Date.now() - started) / 1000).toFixed(1)} s`;
const checks = [];
const clientLog = [];
let server;

function check(condition, what, detail = '') {
  if (!condition) throw new Error(`${what}${detail ? `: ${detail}` : ''}`);
  checks.push(what);
  console.log(`ok   ${what}`);
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function waitFor(predicate, ms, what) {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms / 1000} s waiting for ${what}`);
    await sleep(50);
  }
}

/** The client's warnings and errors, kept for a failure's report; its info lines dropped. */
const logger = {
  info() {},
  debug() {},
  warn: (...a) => clientLog.push(`${elapsed()} WARN ${a.map(String).join(' ')}`),
  error: (...a) => clientLog.push(`${elapsed()} ERROR ${a.map(String).join(' ')}`),
};

/** `delaywheel serve` on ports of its own choosing (127.0.0.1:0), read back from its first line. */
async function startServer(extra) {
  const log = path.join(work, 'server.log');
  const child = spawn(binary, ['serve', '--dir', path.join(work, 'store'),
    '--listen', '127.0.0.1:0', '--http', '127.0.0.1:0', ...extra],
  { stdio: [ 'ignore', 'pipe', fs.openSync(log, 'w') ] });
  child.log = log;
  server = child;
  const line = await new Promise((resolve, reject) => {
    readline.createInterface({ input: child.stdout }).once('line', resolve);
    child.once('error', reject);
    child.once('exit', code => reject(new Error(`delaywheel serve exited with ${code} before it listened`)));
  });
  const { grpc, http } = JSON.parse(line);
  const deadline = Date.now() + 10_000;
  for (;;) {
    const ok = await fetch(`http://${http}/healthz`).then(r => r.ok, () => false);
    if (ok) break;
    if (Date.now() > deadline) throw new Error(`/healthz did not answer 200 within 10 s (${http})`);
    await sleep(50);
  }
  return { grpc, http };
}

function makeCertificate() {
  const cert = path.join(work, 'cert.pem');
  const key = path.join(work, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
    '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
    '-keyout', key, '-out', cert], { stdio: 'ignore' });
  return { cert, key };
}

async function main() {
  let serverArgs = [];
  if (tls) {
    const { cert, key } = makeCertificate();
    serverArgs = ['--tls-cert', cert, '--tls-key', key];
    // With sslEnabled the client makes its channel with grpc-js's
    // credentials.createSsl() and no roots (RpcClient.ts); grpc-js then reads
    // its roots from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH when set (read once, when
    // grpc-js loads: so before the require below), else uses Node's store.
    // NODE_EXTRA_CA_CERTS would not do where GRPC_DEFAULT_SSL_ROOTS_FILE_PATH
    // is already set, as it is on some CI machines.
    process.env.GRPC_DEFAULT_SSL_ROOTS_FILE_PATH = cert;
  }
  const { Producer, SimpleConsumer, PushConsumer, ConsumeResult } =
    createRequire(path.join(modules, 'package.json'))('rocketmq-client-nodejs');

  const { grpc, http } = await startServer(serverArgs);
  console.log(`server on ${grpc} (${tls ? 'TLS' : 'plaintext'}), http ${http}; store ${work}`);
  const options = { endpoints: grpc, sslEnabled: tls, logger, namespace: '' };

  // rocketmq-client-nodejs 1.0.8 drops a settings answer that arrives while it
  // is still fetching the routes of a second topic given at start (startup()
  // then waits forever): so each client here is given exactly one topic.
  const producer = new Producer({ ...options, topics: [TOPIC] });
  const simple = new SimpleConsumer({ ...options, consumerGroup: SIMPLE_GROUP,
    subscriptions: new Map([[TOPIC, '*']]), awaitDuration: 2000 });

  const pushCalls = new Map(); // body -> [{ attempt, at, id }]
  const pushEarly = [];
  const push = new PushConsumer({ ...options, consumerGroup: PUSH_GROUP,
    subscriptions: new Map([[TOPIC, '*']]),
    messageListener: {
      consume(m) {
        const at = Date.now();
        const body = m.body.toString();
        const calls = pushCalls.get(body) ?? [];
        pushCalls.set(body, [ ...calls, { attempt: m.deliveryAttempt, at, id: m.messageId } ]);
        if (m.deliveryTimestamp && at < m.deliveryTimestamp.getTime()) pushEarly.push(body);
        return PUSH_FAILED.has(body) && calls.length === 0 ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    } });

  // What the PushConsumer is told and what it answers, seen at the client's own seams.
  let pushSettings;
  const onSettings = push.onSettingsCommand.bind(push);
  push.onSettingsCommand = (endpoints, settings) => {
    pushSettings ??= settings.toObject();
    onSettings(endpoints, settings);
  };
  // rocketmq-client-nodejs 1.0.8 ignores a customized backoff policy
  // (PushSubscriptionSettings.sync: "not yet implemented"), which this server
  // sends as RocketMQ's proxy does, so it nacks with an invisible duration of
  // 0: a failed message comes straight back. That is the client's bug; the
  // client runs unchanged here, and the checks hold it to what it asked.
  const nacks = new Map(); // message id -> { at, ms, code }
  const refused = [];
  const changeInvisible = push.changeInvisibleDurationViaRpc.bind(push);
  push.changeInvisibleDurationViaRpc = async (endpoints, request, timeout) => {
    const d = request.getInvisibleDuration();
    const nack = { at: Date.now(), ms: d.getSeconds() * 1000 + Math.floor(d.getNanos() / 1e6) };
    nacks.set(request.getMessageId(), nack);
    const response = await changeInvisible(endpoints, request, timeout);
    nack.code = response.getStatus()?.getCode();
    if (nack.code !== OK) refused.push(`nack ${request.getMessageId()}: ${nack.code} ${response.getStatus()?.getMessage()}`);
    return response;
  };
  const ack = push.ackMessageViaRpc.bind(push);
  push.ackMessageViaRpc = async (endpoints, request, timeout) => {
    const response = await ack(endpoints, request, timeout);
    const code = response.getStatus()?.getCode();
    if (code !== OK) refused.push(`ack ${request.getEntriesList()[0]?.getMessageId()}: ${code} ${response.getStatus()?.getMessage()}`);
    return response;
  };

  await Promise.all([producer.startup(), simple.startup(), push.startup()]);
  console.log(`producer and both consumers started (${elapsed()})`);
  const sub = pushSettings?.subscription;
  const backoff = (pushSettings?.backoffPolicy?.customizedBackoff?.nextList ?? []).map(d => d.seconds);
  check(sub?.receiveBatchSize === 128 && sub?.longPollingTimeout?.seconds === 20 &&
    backoff.slice(0, 4).join() === '1,5,10,30',
  'settings answer: receive batch 128, long polling 20 s, backoff 1 s, 5 s, 10 s, 30 s, ...',
  JSON.stringify({ batch: sub?.receiveBatchSize, poll: sub?.longPollingTimeout, backoff }));

  // --- Producer ---
  const sent = new Map(); // body -> { id, due }
  for (let i = 0; i < N; i++) {
    const body = `normal-${i}`;
    const r = await producer.send({ topic: TOPIC, body: Buffer.from(body), keys: [ body ] });
    sent.set(body, { id: r.messageId });
  }
  const handles = [];
  for (let i = 0; i < N; i++) {
    const body = `timed-${i}`;
    const due = new Date(Date.now() + 1000 + (i * 37) % 3000); // 1.0 to 4.0 s ahead
    const r = await producer.send({ topic: TOPIC, body: Buffer.from(body), deliveryTimestamp: due });
    sent.set(body, { id: r.messageId, due: due.getTime() });
    handles.push(r.recallHandle);
  }
  check([ ...sent.values() ].every(s => s.id) && sent.size === 2 * N,
    `${N} normal and ${N} timed sends answered with message ids`);
  check(handles.every(Boolean), 'each timed send\'s receipt has a recall handle');

  const farDue = Date.now() + HOUR_MS;
  const far = await producer.send({ topic: TOPIC, body: Buffer.from('recalled-1h'), keys: [ 'recalled-1h' ],
    deliveryTimestamp: new Date(farDue) });
  const pendingNearFar = () => fetch(`http://${http}/pending?from=${farDue - 60_000}&to=${farDue + 60_000}`)
    .then(r => r.json()).then(p => p.timers);
  const before = await pendingNearFar();
  check(before.length === 1 && before[0].key === 'recalled-1h', '/pending lists the 1-hour timer', JSON.stringify(before));
  const farRecall = await producer.recallMessage(TOPIC, far.recallHandle);
  check(farRecall.messageId === far.messageId, 'recalling the 1-hour timer is answered OK, with its message id',
    `${farRecall.messageId} vs ${far.messageId}`);
  const soon = await producer.send({ topic: TOPIC, body: Buffer.from('recalled-5s'),
    deliveryTimestamp: new Date(Date.now() + 5000) });
  const soonRecall = await producer.recallMessage(TOPIC, soon.recallHandle);
  check(soonRecall.messageId === soon.messageId, 'recalling a timer due in 5 s is answered OK');
  const after = await pendingNearFar();
  check(after.length === 0, '/pending no longer lists the 1-hour timer once recalled', JSON.stringify(after));
  console.log(`sent ${2 * N + 2}, recalled 2 (${elapsed()})`);

  // --- SimpleConsumer (the PushConsumer consumes meanwhile) ---
  const got = new Map(); // body -> [{ attempt, askedAt, at, due, corrupted }]
  const simpleEarly = [];
  let settleUntil;
  while (!settleUntil || Date.now() < settleUntil) {
    // Before the call: the server makes a message invisible after this instant.
    const askedAt = Date.now();
    const messages = await simple.receive(32, INVISIBLE_MS);
    const at = Date.now();
    for (const m of messages) {
      const body = m.body.toString();
      const seen = got.get(body) ?? [];
      got.set(body, [ ...seen, { attempt: m.deliveryAttempt, askedAt, at, due: m.deliveryTimestamp?.getTime(),
        corrupted: m.corrupted } ]);
      if (m.deliveryTimestamp && at < m.deliveryTimestamp.getTime()) simpleEarly.push(body);
      if (!(SIMPLE_UNACKED.has(body) && seen.length === 0)) await simple.ack(m);
    }
    const done = got.size >= 2 * N && [ ...SIMPLE_UNACKED ].every(b => got.get(b)?.length >= 2);
    // Then one more invisible duration: an acked message coming back would show.
    if (done && !settleUntil) settleUntil = Date.now() + INVISIBLE_MS + 1000;
  }
  console.log(`SimpleConsumer done (${elapsed()})`);
  const expected = new Set(sent.keys());
  const bodies = new Set(got.keys());
  check(bodies.size === expected.size && [ ...expected ].every(b => bodies.has(b)),
    `SimpleConsumer: exactly the ${2 * N} un-recalled messages arrive`,
    `missing ${[ ...expected ].filter(b => !bodies.has(b)).slice(0, 5)}, unexpected ${[ ...bodies ].filter(b => !expected.has(b)).slice(0, 5)}`);
  check([ ...got.values() ].flat().every(g => !g.corrupted), 'SimpleConsumer: no body fails its digest');
  check(simpleEarly.length === 0, 'SimpleConsumer: no timed message arrives before its delivery timestamp' +
    ` (the earliest ${Math.min(...[ ...got.values() ].filter(g => g[0].due).map(g => g[0].at - g[0].due))} ms after it)`,
  simpleEarly.slice(0, 5).join());
  const wrongDue = [ ...got ].filter(([ b, g ]) => g[0].due !== sent.get(b).due);
  check(wrongDue.length === 0, 'SimpleConsumer: each message carries the delivery timestamp it was sent with (none for normal ones)',
    JSON.stringify(wrongDue.slice(0, 3)));
  const redelivered = [ ...got ].filter(([ , g ]) => g.length > 1).map(([ b ]) => b);
  check(redelivered.length === SIMPLE_UNACKED.size && redelivered.every(b => SIMPLE_UNACKED.has(b)),
    `SimpleConsumer: exactly the ${SIMPLE_UNACKED.size} un-acked come back`, redelivered.join());
  check([ ...SIMPLE_UNACKED ].every(b => got.get(b).map(g => g.attempt).join() === '1,2'),
    'SimpleConsumer: once more each, as delivery attempt 2',
    [ ...SIMPLE_UNACKED ].map(b => `${b}:${got.get(b).map(g => g.attempt)}`).join(' '));
  const back = [ ...SIMPLE_UNACKED ].map(b => got.get(b)[1].at - got.get(b)[0].askedAt);
  check(back.every(ms => ms >= INVISIBLE_MS),
    `SimpleConsumer: not before their ${INVISIBLE_MS / 1000} s invisible duration ended (after ${back.join(', ')} ms)`);
  check([ ...got ].every(([ b, g ]) => SIMPLE_UNACKED.has(b) || (g.length === 1 && g[0].attempt === 1)),
    'SimpleConsumer: every acked message came once, as attempt 1');

  // --- PushConsumer ---
  await waitFor(() => [ ...expected ].every(b => pushCalls.has(b)) &&
    [ ...PUSH_FAILED ].every(b => pushCalls.get(b)?.length >= 2), LIMIT_MS, 'the PushConsumer to consume everything');
  await sleep(1000); // a duplicate right behind would show
  console.log(`PushConsumer done (${elapsed()})`);
  const consumed = new Set(pushCalls.keys());
  check(consumed.size === expected.size && [ ...expected ].every(b => consumed.has(b)),
    `PushConsumer: exactly the ${2 * N} un-recalled messages are consumed`,
    `unexpected ${[ ...consumed ].filter(b => !expected.has(b)).slice(0, 5)}`);
  const margins = [ ...pushCalls ].filter(([ b ]) => sent.get(b)?.due).map(([ b, c ]) => c[0].at - sent.get(b).due);
  check(pushEarly.length === 0, 'PushConsumer: no timed message is consumed before its delivery timestamp' +
    ` (the earliest ${Math.min(...margins)} ms after it)`, pushEarly.slice(0, 5).join());
  const again = [ ...pushCalls ].filter(([ , c ]) => c.length > 1).map(([ b ]) => b);
  check(again.length === PUSH_FAILED.size && again.every(b => PUSH_FAILED.has(b)),
    `PushConsumer: exactly the ${PUSH_FAILED.size} failed are consumed again`, again.join());
  check([ ...PUSH_FAILED ].every(b => pushCalls.get(b).map(c => c.attempt).join() === '1,2'),
    'PushConsumer: once more each, as delivery attempt 2',
    [ ...PUSH_FAILED ].map(b => `${b}:${pushCalls.get(b).map(c => c.attempt)}`).join(' '));
  const nacked = [ ...PUSH_FAILED ].map(b => ({ b, nack: nacks.get(pushCalls.get(b)[0].id), again: pushCalls.get(b)[1].at }));
  check(nacked.every(n => n.nack?.code === OK),
    `PushConsumer: each failure is nacked (asking ${nacked.map(n => n.nack?.ms).join(', ')} ms) and the nack answered OK`,
    JSON.stringify(nacked.map(n => n.nack)));
  const retried = nacked.map(n => n.again - n.nack.at);
  check(nacked.every((n, i) => retried[i] >= n.nack.ms),
    `PushConsumer: and consumed again not before that ended (after ${retried.join(', ')} ms)`);
  check([ ...pushCalls ].every(([ b, c ]) => PUSH_FAILED.has(b) || (c.length === 1 && c[0].attempt === 1)),
    'PushConsumer: every other message consumed once, as attempt 1');
  check(refused.length === 0, 'PushConsumer: no ack or nack refused', refused.slice(0, 5).join('; '));

  // --- Shutdown ---
  // PushConsumer.shutdown() first waits out its in-flight long poll (up to 20 s).
  const t = Date.now();
  await Promise.all([ producer.shutdown(), simple.shutdown(), push.shutdown() ]);
  console.log(`clients shut down (${((Date.now() - t) / 1000).toFixed(1)} s)`);
  server.kill('SIGTERM');
  const code = await new Promise(resolve => server.once('exit', c => resolve(c)));
  check(code === 0, 'SIGTERM stops the server with exit 0', `exit ${code}`);
  console.log(`ok: ${checks.length} checks passed in ${elapsed()}${tls ? ' (TLS)' : ''}`);
}

function fail(error) {
  console.error(`FAIL ${error?.stack ?? error}`);
  if (clientLog.length) console.error(`client warnings and errors (last 20):\n  ${clientLog.slice(-20).join('\n  ')}`);
  if (server?.log) {
    const lines = fs.readFileSync(server.log, 'utf8').trimEnd().split('\n').slice(-20);
    console.error(`server log ${server.log} (last 20 lines):\n  ${lines.join('\n  ')}`);
  }
  console.error(`kept ${work}`);
  process.exit(1);
}

process.on('exit', () => { if (server && server.exitCode === null) server.kill('SIGKILL'); });
setTimeout(() => fail(new Error(`not done within ${LIMIT_MS / 1000} s`)), LIMIT_MS);
try {
  await main();
} catch (e) {
  fail(e);
}
fs.rmSync(work, { recursive: true, force: true });
process.exit(0);
